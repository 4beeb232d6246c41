"""Memory: what the agent did and was told to remember, searchable by meaning.

Three kinds of items, each a row of ``memory_items`` and a vector in the store
(``nanocrab/memory/store.py``):

- ``episode``: a finished top-level run — the task, the outcome (``completed`` / ``failed``
  / ``cancelled``), a summary (the reply, cut to :data:`SUMMARY_CHARS`), the tools it called and
  the files it wrote or edited. Its vector is the task's text: a new task finds the earlier runs
  that asked for something similar.
- ``note``: what a run stored with the ``remember`` tool (folded from the ``tool.requested``
  arguments once its ``tool.completed`` says it succeeded).
- ``session``: a ``memory.consolidated`` summary of a session archived by ``/new``.

Vectors are *recomputed* from the text, never carried in events: the log stays small and
model-free. And they are computed *lazily*: the projection writes rows only (it never loads the
embedding model, so a one-shot ``nanocrab run`` does not pay ~0.6 s and ~190 MB for it);
:func:`~nanocrab.projections.memory_search.vectorise` embeds the rows that have no vector yet,
called by whoever searches (``memory_search.py``: the ``recall`` tool, the run-start recall) and
by ``nanocrab up``'s router in the background. Each text is embedded on its own (the embedder's
output depends on the batch's makeup by ~1.6e-7; one text per call removes even that), so a
vector depends on its text alone:
whoever computes it, before or after a rebuild, stores the same bytes, and the store keeps the
first copy of an item's vector (exactly once).

Items are keyed by the id of the event that made them (the run id for an episode), inserted
once, so a second copy of an event changes nothing.

Every item belongs to a tenant: an episode's and a note's are their run's (its
``task.submitted``'s envelope), a session summary's its ``memory.consolidated``'s (the
archive's). Every search filters on it (``memory_search.py``): one tenant never recalls
another's memories.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    String,
    Table,
    Text,
    delete,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from nanocrab.bus import Stored, Subjects
from nanocrab.events import (
    MemoryConsolidated,
    RunCancelled,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
    ToolCompleted,
    ToolRequested,
)
from nanocrab.memory import Embedder, VectorStore
from nanocrab.memory.store import memory_vectors
from nanocrab.projections.db import applied_events, bulk_insert, first_copies, metadata

SUMMARY_CHARS = 400
FILE_TOOLS = frozenset({"write", "edit"})
MEMORY_DIM = 384  # all-MiniLM-L6-v2

memory_items = Table(
    "memory_items",
    metadata,
    Column("item_id", String(128), primary_key=True),
    Column("seq", BigInteger, nullable=False, index=True),  # the event's: one item per event
    Column("kind", String(16), nullable=False),
    Column("run_id", String(128), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("text", Text, nullable=False),  # what is embedded: the task, the note, the summary
    Column("outcome", String(16), nullable=False),
    Column("summary", Text, nullable=False),
    Column("tools", Text, nullable=False),  # JSON list
    Column("files", Text, nullable=False),  # JSON list
    Column("time", DateTime(timezone=True), nullable=False),
    Column("tenant", String(64), nullable=False, default="default"),  # whose memory it is
    # has_memories' test on the hot path (does this tenant have an episode?) and the
    # consolidation's read
    Index("ix_memory_items_tenant_kind", "tenant", "kind"),
)

memory_runs = Table(
    # what an unfinished run has done so far: folded into its episode when it ends
    "memory_runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("session_id", String(128), nullable=False),
    Column("tenant", String(64), nullable=False),  # the task's: its episode's and notes'
    Column("task", Text, nullable=False),
    Column("tools", Text, nullable=False),
    Column("files", Text, nullable=False),
    Column("notes", Text, nullable=False),  # JSON {call_id: text} of pending remember calls
)

memory_applied = applied_events("memory")

_EVENTS = (TaskSubmitted, ToolRequested, ToolCompleted, RunCompleted, RunFailed, RunCancelled,
           MemoryConsolidated)  # fmt: skip

EmbedderFactory = Callable[[], Embedder]


class MemoryProjection:
    """A sparse projection (``projections/base.py``) over run and memory events. It writes
    ``memory_items`` rows only; vectors are ``memory_search.vectorise``'s job (see the module
    docstring)."""

    name = "memory"
    lazy_checkpoint_s = 1.0
    gather_s = 0.1
    # not the store's generation table: it outlives a rebuild, which bumps its generation
    # (so an exact index elsewhere reloads), and it is no part of what the log determines
    tables = (memory_items, memory_runs, memory_applied, memory_vectors)

    def __init__(self) -> None:
        self.store = VectorStore(MEMORY_DIM)  # the instance goes to the worker process: picklable

    @staticmethod
    def relevant(stored: Stored) -> bool:
        e = stored.event
        if isinstance(e, ToolCompleted):
            return e.tool == "remember"  # the other results change no memory
        return isinstance(e, _EVENTS)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        relevant = [s for s in batch if self.relevant(s)]
        if not relevant:
            return
        if await conn.scalar(select(memory_applied.c.seq).limit(1)) is None:
            # a first start or a rebuild: the sqlite-vec table (not a Table, so not dropped),
            # emptied with the vectors; the generation moves, so readers reload
            await self.store.setup(conn)
            await self.store.clear(conn)
        fresh = await first_copies(conn, memory_applied, relevant)
        if not fresh:
            return
        items: list[dict[str, object]] = []
        for s in fresh:
            e = s.event
            assert e is not None
            match e:
                case TaskSubmitted(text=text) if not e.parent_run_id and not text.startswith("/"):
                    await bulk_insert(conn, memory_runs, [{
                        "run_id": e.run_id, "session_id": e.session_id or "",
                        "tenant": e.tenant, "task": text,
                        "tools": "[]", "files": "[]", "notes": "{}",
                    }], unless_exists="run_id")  # fmt: skip
                case ToolRequested() | ToolCompleted():
                    await self._tool(conn, s.seq, e)
                case RunCompleted() | RunFailed() | RunCancelled():
                    items.extend(await self._episode(conn, s, e))
                case MemoryConsolidated():
                    items.append(
                        _row(
                            s,
                            e.episode_id,
                            "session",
                            e.tenant,
                            e.run_id or "",
                            e.session_id or "",
                            e.summary,
                            "consolidated",
                            e.summary,
                        )
                    )
                case _:
                    pass
        if items:
            await self._add(conn, items)

    async def _tool(
        self, conn: AsyncConnection, seq: int, e: ToolRequested | ToolCompleted
    ) -> None:
        run = (await conn.execute(
            select(memory_runs).where(memory_runs.c.run_id == e.run_id)
        )).mappings().first()  # fmt: skip
        if run is None:
            return  # a subagent's or an unknown run: no episode
        tools, files = json.loads(run["tools"]), json.loads(run["files"])
        notes: dict[str, str] = json.loads(run["notes"])
        if isinstance(e, ToolRequested):
            if e.tool not in tools:
                tools.append(e.tool)
            path = e.arguments.get("path")
            if e.tool in FILE_TOOLS and isinstance(path, str) and path not in files:
                files.append(path)
            note = e.arguments.get("text")
            if e.tool == "remember" and isinstance(note, str):
                notes[e.call_id] = note
        else:
            note = notes.pop(e.call_id, None)
            if note is not None and not e.is_error:
                await self._add(conn, [{
                    "item_id": f"note:{e.run_id}:{e.call_id}", "seq": seq, "kind": "note",
                    "tenant": run["tenant"], "run_id": e.run_id or "",
                    "session_id": run["session_id"], "text": note,
                    "outcome": "noted", "summary": note, "tools": "[]", "files": "[]",
                    "time": e.time,
                }])  # fmt: skip
        await conn.execute(
            memory_runs.update()
            .where(memory_runs.c.run_id == e.run_id)
            .values(tools=json.dumps(tools), files=json.dumps(files), notes=json.dumps(notes))
        )

    async def _episode(
        self, conn: AsyncConnection, s: Stored, e: RunCompleted | RunFailed | RunCancelled
    ) -> list[dict[str, object]]:
        run = (await conn.execute(
            select(memory_runs).where(memory_runs.c.run_id == e.run_id)
        )).mappings().first()  # fmt: skip
        if run is None:
            return []
        await conn.execute(delete(memory_runs).where(memory_runs.c.run_id == e.run_id))
        match e:
            case RunCompleted(reply=reply):
                outcome, summary = "completed", reply
            case RunFailed(kind=kind, reason=reason):
                outcome, summary = "failed", f"{kind}: {reason}"
            case RunCancelled(reason=reason):
                outcome, summary = "cancelled", reason
        row = _row(s, f"episode:{e.run_id}", "episode", run["tenant"], e.run_id or "",
                   run["session_id"], run["task"], outcome, summary)  # fmt: skip
        row["tools"], row["files"] = run["tools"], run["files"]
        return [row]

    async def _add(self, conn: AsyncConnection, rows: list[dict[str, object]]) -> None:
        await bulk_insert(conn, memory_items, rows, unless_exists="item_id")


def _row(
    s: Stored,
    item_id: str,
    kind: str,
    tenant: str,
    run_id: str,
    session_id: str,
    text: str,
    outcome: str,
    summary: str,
) -> dict[str, object]:
    assert s.event is not None
    return {
        "item_id": item_id, "seq": s.seq, "kind": kind, "tenant": tenant, "run_id": run_id,
        "session_id": session_id, "text": text, "outcome": outcome,
        "summary": summary[:SUMMARY_CHARS], "tools": "[]", "files": "[]", "time": s.event.time,
    }  # fmt: skip
