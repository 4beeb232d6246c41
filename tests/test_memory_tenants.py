"""Memories are per tenant: a run-start recall (in line and by the router), the ``recall``
tool, ``/new``'s consolidation and the vector store's nearest-neighbour search never show one
tenant another's memories, and a tenant's own farther memory is still found when another
tenant's are closer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog, Reactor
from nanocrab.cli.wiring import run_tenants
from nanocrab.events import (
    MemoryRecalled,
    RunCompleted,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
)
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.router import RouterHandler
from nanocrab.llm import ScriptedProvider
from nanocrab.llm.base import ModelRequest, Provider
from nanocrab.memory import Embedder, MemoryItem, VectorStore, default_embedder
from nanocrab.projections import Projector
from nanocrab.projections.memory import MemoryProjection, memory_items
from nanocrab.projections.memory_search import recaller, search, searcher, vectorise
from nanocrab.routing import install_profiles, load_agents
from nanocrab.tools import LocalOperations
from nanocrab.tools.base import ToolContext
from nanocrab.tools.memory import RecallArgs, RecallTool

from . import test_memory_routing as routing_tests
from . import test_memory_store as store_tests
from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually

AGENTS, REPLY = routing_tests.AGENTS, routing_tests.REPLY
SECRET = "hunter2-TENANT-A"
A_TASK = f"Deploy the payroll service with database password {SECRET}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


def in_line(log: EventLog, engine: AsyncEngine, provider: Provider, ws: Path) -> list[Reactor]:
    """The default configuration: the LLM handler recalls on a run's first model call."""
    reactors = agent_reactors(log, engine, provider, ws)
    for r in reactors:
        if isinstance(r, LlmHandler):
            r.recall = recaller(engine, min_score=0.6)
    return [*reactors, RouterHandler(log, engine, config=None)]


def routed(log: EventLog, engine: AsyncEngine, provider: Provider, ws: Path) -> list[Reactor]:
    """With agents.yaml: the router recalls before ``route.decided``."""
    config = load_agents(AGENTS)
    install_profiles(config)
    reactors = agent_reactors(log, engine, provider, ws)
    for r in reactors:
        if isinstance(r, Orchestrator):
            r.routed = True
    return [*reactors, RouterHandler(log, engine, config=config, recall_min=0.6)]


@pytest.mark.parametrize("wiring", [in_line, routed], ids=["in-line", "routed"])
async def test_a_tenants_run_start_recall_never_brings_another_tenants_episode(
    log: EventLog,
    sqlite_engine: AsyncEngine,
    workspace: Path,
    wiring: Callable[[EventLog, AsyncEngine, Provider, Path], list[Reactor]],
) -> None:
    """The adversarial pass's case: tenant A's task carries a password; tenant B's similar task
    in a new session must not get A's episode in its ``memory.recalled`` nor its prompt, while
    A's own later similar task does."""
    prompts: dict[str, list[str]] = {}
    provider = ScriptedProvider.from_text(REPLY)
    original = provider.complete

    async def spy(request: ModelRequest, **kw: object) -> object:
        prompts.setdefault(request.task, []).append(request.system)
        return await original(request, **kw)  # type: ignore[arg-type]

    provider.complete = spy  # type: ignore[method-assign]
    async with running_host(log, sqlite_engine, wiring(log, sqlite_engine, provider, workspace)):
        first = submit(A_TASK, workspace, tenant="acme")
        await log.append(first)
        await finished(log, first.run_id or "")
        episode = f"episode:{first.run_id}"

        async def folded() -> str | None:
            async with sqlite_engine.connect() as conn:
                return await conn.scalar(
                    select(memory_items.c.tenant).where(memory_items.c.item_id == episode)
                )

        assert await eventually(folded, timeout=30) == "acme"
        other = submit("Deploy the payroll service with the database password", workspace,
                       tenant="globex")  # fmt: skip
        await log.append(other)
        events = await finished(log, other.run_id or "")
        assert of_type(events, MemoryRecalled) == [], "another tenant's episode recalled"
        assert prompts[other.text] and not [p for p in prompts[other.text] if SECRET in p]
        again = submit("Please deploy the payroll service with its database password",
                       workspace, tenant="acme")  # fmt: skip
        await log.append(again)
        events = await finished(log, again.run_id or "")
    (recalled,) = of_type(events, MemoryRecalled)
    assert recalled.item_ids == [episode] and recalled.tenant == "acme"
    assert SECRET in prompts[again.text][-1]


