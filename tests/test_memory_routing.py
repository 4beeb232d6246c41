"""Memory and routing end to end: the memory projection, recall into a new run's prompt, /new
consolidation, the router choosing agents from natural language, agents.yaml errors."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import Delivery, EventLog, Reactor, read
from nanocrab.events import (
    GrantDenied,
    MemoryConsolidated,
    MemoryRecalled,
    RouteDecided,
    RunCompleted,
    RunStarted,
    SessionArchived,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
)
from nanocrab.handlers.llm import _EARLY_BUSY, LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.router import RouterHandler
from nanocrab.llm import ScriptedProvider
from nanocrab.llm.base import Provider
from nanocrab.memory import default_embedder
from nanocrab.memory.errors import NanocrabMemoryError
from nanocrab.memory.store import memory_vectors
from nanocrab.projections import Projector
from nanocrab.projections.memory import MemoryProjection, memory_items
from nanocrab.projections.memory_search import recall, recaller, search, vectorise
from nanocrab.projections.timeline import summarize
from nanocrab.routing import AgentsConfig, AgentsError, Router, install_profiles, load_agents
from nanocrab.routing import parse_agents as parse
from nanocrab.tools import ToolRegistry

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually

AGENTS = Path(__file__).parent / "data" / "routing" / "agents.yaml"

REPLY = """
scripts:
  - name: main
    turns:
      - text: "done: {task}"
