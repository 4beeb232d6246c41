"""The router: picks the agent of a task that names none, recalls similar earlier work, and
consolidates an archived session into memory.

- ``task.submitted`` (top level, agent left at ``default``, not a command), only when routing
  is configured (``agents.yaml`` with more than one agent): ``memory.recalled`` (when earlier
  episodes score at least ``recall_min``; at most ``recall_k``) then ``route.decided``
  (``nanocrab/routing.py`` decides: embedding, else the model, else the default agent). The
  orchestrator starts such a run only once ``route.decided`` is in. Without routing this
  handler does not consume tasks at all (no extra hop): the LLM handler recalls in line, on
  the run's first model call. Both are events: the timeline shows the sources, and a replay
  reads them instead of recomputing.
- ``session.archived`` (``/new``), always: ``memory.consolidated``, a summary of the session's
  episodes, once the memory projection has folded the log up to the archive (bounded wait).
  It runs beside the routing of tasks (a different subject, see ``concurrency``).
- In the background (``nanocrab up`` only: ``vectorise_every_s``), the memory items the
  projection wrote since are embedded (``projections/memory_search.py``: :func:`vectorise`), so a
  search rarely has any left to do.

Memories are per tenant: the recall searches the task's tenant's episodes, the consolidation
reads the archive's tenant's (``memory.consolidated`` inherits that tenant, and so does the
``session`` memory the projection makes of it).

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
    RouteDecided,
    SessionArchived,
    TaskSubmitted,
)
from nanocrab.handlers.orchestrator.decide import needs_route
from nanocrab.llm.base import Message, ModelRequest, Provider
from nanocrab.memory import Embedder
from nanocrab.projections.db import checkpoints
from nanocrab.projections.memory import MemoryProjection, memory_items
from nanocrab.projections.memory_search import recaller, vectorise
from nanocrab.reload import ConfigView
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
        config: AgentsConfig | None,
        embedder: Callable[[], Embedder] | None = None,
        classify: Classifier | None = None,
        recall_k: int = 3,
        recall_min: float = 0.6,
        vectorise_every_s: float | None = None,
        versions: ConfigView | None = None,
    ) -> None:
        """``config`` ``None`` (or one agent): no routing, only ``/new`` consolidation (and
        the background vectorising when ``vectorise_every_s`` is set). ``versions``: the
        versioned configuration; a task is routed among the agents of the version active at
        it (the one its run pins), ``config`` when that version declares no routed agents."""
        self.log = log_
        self.engine = engine
        self.config = config
        self.versions = versions
        self._routers: dict[str, Router] = {}
        routed = config is not None and config.routed
        self.consumes = (TaskSubmitted, SessionArchived) if routed else (SessionArchived,)
        self.vectorise_every_s = vectorise_every_s
        self._factory = embedder
        self.classify = classify
        self.recall_k = recall_k
        self.recall_min = recall_min
        self._router: Router | None = None
        self._loading = asyncio.Lock()

    async def router(self) -> Router:
        assert self.config is not None, "routing needs agents"
        async with self._loading:
            if self._router is None:
                factory = self._factory
                if factory is None:
                    from nanocrab.memory import default_embedder

                    factory = default_embedder
                self._router = await asyncio.to_thread(Router, self.config, factory())
            return self._router

    async def _versioned(self, version: str, agents: AgentsConfig) -> Router:
        """The router of a configuration version's agents, built once per version."""
        async with self._loading:
            if version not in self._routers:
                factory = self._factory
                if factory is None:
                    from nanocrab.memory import default_embedder

                    factory = default_embedder
                self._routers[version] = await asyncio.to_thread(Router, agents, factory())
            return self._routers[version]

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if isinstance(event, TaskSubmitted):
            if event.run_id is None or not needs_route(event):
                return []
            if self.versions is not None:
                loaded = await self.versions.ensure(await self.versions.version_at(delivery.seq))
                if loaded.version and loaded.agents is not None and loaded.agents.routed:
                    return await self.route(event, agents=loaded.agents, version=loaded.version)
            return await self.route(event)
        if isinstance(event, SessionArchived) and event.session_id:
            return await self.consolidate(event.session_id, delivery.seq, tenant=event.tenant)
        return []

    async def route(
        self, task: TaskSubmitted, *, agents: AgentsConfig | None = None, version: str = ""
    ) -> list[Event]:
        """``agents``: those of configuration ``version`` (default: ``config``)."""
        if agents is None:
            router = await self.router()
            assert self.config is not None
            agents = self.config
        else:
            router = await self._versioned(version, agents)
        decision = await router.decide(task.text, self.classify)
        out: list[Event] = []
        recall = recaller(self.engine, self._factory, k=self.recall_k, min_score=self.recall_min)
        recalled = await recall(task.text, tenant=task.tenant)
        if recalled is not None:
            out.append(recalled)
        spec = agents.agent(decision.agent)
        out.append(RouteDecided(
            agent=decision.agent, skills=list(spec.skills) if spec else [],
            confidence=max(0.0, decision.score), fallback=decision.method == "fallback",
            score=decision.score, margin=decision.margin, method=decision.method,
        ))  # fmt: skip
        return out

    async def background(self) -> None:
        """Embed new memory items every ``vectorise_every_s`` (off unless set): the model
        loads once there is an item, not before."""
        if not self.vectorise_every_s:
            return
        while True:
            await asyncio.sleep(self.vectorise_every_s)
            await vectorise(self.engine, self._factory)  # one query when nothing is new

    async def consolidate(self, session_id: str, seq: int, *, tenant: str) -> list[Event]:
        """A summary of ``tenant``'s session's episodes as ``memory.consolidated`` (none:
        nothing); another tenant's session of the same id is no part of it."""
        for _ in range(int(CONSOLIDATE_WAIT_S / POLL_S)):
            if await self._memory_position() >= seq:
                break
            await asyncio.sleep(POLL_S)  # the projection runs elsewhere (a worker process)
        async with self.engine.connect() as conn:
            try:
                rows = (await conn.execute(
                    select(memory_items.c.text, memory_items.c.outcome, memory_items.c.summary)
                    .where(memory_items.c.tenant == tenant)
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
