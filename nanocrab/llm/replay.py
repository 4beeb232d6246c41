"""Re-run a past run against new code: the model's answers come from that run's recording.

Each ``llm.responded`` event is served again for the request with the same ``turn`` (content,
stop reason, usage and model as recorded; the text is streamed through ``on_delta`` as the live
run streamed it). The cost is 0.0: a replay spends nothing, and counting the original cost again
would double it in usage reports. If one turn was recorded more than once (a redelivered event),
the last recording wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nanocrab.events import Event, LlmResponded, TextBlock
from nanocrab.llm.base import DeltaSink, LlmError, ModelRequest, ModelResponse
from nanocrab.llm.scripted import stream_chunks


class ReplayProvider:
    """Serves ``responses`` by ``request.turn``; a turn with no recording is ``fatal``."""

    name = "replay"

    def __init__(self, responses: Sequence[LlmResponded]) -> None:
        self._by_turn = {r.turn: r for r in responses}
        self._run_ids = sorted({r.run_id for r in responses if r.run_id})

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> ReplayProvider:
        """From a run's whole event history; everything but ``llm.responded`` is ignored."""
        return cls([e for e in events if isinstance(e, LlmResponded)])

    @property
    def turns(self) -> list[int]:
        return sorted(self._by_turn)

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        recorded = self._by_turn.get(request.turn)
        if recorded is None:
            run = ", ".join(self._run_ids) or request.run_id or "(unknown)"
            raise LlmError(
                "fatal",
                f"no recorded response for turn {request.turn} of run {run}; the new code asked "
                f"for more turns than the recording has (recorded turns: {self._describe_turns()})",
            )
        if on_delta is not None:
            for block in recorded.content:
                if isinstance(block, TextBlock):
                    for chunk in stream_chunks(block.text):
                        await on_delta(chunk)
        return ModelResponse(
            content=list(recorded.content),
            stop_reason=recorded.stop_reason,
            usage=recorded.usage,
            model=recorded.model,
        )

    def _describe_turns(self) -> str:
        turns = self.turns
        if not turns:
            return "none"
        if turns == list(range(turns[0], turns[-1] + 1)):
            return f"{turns[0]}-{turns[-1]}" if len(turns) > 1 else str(turns[0])
        return ", ".join(map(str, turns))