"""


@pytest.fixture(scope="module")
def config() -> AgentsConfig:
    cfg = load_agents(AGENTS)
    install_profiles(cfg)
    return cfg


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


def routed_reactors(
    log: EventLog, engine: AsyncEngine, provider: Provider, workspace: Path, config: AgentsConfig
) -> list[Reactor]:
    reactors = agent_reactors(log, engine, provider, workspace)
    for r in reactors:
        if isinstance(r, Orchestrator):
            r.routed = True
    return [*reactors, RouterHandler(log, engine, config=config, recall_min=0.6)]


# --- agents.yaml and the decision (no bus) --------------------------------------------------


def test_agents_yaml_errors_name_the_file_and_line() -> None:
    text = "version: 1\ndefault: a\nagents:\n  - name: a\n    description: x\n  - name: B\n"
    with pytest.raises(AgentsError, match=r"^agents\.yaml:6: agents\.1\.name"):
        parse(text, "agents.yaml")
    with pytest.raises(AgentsError, match=r"^f:1: .*default 'z' is not one of the agents"):
        parse("default: z\nagents:\n  - {name: a, description: x}\n", "f")
    with pytest.raises(AgentsError, match=r"^f:3: not valid YAML"):
        parse("agents:\n  - [\n", "f")


def test_one_agent_is_no_routing() -> None:
    cfg = parse("default: a\nagents:\n  - {name: a, description: x}\n")
    assert not cfg.routed


def test_the_embedding_route_tells_agents_apart(config: AgentsConfig) -> None:
    router = Router(config, default_embedder())
    assert router.by_embedding("plot a histogram of the order amounts in sales.csv").agent == (
        "analyst"
    )
    d = router.by_embedding("the web server does not come back after the reboot, check it")
    assert (d.agent, d.method) == ("ops", "embedding")
    assert d.margin > 0 and next(iter(d.scores)) == "ops"


# --- end to end on the bus ------------------------------------------------------------------


async def test_two_agents_are_routed_from_natural_language(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path, config: AgentsConfig
) -> None:
    provider = ScriptedProvider.from_text(REPLY)
    models: dict[str, str] = {}
    original = provider.complete

    async def spy(request, **kw):  # type: ignore[no-untyped-def]
        models[request.run_id] = request.model
        return await original(request, **kw)

    provider.complete = spy  # type: ignore[method-assign]
    reactors = routed_reactors(log, sqlite_engine, provider, workspace, config)
    async with running_host(log, sqlite_engine, reactors):
        tasks = {
            "analyst": submit("compute the average basket size per month from orders.csv",
                              workspace),
            "writer": submit("write a friendly announcement of the new release for our blog",
                             workspace),
            "named": submit("where is the config parsed", workspace, agent="explorer"),
        }  # fmt: skip
        for t in tasks.values():
            await log.append(t)
        runs = {k: await finished(log, t.run_id or "") for k, t in tasks.items()}
    for agent in ("analyst", "writer"):
        (route,) = of_type(runs[agent], RouteDecided)
        assert (route.agent, route.method) == (agent, "embedding")
        assert route.score > 0 and route.margin >= config.margin
        (started,) = of_type(runs[agent], RunStarted)
        assert started.agent == agent
        # the decision comes before the run starts: a replay reads it, never recomputes it
        assert runs[agent].index(route) < runs[agent].index(started)
    assert of_type(runs["named"], RouteDecided) == [], "a task naming its agent is not routed"
    # agents.yaml's model for the writer's runs; the others keep the handler's default
    assert models[tasks["writer"].run_id] == "writer-model-1"  # type: ignore[index]
    assert models[tasks["analyst"].run_id] != "writer-model-1"  # type: ignore[index]
    assert of_type(runs["named"], RunStarted)[0].agent == "explorer"


async def test_a_similar_second_task_recalls_the_first(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path, config: AgentsConfig
) -> None:
    seen: list = []
    provider = ScriptedProvider.from_text(REPLY)
    original = provider.complete

    async def spy(request, **kw):  # type: ignore[no-untyped-def]
        seen.append(request)
        return await original(request, **kw)

    provider.complete = spy  # type: ignore[method-assign]
    reactors = routed_reactors(log, sqlite_engine, provider, workspace, config)
    async with running_host(log, sqlite_engine, reactors):
        first = submit("fix the failing unit test in the date parser module", workspace)
        await log.append(first)
        events = await finished(log, first.run_id or "")
        assert of_type(events, MemoryRecalled) == [], "nothing to recall yet"
        episode = f"episode:{first.run_id}"

        async def folded() -> bool:
            found = await search(sqlite_engine, "x", tenant="default", k=50)
            return episode in {r.item_id for r in found}

        await eventually(folded, timeout=30)
        second = submit("the unit test of the date parser fails, please fix it", workspace)
        await log.append(second)
        events = await finished(log, second.run_id or "")
    (recalled,) = of_type(events, MemoryRecalled)
    assert recalled.item_ids[0] == episode and recalled.scores[0] >= 0.6
    system = seen[-1].system
    assert "## Memory" in system and "fix the failing unit test in the date parser" in system


async def test_new_consolidates_the_session_into_memory(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path, config: AgentsConfig
) -> None:
    provider = ScriptedProvider.from_text(REPLY)
    reactors = routed_reactors(log, sqlite_engine, provider, workspace, config)
    async with running_host(log, sqlite_engine, reactors):
        task = submit("draft the changelog entry for version 3.1", workspace, session_id="s-7")
        await log.append(task)
        await finished(log, task.run_id or "")
        new = submit("/new", workspace, session_id="s-7")
        await log.append(new)
        await finished(log, new.run_id or "")

        async def consolidated() -> list[MemoryConsolidated]:
            found = [s.event async for s in read(log, log.subjects.session("s-7"))]
            return [e for e in found if isinstance(e, MemoryConsolidated)]

        (event,) = await eventually(consolidated, timeout=40)
        assert "draft the changelog entry for version 3.1" in event.summary

        async def stored() -> list[str]:
            async with sqlite_engine.connect() as conn:
                rows = await conn.execute(
                    select(memory_items.c.summary).where(memory_items.c.kind == "session")
                )
                return [r[0] for r in rows]

        (summary,) = await eventually(stored, timeout=20)
        assert summary.startswith("Session s-7, 1 task(s)")


# --- the projection rebuilds identically (SQLite and PostgreSQL) ----------------------------


async def test_the_memory_projection_rebuilds_identically(
    log: EventLog, engine: AsyncEngine
) -> None:
    events = []
    for i, task in enumerate(["rename the config loader", "plot the weekly signups chart"]):
        rid = f"mem-run-{i}"
        t = TaskSubmitted(text=task, run_id=rid, session_id="s-1")
        events += [
            t,
            ToolRequested(call_id="c1", tool="write", arguments={"path": f"f{i}.py"}, run_id=rid),
            ToolCompleted(call_id="c1", tool="write", run_id=rid),
            ToolRequested(
                call_id="c2", tool="remember", arguments={"text": f"note {i}"}, run_id=rid
            ),
            ToolCompleted(
                call_id="c2", tool="remember", run_id=rid, content=[TextBlock(text="Remembered")]
            ),
            RunCompleted(reply=f"did {task}", steps=2, run_id=rid),
        ]
    events.append(MemoryConsolidated(episode_id="session:s-1", summary="two tasks",
                                     session_id="s-1"))  # fmt: skip
    events.append(events[5])  # a second copy of an event changes nothing
    await log.append_batch(events)

    async def snapshot() -> tuple[list[tuple], list[tuple]]:  # type: ignore[type-arg]
        async with engine.connect() as conn:
            items = [tuple(r) for r in await conn.execute(
                select(memory_items).order_by(memory_items.c.item_id))]  # fmt: skip
            vectors = [tuple(r) for r in await conn.execute(
                select(memory_vectors.c.item_id, memory_vectors.c.vector)
                .order_by(memory_vectors.c.item_id))]  # fmt: skip
        return items, vectors

    projector = Projector(log, engine, MemoryProjection())
    await projector.setup()
    await projector.catch_up()
    assert (await snapshot())[1] == [], "the projection writes rows; vectors are computed lazily"
    assert await vectorise(engine) == 5
    assert await vectorise(engine) == 0, "each item's vector is computed and stored once"
    first = await snapshot()
    assert [r[0] for r in first[1]] == [r[0] for r in first[0]]
    assert [r[0] for r in first[0]] == [
        "episode:mem-run-0", "episode:mem-run-1", "note:mem-run-0:c2", "note:mem-run-1:c2",
        "session:s-1",
    ]  # fmt: skip
    episode = dict((r[0], r) for r in first[0])["episode:mem-run-0"]
    assert '"write"' in episode[8] and '"f0.py"' in episode[9] and episode[6] == "completed"
    await Projector(log, engine, MemoryProjection()).rebuild()
    assert (await snapshot())[1] == []
    # a search finds rows not vectorised yet (scored in memory, stored in the background)
    (hit,) = await search(engine, "note 1", tenant="default", k=1, kind="note")
    assert hit.item_id == "note:mem-run-1:c2" and hit.score > 0.99
    await vectorise(engine)
    assert await snapshot() == first
    query = default_embedder().embed(["chart of signups per week"])[0]
    hits = await recall(engine, query, tenant="default", k=1, kind="episode")
    assert hits[0].item_id == "episode:mem-run-1"


class _NoModel:
    def embed(self, texts: object) -> object:
        raise NanocrabMemoryError("no embedding model installed")


async def test_a_search_whose_query_cannot_be_embedded_says_so_and_a_recall_goes_without(
    sqlite_engine: AsyncEngine, log: EventLog
) -> None:
    """The query is embedded while the database is read: its failure still reaches the caller
    (and a run-start recall, which must not fail the run, answers nothing)."""
    await Projector(log, sqlite_engine, MemoryProjection()).setup()
    async with sqlite_engine.begin() as conn:  # an episode to compare with: a recall searches
        await conn.execute(memory_items.insert().values(
            item_id="episode:r0", seq=1, kind="episode", run_id="r0", session_id="s0",
            text="an earlier task", outcome="completed", summary="", tools="[]", files="[]",
            time=datetime.now(UTC),
        ))  # fmt: skip
    with pytest.raises(NanocrabMemoryError, match="no embedding model"):
        await search(sqlite_engine, "anything", tenant="default", embedder=_NoModel)
    assert await recaller(sqlite_engine, _NoModel)("anything", tenant="default") is None


WRITE_ANYWAY = """
scripts:
  - name: main
    turns:
      - tool_calls: [{name: write, input: {path: out.txt, content: "x"}}]
      - text: "finished"
