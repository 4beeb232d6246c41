"""The echo reactor: the smallest agent, so the whole loop runs end to end.

Consumes ``task.submitted``; emits ``run.started``, ``reply.sent`` and ``run.completed`` for the
task's run. It is a pure function of the event, so a redelivery produces the same three events
with the same derived ids, which the log stores once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from nanocrab.bus import Delivery
from nanocrab.events import Event, ReplySent, RunCompleted, RunStarted, TaskSubmitted

Consumed = TaskSubmitted


class EchoReactor:
    name = "echo"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        assert isinstance(event, Consumed)
        return self.react(event)

    def react(self, event: Consumed) -> list[Event]:
        match event:
            case TaskSubmitted(text=text, agent=agent):
                reply = f"echo: {text}"
                return [
                    RunStarted(agent=agent, parent_run_id=event.parent_run_id),
                    ReplySent(text=reply),
                    RunCompleted(reply=reply, steps=1),
                ]
            case _:
                assert_never(event)