async def test_the_recall_tool_searches_the_calling_runs_tenant_only(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    """The ``recall`` tool as wired (``run_tenants``: the run's tenant from its task in the
    log): tenant B's run finds none of A's episode and note, A's run finds both, and a run the
    log does not know finds nothing."""
    a, b = "tenant-a-run", "tenant-b-run"
    await log.append_batch([
        TaskSubmitted(text=A_TASK, run_id=a, session_id="s-a", tenant="acme"),
        ToolRequested(call_id="c1", tool="remember", run_id=a, tenant="acme",
                      arguments={"text": f"the payroll database password is {SECRET}"}),
        ToolCompleted(call_id="c1", tool="remember", run_id=a, tenant="acme",
                      content=[TextBlock(text="Remembered")]),
        RunCompleted(reply="deployed", steps=2, run_id=a, tenant="acme"),
        TaskSubmitted(text="check the payroll deployment", run_id=b, session_id="s-b",
                      tenant="globex"),
    ])  # fmt: skip
    projector = Projector(log, sqlite_engine, MemoryProjection())
    await projector.setup()
    await projector.catch_up()
    tool = RecallTool(searcher(sqlite_engine, run_tenants(log)))

    async def recall_as(run_id: str) -> str:
        ctx = ToolContext(workspace=tmp_path, ops=LocalOperations(), artifacts=None,  # type: ignore[arg-type]
                          run_id=run_id)  # fmt: skip
        result = await tool.run(RecallArgs(query="payroll database password", k=20), ctx)
        assert not result.is_error
        return str(result.content)

    own = await recall_as(a)
    assert f"episode:{a}" in own and f"note:{a}:c1" in own and SECRET in own
    for run_id in (b, "no-such-run"):
        assert SECRET not in await recall_as(run_id)
        assert "Nothing in memory matches." in await recall_as(run_id)
    await vectorise(sqlite_engine)  # the same once the vectors are stored (the index's path)
    assert SECRET not in await recall_as(b) and SECRET in await recall_as(a)


async def _memories(engine: AsyncEngine, rows: list[tuple[str, str, str, str]]) -> None:
    """The memory projection's tables on ``engine`` holding ``rows`` of ``(item id, tenant,
    session, text)`` episodes, with no vector yet."""
    projection = MemoryProjection()
    async with engine.begin() as conn:
        for table in projection.tables:
            await conn.run_sync(table.create, checkfirst=True)
        await projection.store.setup(conn)
        await conn.execute(memory_items.insert(), [
            {"item_id": item_id, "seq": seq, "kind": "episode", "tenant": tenant,
             "run_id": item_id, "session_id": session, "text": text_, "outcome": "completed",
             "summary": f"did {text_}", "tools": "[]", "files": "[]", "time": datetime.now(UTC)}
            for seq, (item_id, tenant, session, text_) in enumerate(rows, 1)
        ])  # fmt: skip


CLOSE = [
    "rotate the payroll database password",
    "rotate the payroll database password now",
    "rotate the payroll database password today",
    "please rotate the payroll database password",
    "rotate the password of the payroll database",
]


async def test_the_nearest_memories_of_another_tenant_leave_a_farther_own_one_found(
    engine: AsyncEngine,
) -> None:
    """Five of tenant A's episodes are closer to the query than tenant B's only one: B's search
    for the best 3 still finds B's (a search that took the best 3 of all and filtered them
    would answer nothing), before vectorising (scored beside the index), after it (the index;
    on an SQLite file read beside the engine) and again."""
    own = "payroll service: change the database credentials"
    await _memories(engine, [*((f"episode:a{i}", "acme", "s", t) for i, t in enumerate(CLOSE)),
                             ("episode:b0", "globex", "s", own)])  # fmt: skip
    query = "rotate the payroll database password"
    for _ in range(3):  # pending; stored (the first search stored them in the background)
        found = await search(engine, query, tenant="globex", k=3, kind="episode")
        assert [r.item_id for r in found] == ["episode:b0"]
        best = await search(engine, query, tenant="acme", k=3, kind="episode")
        assert len(best) == 3 and {r.item_id for r in best} <= {f"episode:a{i}" for i in range(5)}
        await vectorise(engine)
    assert await search(engine, query, tenant="initech", k=3) == []


async def test_a_tenant_without_episodes_recalls_nothing_and_embeds_nothing(
    sqlite_engine: AsyncEngine,
) -> None:
    """The run-start recall's cheap test is per tenant: another tenant's episodes do not make
    a tenant's run load the model and search."""
    await _memories(sqlite_engine, [("episode:a0", "acme", "s", A_TASK)])
    embedded: list[str] = []

    class Counting:
        def __init__(self, inner: Embedder) -> None:
            self.inner = inner

        def embed(self, texts: list[str]) -> object:
            embedded.extend(texts)
            return self.inner.embed(texts)

    recall = recaller(sqlite_engine, lambda: Counting(default_embedder()))  # type: ignore[arg-type, return-value]
    assert await recall("Deploy the payroll service", tenant="globex") is None
    assert embedded == []
    found = await recall("Deploy the payroll service", tenant="acme")
    assert found is not None and found.item_ids == ["episode:a0"]


async def test_new_consolidates_the_tenants_own_session_only(sqlite_engine: AsyncEngine) -> None:
    """Two tenants' sessions of one id: each consolidation summarises its tenant's tasks."""
    await _memories(sqlite_engine, [("episode:a0", "acme", "s-1", A_TASK),
                                    ("episode:b0", "globex", "s-1", "plot the signups")])  # fmt: skip
    router = RouterHandler(None, sqlite_engine, config=None)  # type: ignore[arg-type]
    (mine,) = await router.consolidate("s-1", 0, tenant="globex")
    assert "plot the signups" in mine.summary and SECRET not in mine.summary  # type: ignore[attr-defined]
    (theirs,) = await router.consolidate("s-1", 0, tenant="acme")
    assert SECRET in theirs.summary  # type: ignore[attr-defined]


# --- the vector store's contract (SQLite and PostgreSQL, own index and exact) ----------------

DIM = store_tests.DIM
store = store_tests.store  # the vector store fixture: SQLite and PostgreSQL, own index and exact


async def test_a_tenant_filter_finds_the_best_k_of_that_tenant(
    engine: AsyncEngine, store: VectorStore
) -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal(DIM).astype(np.float32)
    q /= np.linalg.norm(q)
    near = q + 0.05 * rng.standard_normal((40, DIM)).astype(np.float32)  # acme's: all close
    far = rng.standard_normal((4, DIM)).astype(np.float32)  # globex's: farther, any direction
    items = [MemoryItem(f"a{i}", "episode", f"a{i}", v, tenant="acme") for i, v in enumerate(near)]
    items += [MemoryItem(f"g{i}", "episode" if i else "note", f"g{i}", v, tenant="globex")
              for i, v in enumerate(far)]  # fmt: skip
    async with engine.begin() as conn:
        await store.add(conn, items)

    def best(vectors: np.ndarray, prefix: str, k: int, skip: int = 0) -> list[str]:
        units = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        order = [i for i in np.argsort(-(units @ q)) if i >= skip]
        return [f"{prefix}{i}" for i in order[:k]]

    async with engine.connect() as conn:
        hits = await store.search(conn, q, k=3, tenant="globex")
        assert [h.item_id for h in hits] == best(far, "g", 3)
        hits = await store.search(conn, q, k=10, tenant="globex", kind="episode")
        assert [h.item_id for h in hits] == best(far, "g", 3, skip=1), "g0 is a note"
        hits = await store.search(conn, q, k=3, tenant="acme")
        assert [h.item_id for h in hits] == best(near, "a", 3)
        assert await store.search(conn, q, k=3, tenant="initech") == []
        assert [h.item_id for h in await store.search(conn, q, k=3)] == best(near, "a", 3)
        nearest = await store.nearest(conn, q, k=3, tenant="globex")
        assert [i for i, _ in nearest] == best(far, "g", 3)


async def test_an_sqlite_vec_index_made_before_tenants_is_made_again(
    sqlite_engine: AsyncEngine,
) -> None:
    """A database whose sqlite-vec table an older version made (no tenant column: the
    projector's rebuild does not drop it) gets one with it, filled from the stored rows."""
    v = np.eye(DIM, dtype=np.float32)
    async with sqlite_engine.begin() as conn:
        await conn.exec_driver_sql(
            f"CREATE VIRTUAL TABLE memory_vec USING vec0(embedding float[{DIM}] "
            "distance_metric=cosine, kind text, chunk_size=128)"
        )
        s = VectorStore(DIM)
        assert await s.setup(conn) == "sqlite-vec"
        await s.add(conn, [MemoryItem("a", "note", "a", v[0], tenant="acme"),
                           MemoryItem("g", "note", "g", v[0] + v[1], tenant="globex")])  # fmt: skip
        made = await conn.scalar(text("SELECT sql FROM sqlite_master WHERE name = 'memory_vec'"))
        assert "tenant text" in str(made)
    async with sqlite_engine.connect() as conn:
        assert [h.item_id for h in await s.search(conn, v[0], k=1, tenant="globex")] == ["g"]