"""


async def test_a_routed_run_gets_its_agents_tools_only(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path, config: AgentsConfig
) -> None:
    provider = ScriptedProvider.from_text(WRITE_ANYWAY)
    reactors = routed_reactors(log, sqlite_engine, provider, workspace, config)
    async with running_host(log, sqlite_engine, reactors):
        task = submit("compute the median order value per month from orders.csv", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    assert of_type(events, RunStarted)[0].agent == "analyst"  # tools: read, ls, python
    (denied,) = of_type(events, GrantDenied)
    assert denied.tool == "write" and "not enabled for this run" in denied.reason
    assert not (workspace / "out.txt").exists()


async def test_skills_for_a_task_are_found_by_meaning(tmp_path: Path) -> None:
    from nanocrab.skills import SkillLibrary, bundled_skills_dir
    from nanocrab.tools import LocalOperations
    from nanocrab.tools.base import ToolContext
    from nanocrab.tools.discovery import (
        AvailableAgentsTool,
        NoArgs,
        SkillsForTaskArgs,
        SkillsForTaskTool,
    )

    tool = SkillsForTaskTool(SkillLibrary.discover([bundled_skills_dir()]))
    # without a skill map: by the similarity of the skills' descriptions alone
    assert tool.rank("the service log is full of errors since 3am, find out why", 1)[0].name == (
        "log-triage"
    )
    assert tool.rank("write the message for this commit", 1)[0].name == "commit-message"
    ctx = ToolContext(workspace=tmp_path, ops=LocalOperations(), artifacts=None)  # type: ignore[arg-type]
    result = await tool.run(SkillsForTaskArgs(task="review my pull request", k=2), ctx)
    assert "code-review" in str(result.content)
    agents = await AvailableAgentsTool().run(NoArgs(), ctx)
    assert "explorer" in str(agents.content)


# --- the default configuration: one agent, no router hop ------------------------------------


def single_agent_reactors(
    log: EventLog, engine: AsyncEngine, provider: Provider, workspace: Path
) -> list[Reactor]:
    """The loop as ``nanocrab run`` wires it without agents.yaml: the LLM handler recalls in
    line; the router only consolidates ``/new``."""
    reactors = agent_reactors(log, engine, provider, workspace)
    for r in reactors:
        if isinstance(r, LlmHandler):
            r.recall = recaller(engine, min_score=0.6)
    return [*reactors, RouterHandler(log, engine, config=None)]


async def test_without_routing_a_similar_task_recalls_the_first_in_line(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path
) -> None:
    seen: list = []
    provider = ScriptedProvider.from_text(REPLY)
    original = provider.complete

    async def spy(request, **kw):  # type: ignore[no-untyped-def]
        seen.append(request)
        return await original(request, **kw)

    provider.complete = spy  # type: ignore[method-assign]
    reactors = single_agent_reactors(log, sqlite_engine, provider, workspace)
    async with running_host(log, sqlite_engine, reactors):
        first = submit("rename the helper module utils.py to helpers.py", workspace)
        await log.append(first)
        events = await finished(log, first.run_id or "")
        assert of_type(events, MemoryRecalled) == [] and of_type(events, RouteDecided) == []
        episode = f"episode:{first.run_id}"

        async def folded() -> bool:
            async with sqlite_engine.connect() as conn:
                found = await conn.scalar(
                    select(memory_items.c.item_id).where(memory_items.c.item_id == episode)
                )
            return found is not None

        await eventually(folded, timeout=30)
        unrelated = submit("what is the weather like in Lisbon in May", workspace)
        await log.append(unrelated)
        assert of_type(await finished(log, unrelated.run_id or ""), MemoryRecalled) == [], (
            "nothing above the threshold: nothing recalled"
        )
        second = submit("please rename utils.py into helpers.py", workspace)
        await log.append(second)
        events = await finished(log, second.run_id or "")
    (recalled,) = of_type(events, MemoryRecalled)
    assert recalled.item_ids[0] == episode and recalled.scores[0] >= 0.6
    assert recalled.source == "llm" and of_type(events, RouteDecided) == []
    # before the model answered, in the timeline with its sources
    (responded,) = [e for e in events if e.type == "llm.responded"]
    assert events.index(recalled) < events.index(responded)
    assert summarize(recalled).startswith(f"{episode} ")
    system = seen[-1].system
    assert "## Memory" in system and "rename the helper module utils.py" in system


async def test_without_routing_new_consolidates_the_session(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path
) -> None:
    provider = ScriptedProvider.from_text(REPLY)
    reactors = single_agent_reactors(log, sqlite_engine, provider, workspace)
    async with running_host(log, sqlite_engine, reactors):
        task = submit("summarise the open issues about caching", workspace, session_id="s-9")
        await log.append(task)
        await finished(log, task.run_id or "")
        new = submit("/new", workspace, session_id="s-9")
        await log.append(new)
        await finished(log, new.run_id or "")

        async def consolidated() -> list[MemoryConsolidated]:
            found = [s.event async for s in read(log, log.subjects.session("s-9"))]
            return [e for e in found if isinstance(e, MemoryConsolidated)]

        (event,) = await eventually(consolidated, timeout=40)
    assert "summarise the open issues about caching" in event.summary


async def _memory_with(engine: AsyncEngine, item: dict[str, object]) -> None:
    """The memory projection's tables on ``engine`` holding ``item`` (a row of
    ``memory_items``; session, summary, tools, files and time defaulted), with no vector."""
    from datetime import UTC, datetime

    projection = MemoryProjection()
    row = {"session_id": "s", "summary": "", "tools": "[]", "files": "[]",
           "time": datetime.now(UTC), **item}  # fmt: skip
    async with engine.begin() as conn:
        for table in projection.tables:
            await conn.run_sync(table.create, checkfirst=True)
        await projection.store.setup(conn)
        await conn.execute(memory_items.insert(), [row])


async def test_up_embeds_new_memories_in_the_background(sqlite_engine: AsyncEngine) -> None:
    """``nanocrab up``'s router stores the vectors of rows the projection wrote, so a search
    rarely has any left to embed; a one-shot run (no interval) leaves them alone."""
    import asyncio

    from nanocrab.cli.wiring import run_start_recall

    await _memory_with(sqlite_engine, {
        "item_id": "note:r:c", "seq": 7, "kind": "note", "run_id": "r",
        "text": "the staging database password rotates on Mondays", "outcome": "noted",
    })  # fmt: skip

    async def stored() -> list[str]:
        async with sqlite_engine.connect() as conn:
            return list((await conn.execute(select(memory_vectors.c.item_id))).scalars())

    one_shot = RouterHandler(None, sqlite_engine, config=None)  # type: ignore[arg-type]
    assert one_shot.consumes == (SessionArchived,), "without routing it takes no task"
    await one_shot.background()  # returns at once: no interval
    assert await stored() == []
    up = RouterHandler(None, sqlite_engine, config=None, vectorise_every_s=0.05)  # type: ignore[arg-type]
    loop = asyncio.create_task(up.background())
    try:
        assert await eventually(stored, timeout=30) == ["note:r:c"]
    finally:
        loop.cancel()
    assert run_start_recall(sqlite_engine, {"NANOCRAB_RECALL": "off"}) is None
    with pytest.raises(ValueError, match="NANOCRAB_RECALL='high'"):
        run_start_recall(sqlite_engine, {"NANOCRAB_RECALL": "high"})


async def test_a_burst_of_tasks_searches_only_a_few_recalls_ahead_of_their_runs(
    log: EventLog, workspace: Path
) -> None:
    """Recalls started at submission (ahead of the run's first model call) are bounded: a burst
    of a thousand tasks would otherwise queue a search each in front of the runs already started,
    whose first model calls wait on theirs. A task over the bound recalls at its first call."""
    searching: list[str] = []
    release = asyncio.Event()

    async def slow_recall(text: str, *, tenant: str) -> MemoryRecalled | None:
        searching.append(text)
        await release.wait()
        return None

    llm = LlmHandler(log, provider=ScriptedProvider.from_text(REPLY), registry=ToolRegistry([]),
                     default_workspace=workspace, recall=slow_recall)  # fmt: skip
    for i in range(10):
        await llm.handle(submit(f"task number {i}", workspace), Delivery(0, ""))
    await eventually(lambda: len(searching) == _EARLY_BUSY)
    assert searching == [f"task number {i}" for i in range(_EARLY_BUSY)], "the first ones"
    release.set()
    early = list(llm._early.values())
    await asyncio.gather(*(search for _, search in early))
    await llm.handle(submit("one more task", workspace), Delivery(0, ""))
    await eventually(lambda: searching[-1:] == ["one more task"])  # room again once they ended


async def test_a_memory_first_found_pending_is_recalled_later_without_reading_its_row_again(
    sqlite_engine: AsyncEngine,
) -> None:
    """A search reads the rows not yet vectorised in full and scores them itself; once their
    vectors are stored, the next search finds them in the index and has their rows at hand
    (one trip to the database fewer on every run's start)."""
    from sqlalchemy import event

    await _memory_with(sqlite_engine, {
        "item_id": "episode:r1", "seq": 3, "kind": "episode", "run_id": "r1",
        "text": "rename the config loader and update its tests", "outcome": "completed",
        "summary": "renamed", "tools": '["edit"]',
    })  # fmt: skip
    first = await search(
        sqlite_engine, "rename the configuration loader", tenant="default", kind="episode"
    )
    assert [r.item_id for r in first] == ["episode:r1"]
    await vectorise(sqlite_engine)  # what the first search started in the background
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(sqlite_engine.sync_engine, "before_cursor_execute", seen)
    try:
        again = await search(
            sqlite_engine, "rename the configuration loader", tenant="default", kind="episode"
        )
    finally:
        event.remove(sqlite_engine.sync_engine, "before_cursor_execute", seen)
    assert [(r.item_id, r.text, r.tools) for r in again] == [
        ("episode:r1", "rename the config loader and update its tests", ("edit",))
    ]
    assert not [s for s in statements if "FROM memory_items" in s and " IN (" in s], statements


async def test_a_search_on_an_sqlite_file_reads_beside_the_engine_and_sees_other_writers(
    sqlite_engine: AsyncEngine,
) -> None:
    """After its first search, a process reads an SQLite store in a worker thread of its own
    (``_search_beside``: no statement through the engine, whose every answer waits for the
    event loop), and still finds what another process wrote meanwhile: rows not vectorised
    yet, vectors it did not store, and nothing of a store rebuilt under it."""
    from sqlalchemy import event

    from nanocrab.projections.db import make_engine
    from nanocrab.projections.memory_search import _memory

    def episode(n: int, text: str) -> dict[str, object]:
        return {"item_id": f"episode:r{n}", "seq": n + 2, "kind": "episode", "run_id": f"r{n}",
                "session_id": "s", "text": text, "outcome": "completed", "summary": "",
                "tools": "[]", "files": "[]", "time": datetime.now(UTC)}  # fmt: skip

    await _memory_with(sqlite_engine, episode(1, "rename the config loader and update its tests"))
    first = await search(
        sqlite_engine, "rename the configuration loader", tenant="default", kind="episode"
    )
    assert [r.item_id for r in first] == ["episode:r1"]
    await vectorise(sqlite_engine)
    other = make_engine(str(sqlite_engine.url))  # another process's engine on the same file
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(sqlite_engine.sync_engine, "before_cursor_execute", seen)
    try:
        async with other.begin() as conn:
            await conn.execute(memory_items.insert(), [episode(2, "rename the loader's docs")])
        found = await search(
            sqlite_engine, "rename the configuration loader", tenant="default", kind="episode"
        )
        assert {r.item_id for r in found} == {"episode:r1", "episode:r2"}, "r2 scored pending"
        assert statements == [], "read beside the engine"
        storing = _memory(sqlite_engine).storing
        assert storing is not None
        await storing  # r2's vector, stored in the background through the engine
        statements.clear()
        async with other.begin() as conn:
            await conn.execute(memory_items.insert(), [episode(3, "rename the config loader")])
        assert await vectorise(other) == 1  # r3's vector, stored by the other process
        found = await search(
            sqlite_engine, "rename the configuration loader", tenant="default", kind="episode"
        )
        assert next(r.item_id for r in found) == "episode:r3"
        (row_read,) = statements  # the vector from the file, r3's row (never seen) by the engine
        assert "FROM memory_items" in row_read and "IN (" in row_read
        statements.clear()
        again = await search(
            sqlite_engine, "rename the configuration loader", tenant="default", kind="episode"
        )
        assert again == found and statements == []
        async with other.begin() as conn:  # a rebuild under this process: a new generation
            await MemoryProjection().store.clear(conn)
            await conn.execute(memory_items.delete())
        assert await search(
            sqlite_engine, "rename the configuration loader", tenant="default"
        ) == []
    finally:
        event.remove(sqlite_engine.sync_engine, "before_cursor_execute", seen)
        await other.dispose()
