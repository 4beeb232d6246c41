"""The router: picks the agent of a task that names none, recalls similar earlier work, and
consolidates an archived session into memory.

- ``task.submitted`` (top level, agent left at ``default``, not a command): ``memory.recalled``
  (when earlier episodes score at least ``recall_min``; at most ``recall_k``) then
  ``route.decided`` (``nanocrab/routing.py`` decides: embedding, else the model, else the
  default agent). The orchestrator starts such a run only once ``route.decided`` is in, and
  only when routing is configured (``agents.yaml`` with more than one agent): without it this
  handler is not wired at all, so there is no extra hop. Both are events: the timeline shows
  the sources, and a replay reads them instead of recomputing.
- ``session.archived`` (``/new``): ``memory.consolidated``, a summary of the session's
  episodes, once the memory projection has folded the log up to the archive (bounded wait).
  It runs beside the routing of tasks (a different subject, see ``concurrency``).

The embedder and the agents' vectors load on the first task (once per process), in a thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    Event,
    MemoryConsolidated,
    MemoryRecalled,
    RouteDecided,
    SessionArchived,
    TaskSubmitted,
)
from nanocrab.handlers.orchestrator.decide import needs_route
from nanocrab.llm.base import Message, ModelRequest, Provider
from nanocrab.memory import Embedder
from nanocrab.projections.db import checkpoints
from nanocrab.projections.memory import MemoryProjection, memory_items, recall
from nanocrab.routing import AgentsConfig, AgentSpec, Classifier, Router, classifier_prompt
from nanocrab.routing import parse_choice as _parse_choice

log = logging.getLogger(__name__)

CONSOLIDATE_WAIT_S = 30.0
POLL_S = 0.2
SESSION_SUMMARY_CHARS = 2000


def model_classifier(provider: Provider, model: str = "") -> Classifier:
    """A :data:`~nanocrab.routing.Classifier` asking ``provider`` (the scripted one offline)."""

    async def classify(text: str, agents: Sequence[AgentSpec]) -> str | None:
        from nanocrab.events import TextBlock

        prompt = classifier_prompt(text, agents)
        response = await provider.complete(
            ModelRequest(
                system="You route tasks to agents.",
                messages=[Message(role="user", content=[TextBlock(text=prompt)])],
                model=model, max_tokens=20, task=prompt,
            )
        )  # fmt: skip
        answer = " ".join(b.text for b in response.content if isinstance(b, TextBlock))
        return _parse_choice(answer, agents)

    return classify


class RouterHandler:
    name = "router"
    consumes: tuple[type[Event], ...] = (TaskSubmitted, SessionArchived)
    concurrency = 8  # a consolidation waiting for the projection does not hold tasks up

    def __init__(
        self,
        log_: EventLog,
        engine: AsyncEngine,
        *,
        config: AgentsConfig,
        embedder: Callable[[], Embedder] | None = None,
        classify: Classifier | None = None,
        recall_k: int = 3,
        recall_min: float = 0.6,
    ) -> None:
        self.log = log_
        self.engine = engine
        self.config = config
        self._factory = embedder
        self.classify = classify
        self.recall_k = recall_k
        self.recall_min = recall_min
        self._router: Router | None = None
        self._loading = asyncio.Lock()

    async def router(self) -> Router:
        async with self._loading:
            if self._router is None:
                factory = self._factory
                if factory is None:
                    from nanocrab.memory import default_embedder

                    factory = default_embedder
                self._router = await asyncio.to_thread(Router, self.config, factory())
            return self._router

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if isinstance(event, TaskSubmitted):
            if event.run_id is None or not needs_route(event):
                return []
            return await self.route(event)
        if isinstance(event, SessionArchived) and event.session_id:
            return await self.consolidate(event.session_id, delivery.seq)
        return []

    async def route(self, task: TaskSubmitted) -> list[Event]:
        router = await self.router()
        decision = await router.decide(task.text, self.classify)
        out: list[Event] = []
        vector = await asyncio.to_thread(router.embed, task.text)
        found = await recall(self.engine, vector, k=self.recall_k, kind="episode",
                             min_score=self.recall_min)  # fmt: skip
        if found:
            out.append(MemoryRecalled(
                item_ids=[r.item_id for r in found], scores=[r.score for r in found],
                texts=[r.line() for r in found],
            ))  # fmt: skip
        spec = self.config.agent(decision.agent)
        out.append(RouteDecided(
            agent=decision.agent, skills=list(spec.skills) if spec else [],
            confidence=max(0.0, decision.score), fallback=decision.method == "fallback",
            score=decision.score, margin=decision.margin, method=decision.method,
        ))  # fmt: skip
        return out

    async def consolidate(self, session_id: str, seq: int) -> list[Event]:
        """A summary of the session's episodes as ``memory.consolidated`` (none: nothing)."""
        for _ in range(int(CONSOLIDATE_WAIT_S / POLL_S)):
            if await self._memory_position() >= seq:
                break
            await asyncio.sleep(POLL_S)  # the projection runs elsewhere (a worker process)
        async with self.engine.connect() as conn:
            try:
                rows = (await conn.execute(
                    select(memory_items.c.text, memory_items.c.outcome, memory_items.c.summary)
                    .where(memory_items.c.session_id == session_id)
                    .where(memory_items.c.kind == "episode")
                    .order_by(memory_items.c.seq)
                )).all()  # fmt: skip
            except Exception:  # no memory tables yet
                rows = []
        if not rows:
            return []
        lines = [f"- {task} -> {outcome}: {summary[:160]}" for task, outcome, summary in rows]
        summary = f"Session {session_id}, {len(rows)} task(s):\n" + "\n".join(lines)
        return [MemoryConsolidated(episode_id=f"session:{session_id}",
                                   summary=summary[:SESSION_SUMMARY_CHARS])]  # fmt: skip

    async def _memory_position(self) -> int:
        async with self.engine.connect() as conn:
            try:
                found = await conn.scalar(
                    select(checkpoints.c.stream_seq).where(
                        checkpoints.c.name == MemoryProjection.name
                    )
                )
            except Exception:
                return 0
            return int(found or 0)
