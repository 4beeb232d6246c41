"""Searching memory: the memory projection's rows (``projections/memory.py``) by meaning.

Vectors are computed lazily (see ``projections/memory.py``): :func:`vectorise` embeds the rows
that have none yet and stores them; :func:`search` scores such rows in memory and leaves storing
them to a background :func:`vectorise`, so a search never waits for a write. :func:`recaller`
is the run-start recall (``memory.recalled``), :func:`searcher` the ``recall`` tool's search.
Per engine, the process keeps an exact in-process index (``VectorStore(index="exact")``).

Every search is for one tenant (a required ``tenant``): it scores that tenant's items only,
stored and pending alike, so the ``k`` it answers are the tenant's best ``k`` however close
another tenant's memories are (the index filters before it ranks, see ``memory/store.py``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sqlite3
import threading
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Select, bindparam, literal, select, true
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.events import MemoryRecalled
from nanocrab.memory import Embedder, MemoryItem, NanocrabMemoryError, Vectors, VectorStore
from nanocrab.memory.sqlrows import plain_rows, prepared
from nanocrab.memory.store import memory_store_meta, memory_vectors, vectors_after
from nanocrab.projections.memory import MEMORY_DIM, EmbedderFactory, memory_items

log = logging.getLogger(__name__)

ROW_CACHE = 10_000  # memory rows kept per engine for recall results (~1 KB each)


def _default_factory() -> Embedder:
    from nanocrab.memory import default_embedder  # loads the model on first use only

    return default_embedder()


@dataclass(frozen=True, slots=True)
class Recalled:
    """One memory found for a query: its row and cosine score."""

    item_id: str
    kind: str
    score: float
    text: str
    outcome: str
    summary: str
    tools: tuple[str, ...]
    files: tuple[str, ...]

    def line(self) -> str:
        """How it appears in a prompt or a tool result."""
        if self.kind == "episode":
            extra = f"; tools: {', '.join(self.tools)}" if self.tools else ""
            extra += f"; files: {', '.join(self.files)}" if self.files else ""
            return (f"[{self.item_id} {self.score:.2f}] task: {self.text!r} -> {self.outcome}: "
                    f"{self.summary}{extra}")  # fmt: skip
        return f"[{self.item_id} {self.score:.2f}] {self.kind}: {self.summary}"


@dataclass(eq=False)
class _EngineMemory:
    """What this process knows of one database's memory: its exact index, how far
    :func:`vectorise` has got (items up to ``upto`` have vectors, under ``generation``), and
    whether there is any episode to recall (memories only grow, but for a rebuild)."""

    store: VectorStore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    upto: int = 0
    generation: int | None = None
    ready: bool = False  # the store's tables and index are set up for this generation
    has_episodes: set[str] = field(default_factory=set)  # the tenants known to have one
    storing: asyncio.Task[int] | None = None  # a background vectorise (see search)
    # items are written once and never change (a rebuild writes the same): their rows, by id
    rows: OrderedDict[str, Any] = field(default_factory=OrderedDict)

    def remember(self, row: Any) -> None:
        self.rows[str(row["item_id"])] = row
        self.rows.move_to_end(str(row["item_id"]))
        while len(self.rows) > ROW_CACHE:
            self.rows.popitem(last=False)


_engines: weakref.WeakKeyDictionary[AsyncEngine, _EngineMemory] = weakref.WeakKeyDictionary()


def _memory(engine: AsyncEngine) -> _EngineMemory:
    mem = _engines.get(engine)
    if mem is None:
        mem = _engines[engine] = _EngineMemory(VectorStore(MEMORY_DIM, index="exact"))
    return mem


def _embed_each(factory: EmbedderFactory, texts: Sequence[str]) -> list[Vectors]:
    """One text per call (see the module docstring): the vector depends on the text alone."""
    embedder = factory()
    return [embedder.embed([t])[0] for t in texts]


async def vectorise(
    engine: AsyncEngine, embedder: EmbedderFactory | None = None, *, batch: int = 256
) -> int:
    """Embed the memory items that have no vector yet, oldest first, and store their vectors;
    returns how many. Loads the embedder only when there is something to embed. Safe to run
    in several places at once: a vector depends on its text alone and the store keeps the
    first copy of an item's (on PostgreSQL the writers also take turns, so the exact index's
    ``seq`` order holds). The embedding runs in a thread, outside any transaction."""
    factory = embedder or _default_factory
    mem = _memory(engine)
    done = 0
    async with mem.lock:
        while True:
            async with engine.connect() as conn:
                pending = await _pending(conn, mem, batch)
            if not pending:
                return done
            vectors = await asyncio.to_thread(_embed_each, factory, [r.text for r in pending])
            async with engine.begin() as conn:
                if not mem.ready:
                    await mem.store.setup(conn)
                    mem.ready = True
                if conn.dialect.name == "postgresql":
                    await conn.exec_driver_sql(
                        "LOCK TABLE memory_vectors IN SHARE ROW EXCLUSIVE MODE"
                    )
                await mem.store.add(conn, [
                    MemoryItem(r.item_id, r.kind, r.text, v, tenant=r.tenant)
                    for r, v in zip(pending, vectors, strict=True)
                ])  # fmt: skip
            mem.upto = int(pending[-1].seq)
            done += len(pending)
            if len(pending) < batch:
                return done


async def _pending(conn: AsyncConnection, mem: _EngineMemory, limit: int) -> list[Any]:
    """The oldest ``limit`` items without a vector (all of ``memory_items``' columns); none
    when there are no memory tables yet. A new store generation (a rebuild) starts over.
    One statement reads the store's generation and the items (each statement is a round trip
    to the database thread, and on a busy event loop every one costs milliseconds)."""
    try:
        for _ in range(2):
            rows = await plain_rows(conn, _pending_query(), {"upto": mem.upto, "limit": limit})
            generation = rows[0].store_generation
            if generation == mem.generation:
                break
            # a rebuild: everything again (read again only if the items read were past 0)
            fresh = mem.upto == 0
            mem.generation, mem.upto, mem.ready = generation, 0, False
            if fresh:
                break
        pending = [r for r in rows if r.item_id is not None]
        for r in pending:  # a later search finds them in the index: their rows are at hand
            mem.remember(r._mapping)
        return pending
    except DBAPIError:
        await conn.rollback()
        return []


@functools.cache
def _pending_query() -> Select[Any]:
    """One row per pending item (``seq`` above ``:upto``, the oldest ``:limit``), each with the
    store's generation; one row of ``NULL`` items when none is pending (the generation still
    read). Plain columns only (:func:`plain_rows`): what a recall shows and :func:`vectorise`
    stores. Built once: :func:`plain_rows` keeps its compiled SQL."""
    items = memory_items.c
    pending = (
        select(items.item_id, items.seq, items.kind, items.tenant, items.text, items.outcome,
               items.summary, items.tools, items.files)
        .select_from(memory_items.outerjoin(
            memory_vectors, memory_items.c.item_id == memory_vectors.c.item_id))
        .where(memory_items.c.seq > bindparam("upto"), memory_vectors.c.item_id.is_(None))
        .order_by(memory_items.c.seq).limit(bindparam("limit"))
        .subquery("pending")
    )  # fmt: skip
    generation = (
        select(memory_store_meta.c.generation)
        .where(memory_store_meta.c.name == "vectors")
        .scalar_subquery()
        .label("store_generation")
    )
    one = select(literal(1).label("one")).subquery("one")
    return (
        select(generation, *pending.c)
        .select_from(one.outerjoin(pending, true()))
        .order_by(pending.c.seq)
    )


def _store_later(engine: AsyncEngine, mem: _EngineMemory, factory: EmbedderFactory) -> None:
    """Start a background :func:`vectorise` unless one is running (its failure is logged: the
    next search or ``up``'s loop tries again)."""
    if mem.storing is not None and not mem.storing.done():
        return

    def done(task: asyncio.Task[int]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("storing memory vectors failed (retried later): %r", exc)

    mem.storing = asyncio.create_task(vectorise(engine, factory), name="memory:vectorise")
    mem.storing.add_done_callback(done)


async def has_memories(engine: AsyncEngine, kind: str = "episode", *, tenant: str) -> bool:
    """Whether the projection holds any item of ``kind`` for ``tenant``: one indexed query, no
    embedding (the cheap test before a recall). Once true it stays true for the process (for
    episodes)."""
    mem = _memory(engine)
    if kind == "episode" and tenant in mem.has_episodes:
        return True
    async with engine.connect() as conn:
        try:
            found = await conn.scalar(
                select(memory_items.c.item_id)
                .where(memory_items.c.tenant == tenant, memory_items.c.kind == kind)
                .limit(1)
            )
        except DBAPIError:
            return False
    if found is not None and kind == "episode":
        mem.has_episodes.add(tenant)
    return found is not None


async def recall(
    engine: AsyncEngine,
    query_vector: Sequence[float] | Vectors,
    *,
    tenant: str,
    k: int = 3,
    kind: str | None = None,
    min_score: float | None = None,
) -> list[Recalled]:
    """``tenant``'s ``k`` vectorised memories most similar to ``query_vector`` (best first) as
    the projection holds them now; empty when it has none yet. Searches an exact in-process
    index (one per engine). Items without a vector yet are not found: :func:`search` scores
    them."""
    async with engine.connect() as conn:
        return await _recall_on(conn, _memory(engine), query_vector, k, kind, tenant, min_score,
                                None)  # fmt: skip


async def _recall_on(
    conn: AsyncConnection,
    mem: _EngineMemory,
    query_vector: Sequence[float] | Vectors,
    k: int,
    kind: str | None,
    tenant: str,
    min_score: float | None,
    generation: int | None,
    *,
    caught_up: bool = False,
) -> list[Recalled]:
    """``generation``: the store's, if just read on ``conn`` (saves the index reading it);
    ``caught_up``: :func:`_caught_up` said so on ``conn`` just before."""
    import numpy as np

    try:
        hits = await mem.store.nearest(conn, np.asarray(query_vector, dtype=np.float32), k=k,
                                       kind=kind, tenant=tenant, min_score=min_score,
                                       generation=generation, caught_up=caught_up)  # fmt: skip
    except (DBAPIError, NanocrabMemoryError):  # no tables yet
        await conn.rollback()
        return []
    missing = [i for i, _ in hits if i not in mem.rows]
    if missing:
        for r in (await conn.execute(
            select(memory_items).where(memory_items.c.item_id.in_(missing))
        )).mappings():  # fmt: skip
            mem.remember(r)
    return [_recalled(mem.rows[i], score) for i, score in hits if i in mem.rows]


async def _caught_up(conn: AsyncConnection, mem: _EngineMemory, generation: int | None) -> bool:
    """Bring the exact index up to date on ``conn`` (what :func:`_recall_on` would do first);
    ``False`` when it is not in use or failed (then the search does it as before and says what
    is wrong)."""
    try:
        return await mem.store.catch_up(conn, generation)
    except (DBAPIError, NanocrabMemoryError):  # no tables yet
        await conn.rollback()
        return False


def _recalled(r: Any, score: float) -> Recalled:
    return Recalled(str(r["item_id"]), str(r["kind"]), round(score, 4), str(r["text"]),
                    str(r["outcome"]), str(r["summary"]), tuple(json.loads(r["tools"])),
                    tuple(json.loads(r["files"])))  # fmt: skip


async def search(
    engine: AsyncEngine,
    text: str,
    *,
    tenant: str,
    embedder: EmbedderFactory | None = None,
    k: int = 3,
    kind: str | None = None,
    min_score: float | None = None,
    pending_limit: int = 256,
) -> list[Recalled]:
    """:func:`recall` by text (``tenant``'s memories only), including what the projection
    wrote since the last vectorising: those rows (the oldest ``pending_limit``; of them, the
    tenant's of ``kind``) are embedded with the query and scored in memory, and their vectors
    are stored by a background :func:`vectorise`, so a search never waits for a write (nor
    for the projector's transaction holding the SQLite lock). Embedding runs in a thread,
    while the exact index reads what was stored since it last looked (one trip to the
    database thread fewer after the embedding; starting the embedding before the pending rows
    are read made a run's start slower, docs/architecture.md)."""
    factory = embedder or _default_factory
    mem = _memory(engine)
    wanted = _Wanted(kind, tenant)
    beside = await _search_beside(engine, mem, factory, text, k, wanted, min_score,
                                  pending_limit)  # fmt: skip
    if beside is not None:
        found, pending, vectors = beside
    else:
        async with engine.connect() as conn:  # one connection: a search is a few small reads
            pending = [r for r in await _pending(conn, mem, pending_limit) if wanted.of(r)]
            texts = [text, *(r.text for r in pending)]
            embedding = asyncio.ensure_future(asyncio.to_thread(_embed_each, factory, texts))
            try:
                caught_up = await _caught_up(conn, mem, mem.generation)
                vectors = await embedding
            finally:
                if not embedding.done():
                    embedding.cancel()  # the thread finishes on its own; nobody waits for it
                elif not embedding.cancelled():
                    embedding.exception()  # raised above, or not needed: retrieved either way
            found = await _recall_on(conn, mem, vectors[0], k, kind, tenant, min_score,
                                     mem.generation, caught_up=caught_up)  # fmt: skip
    if not pending:
        return found
    _store_later(engine, mem, factory)
    return _with_pending(found, pending, vectors, k, min_score)


@dataclass(frozen=True, slots=True)
class _Wanted:
    """What a search looks for: items of ``kind`` (``None``: any) of ``tenant``."""

    kind: str | None
    tenant: str

    def of(self, row: Any) -> bool:
        """Whether a pending row (of :func:`_pending_query`) is one."""
        return row.tenant == self.tenant and (self.kind is None or row.kind == self.kind)


def _with_pending(found: list[Recalled], pending: Sequence[Any], vectors: Sequence[Vectors],
                  k: int, min_score: float | None) -> list[Recalled]:  # fmt: skip
    """``found`` joined by the ``pending`` rows (``vectors``: the query's, then theirs) that
    score at least ``min_score``, best ``k`` first."""
    import numpy as np

    query = vectors[0] / max(float(np.linalg.norm(vectors[0])), 1e-12)
    seen = {r.item_id for r in found}
    for r, v in zip(pending, vectors[1:], strict=True):
        score = round(float(v @ query / max(float(np.linalg.norm(v)), 1e-12)), 4)
        if r.item_id in seen or (min_score is not None and score < min_score):
            continue
        found.append(_recalled(r._mapping, score))
    found.sort(key=lambda r: -r.score)
    return found[:k]


async def _search_beside(
    engine: AsyncEngine,
    mem: _EngineMemory,
    factory: EmbedderFactory,
    text: str,
    k: int,
    wanted: _Wanted,
    min_score: float | None,
    pending_limit: int,
) -> tuple[list[Recalled], list[Any], list[Vectors]] | None:
    """:func:`search`'s reads and embedding in one call into a worker thread, on an SQLite
    file: the pending rows, the query's embedding and the vectors the exact index has not
    read, through a plain ``sqlite3`` connection of that thread. Through the engine they were
    two statements and a connection's check-in, each a trip to aiosqlite's thread whose answer
    waited for the event loop (busy while a run starts) — 2-3 ms of the run-start recall. Rows
    of hits this process has not seen (stored by another) are read through the engine.
    ``None``: not an SQLite file, not caught up to this database yet (the first search, a
    rebuild), or its reads failed — the careful way then (which says what is wrong)."""
    path = _sqlite_file(engine)
    position = mem.store.exact_position()
    if path is None or position is None or mem.generation is None:
        return None
    generation, after = position
    if generation != mem.generation:
        return None
    pending_read = prepared(_pending_query(), engine.dialect,
                            {"upto": mem.upto, "limit": pending_limit})  # fmt: skip
    vectors_read = prepared(vectors_after(), engine.dialect, {"after": after})
    try:
        rows, stored, vectors = await asyncio.to_thread(
            _read_and_embed, path, pending_read, vectors_read, factory, text, wanted
        )
    except sqlite3.Error:
        return None
    if not rows or rows[0].store_generation != mem.generation:
        return None  # a rebuild meanwhile
    if not mem.store.absorb(mem.generation, stored):
        return None
    pending = [r for r in rows if r.item_id is not None]
    for r in pending:  # a later search finds them in the index: their rows are at hand
        mem.remember(r._mapping)
    pending = [r for r in pending if wanted.of(r)]
    hits = mem.store.nearest_held(vectors[0], k=k, kind=wanted.kind, tenant=wanted.tenant,
                                  min_score=min_score)  # fmt: skip
    missing = [i for i, _ in hits if i not in mem.rows]
    if missing:  # stored by another process before this one saw them pending (or a restart)
        async with engine.connect() as conn:
            for r in (await conn.execute(
                select(memory_items).where(memory_items.c.item_id.in_(missing))
            )).mappings():  # fmt: skip
                mem.remember(r)
    found = [_recalled(mem.rows[i], score) for i, score in hits if i in mem.rows]
    return found, pending, vectors


_Prepared = tuple[str, list[Any], Callable[[Sequence[Any]], Any]]


def _read_and_embed(path: str, pending_read: _Prepared, vectors_read: _Prepared,
                    factory: EmbedderFactory, text: str,
                    wanted: _Wanted) -> tuple[list[Any], list[Any], list[Vectors]]:  # fmt: skip
    """In a worker thread: the pending rows, the query's and their vectors, then the stored
    vectors past the index (read after the embedding: what was stored meanwhile comes too)."""
    con = _thread_connection(path)
    sql, values, make = pending_read
    rows = [make(r) for r in con.execute(sql, values).fetchall()]
    texts = [text, *(r.text for r in rows if r.item_id is not None and wanted.of(r))]
    vectors = _embed_each(factory, texts)
    sql, values, make = vectors_read
    stored = [make(r) for r in con.execute(sql, values).fetchall()]
    return rows, stored, vectors


_THREAD = threading.local()
_THREAD_CONNECTIONS = 4
"""SQLite files a worker thread keeps a connection to (the newest used)."""


def _thread_connection(path: str) -> sqlite3.Connection:
    """This thread's read-only connection to the SQLite file ``path`` (opened once; one that
    does not exist is not created)."""
    conns: OrderedDict[str, sqlite3.Connection] | None = getattr(_THREAD, "conns", None)
    if conns is None:
        conns = _THREAD.conns = OrderedDict()
    con = conns.get(path)
    if con is None:
        if not os.path.exists(path):
            raise sqlite3.OperationalError(f"no database at {path}")
        con = sqlite3.connect(path, timeout=5.0)
        con.execute("PRAGMA query_only=ON")
        conns[path] = con
        while len(conns) > _THREAD_CONNECTIONS:
            conns.popitem(last=False)[1].close()
    conns.move_to_end(path)
    return con


def _sqlite_file(engine: AsyncEngine) -> str | None:
    """The file of an aiosqlite engine (``None``: another database, or one in memory)."""
    if engine.dialect.driver != "aiosqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return database


RunTenant = Callable[[str], Awaitable[str | None]]
"""A run's id → its tenant (its ``task.submitted``'s), ``None`` when the run is not known."""


class Search(Protocol):
    """The ``recall`` tool's search (``nanocrab.tools.memory.Search``, which the tools layer
    declares without a database): ``(query, k, kind)`` for the calling run → lines, best
    first."""

    def __call__(
        self, query: str, k: int, kind: str | None, *, run_id: str
    ) -> Awaitable[list[str]]: ...


def searcher(
    engine: AsyncEngine, tenant_of: RunTenant, embedder: EmbedderFactory | None = None
) -> Search:
    """A search for the ``recall`` tool: ``(query, k, kind, run_id=...)`` → the lines of the
    best memories of the calling run's tenant (``tenant_of``; a run it does not know finds
    nothing). The embedder loads on the first call (in a thread)."""

    async def lines(query: str, k: int, kind: str | None, *, run_id: str) -> list[str]:
        tenant = await tenant_of(run_id)
        if tenant is None:
            log.warning("recall for run %s, whose tenant is not known: nothing found", run_id)
            return []
        found = await search(engine, query, tenant=tenant, embedder=embedder, k=k, kind=kind)
        return [r.line() for r in found]

    return lines


class Recaller(Protocol):
    """A task's text, for its tenant → the earlier episodes of that tenant to put in its
    prompt (``None``: none close enough)."""

    def __call__(self, text: str, *, tenant: str) -> Awaitable[MemoryRecalled | None]: ...


def recaller(
    engine: AsyncEngine,
    embedder: EmbedderFactory | None = None,
    *,
    k: int = 3,
    min_score: float = 0.6,
) -> Recaller:
    """Similar-task recall at run start: the ``k`` best episodes of the task's tenant scoring
    at least ``min_score``, as a ``memory.recalled`` to append. Costs one indexed query and no
    embedding while the projection holds no episode of the tenant; the embedder loads on the
    first task that has something to compare with. A failure (no model, a database error) is
    logged and recalls nothing."""

    async def recall_for(text: str, *, tenant: str) -> MemoryRecalled | None:
        if not await has_memories(engine, "episode", tenant=tenant):
            return None
        try:
            found = await search(engine, text, tenant=tenant, embedder=embedder, k=k,
                                 kind="episode", min_score=min_score)  # fmt: skip
        except (NanocrabMemoryError, DBAPIError) as exc:
            # no model installed, a locked or broken database: the run goes on without
            # memories (the log shows no memory.recalled), it must not fail for them
            log.warning("run-start recall failed, the run continues without it: %s", exc)
            return None
        if not found:
            return None
        return MemoryRecalled(
            item_ids=[r.item_id for r in found], scores=[r.score for r in found],
            texts=[r.line() for r in found],
        )  # fmt: skip

    return recall_for
