"""A vector store in the projections database: items (id, kind, tenant, text, unit vector) and
top-k cosine search, on SQLite and PostgreSQL with one contract.

A search filtered by kind or tenant returns the ``k`` best items *that pass the filter*, never
the ``k`` best of all filtered afterwards (which would leave fewer than there are, or none, when
another tenant's items are closer): sqlite-vec filters its metadata columns inside the scan, the
exact index scores only the rows that pass, and pgvector's approximate scan is redone exactly
when the filter leaves it short.

The rows of ``memory_vectors`` are the truth (the vector as float32 bytes); the search index
depends on the database:

- ``sqlite-vec``: on SQLite, a ``vec0`` virtual table (``memory_vec``) written in the same
  transaction as the rows, searched in SQL (brute force, cosine).
- ``pgvector``: on PostgreSQL when the ``vector`` extension can be created, a ``vector(dim)``
  table with an HNSW index, searched in SQL. (Not exercised here: this machine's PostgreSQL 15
  has no pgvector.)
- ``exact``: anywhere else (and on request), an in-process numpy matrix of every vector, caught
  up from the table by ``seq`` before each search and reloaded after a deletion; exact cosine.

Writes go through the caller's connection, so a projection adds items in the transaction that
moves its checkpoint. ``add`` is idempotent on ``item_id`` (the first copy wins), as projections
must be. The ``exact`` index assumes one writer at a time (a projection has one projector), so
sequence numbers become visible in order, and reads committed rows: search on a connection
without uncommitted memory writes (a rolled-back row would stay in the matrix).
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    LargeBinary,
    MetaData,
    Select,
    String,
    Table,
    Text,
    bindparam,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert

from nanocrab.memory import sqlite_vec
from nanocrab.memory.embedder import Vectors
from nanocrab.memory.errors import DimensionError, NanocrabMemoryError
from nanocrab.memory.sqlrows import plain_rows

log = logging.getLogger(__name__)

IndexKind = Literal["sqlite-vec", "pgvector", "exact"]

metadata = MetaData()
"""The store's own tables. Not the projections' ``MetaData``: this package does not import
``nanocrab.projections`` (a memory projection there will import it), but the projector
creates and drops any ``Table`` a projection lists, so ``VectorStore.tables`` can join its
tables."""

memory_vectors = Table(
    "memory_vectors",
    metadata,
    # an INTEGER PRIMARY KEY on SQLite: the rowid, which the vec0 table shares
    Column(
        "seq", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("item_id", String(128), nullable=False, unique=True),
    Column("kind", String(32), nullable=False),
    # whose item: searches filter on it (memories never cross tenants)
    Column("tenant", String(64), nullable=False, default="default"),
    Column("text", Text, nullable=False),
    Column("vector", LargeBinary, nullable=False),
)

memory_store_meta = Table(
    "memory_store_meta",
    metadata,
    Column("name", String(32), primary_key=True),
    # random at creation, bumped by every deletion: an in-process exact index reloads when it
    # changes
    Column("generation", BigInteger, nullable=False),
)

_VEC_TABLE = "memory_vec"
_VEC_CHUNK = 128  # vectors per sqlite-vec chunk: 192 KB at 384 dimensions
_PG_TABLE = "memory_pgvector"

# loaded before any engine opens its connections: see memory/sqlite_vec.py
sqlite_vec.register()


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One thing to remember. ``vector`` is 1-D float32 of the store's dimension (normalised
    on the way in); ``kind`` groups items for filtering (``episode``, ``note``, ...);
    ``tenant`` is whose it is (a search for one tenant finds no other's)."""

    item_id: str
    kind: str
    text: str
    vector: Vectors
    tenant: str = "default"


@dataclass(frozen=True, slots=True)
class Hit:
    item_id: str
    kind: str
    text: str
    score: float  # cosine similarity, in [-1, 1]


class VectorStore:
    """Items and their vectors in the projections database (see the module docstring).

    One instance per database: the ``exact`` index lives in it. Writes always maintain the
    database's own index (sqlite-vec, pgvector) when it has one; ``index`` chooses what searches
    use: by default that own index, else ``"exact"``. ``index="exact"`` is the fast choice for
    a long-lived process with a large store: at 100k memories sqlite-vec's brute-force scan
    took >100 ms here, the numpy matrix a few ms (bench/memory_eval.py), for 1.5 KB of RAM per
    memory and a first search that loads them all.
    """

    tables = (memory_vectors, memory_store_meta)

    def __init__(self, dim: int, *, index: IndexKind | None = None) -> None:
        self.dim = dim
        self._forced = index
        self._native: IndexKind | None = None
        self._exact = _ExactIndex(dim)

    async def setup(self, conn: AsyncConnection) -> IndexKind:
        """Create the tables and the database's own index if missing (call it before anything
        else); returns the index searches use."""
        await conn.run_sync(metadata.create_all, tables=list(self.tables))
        # a random first generation: tables dropped and re-created (a projector's rebuild) get
        # a new one, so an exact index holding the old rows reloads
        await conn.execute(
            _insert_new(conn, memory_store_meta, "name"),
            {"name": "vectors", "generation": secrets.randbits(62)},
        )
        native = await self._native_index(conn)
        if native != "exact":
            await self._drop_untenanted(conn, native)
        if native == "sqlite-vec":
            # vec0 allocates its vectors a chunk at a time: the default 1024 made a store of
            # a few memories 1.5 MB (26 KB per task after 60 one-tool runs, more than the log)
            await conn.exec_driver_sql(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {_VEC_TABLE} USING vec0("
                f"embedding float[{self.dim}] distance_metric=cosine, kind text, tenant text, "
                f"chunk_size={_VEC_CHUNK})"
            )
        elif native == "pgvector":
            await conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {_PG_TABLE} (seq BIGINT PRIMARY KEY, "
                f"kind VARCHAR(32) NOT NULL, tenant VARCHAR(64) NOT NULL, "
                f"embedding vector({self.dim}) NOT NULL)"
            )
            await conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS ix_{_PG_TABLE}_hnsw ON {_PG_TABLE} "
                "USING hnsw (embedding vector_cosine_ops)"
            )
        if native != "exact":
            await self._resync(conn, native)
        return await self.index(conn)

    async def _drop_untenanted(self, conn: AsyncConnection, native: IndexKind) -> None:
        """Drop the database's own index when an older version made it without the tenant
        column (it is not a ``Table``: the projector's rebuild leaves it); ``setup`` then makes
        it again and :meth:`_resync` fills it from the stored rows."""
        if native == "sqlite-vec":
            made = await conn.scalar(
                text("SELECT sql FROM sqlite_master WHERE name = :name"), {"name": _VEC_TABLE}
            )
            stale = made is not None and "tenant text" not in str(made)
        else:
            columns = await conn.scalar(
                text("SELECT count(*) FROM information_schema.columns "
                     "WHERE table_name = :name AND table_schema = current_schema()"),
                {"name": _PG_TABLE},
            )  # fmt: skip
            tenant = await conn.scalar(
                text("SELECT count(*) FROM information_schema.columns WHERE table_name = :name "
                     "AND table_schema = current_schema() AND column_name = 'tenant'"),
                {"name": _PG_TABLE},
            )  # fmt: skip
            stale = bool(columns) and not tenant
        if stale:
            table = _VEC_TABLE if native == "sqlite-vec" else _PG_TABLE
            log.info("the %s index has no tenant column: made again", native)
            await conn.exec_driver_sql(f"DROP TABLE {table}")

    async def _resync(self, conn: AsyncConnection, native: IndexKind) -> None:
        """Rebuild the database's own index when it does not hold exactly the stored rows: the
        projector drops and re-creates ``tables`` on a rebuild, which leaves the index (not a
        ``Table``) with rows whose ids come back."""
        table = _VEC_TABLE if native == "sqlite-vec" else _PG_TABLE
        key = "rowid" if native == "sqlite-vec" else "seq"
        rows = (await conn.execute(select(func.count(), func.max(memory_vectors.c.seq)))).one()
        indexed = (await conn.execute(text(f"SELECT count(*), max({key}) FROM {table}"))).one()
        if tuple(rows) != tuple(indexed):
            log.info("rebuilding the %s index of %d memories", native, rows[0])
            await conn.exec_driver_sql(f"DELETE FROM {table}")
            await self._index_rows(conn, native, after=0)

    async def _index_rows(self, conn: AsyncConnection, native: IndexKind, *, after: int) -> None:
        """Add the stored rows with a ``seq`` above ``after`` to the database's own index."""
        if native == "sqlite-vec":
            await conn.exec_driver_sql(
                f"INSERT INTO {_VEC_TABLE}(rowid, embedding, kind, tenant) "
                "SELECT seq, vector, kind, tenant FROM memory_vectors WHERE seq > ?",
                (after,),
            )
        elif native == "pgvector":
            v = memory_vectors.c
            new = await conn.execute(select(v.seq, v.kind, v.tenant, v.vector).where(v.seq > after))
            params = [
                {"seq": seq, "kind": kind, "tenant": tenant,
                 "embedding": _pg_literal(bytes(blob))}
                for seq, kind, tenant, blob in new
            ]  # fmt: skip
            if params:
                await conn.execute(
                    text(
                        f"INSERT INTO {_PG_TABLE} (seq, kind, tenant, embedding) "
                        "VALUES (:seq, :kind, :tenant, CAST(:embedding AS vector))"
                    ),
                    params,
                )

    async def index(self, conn: AsyncConnection) -> IndexKind:
        """The index searches use on ``conn``'s database."""
        return self._forced or await self._native_index(conn)

    async def _native_index(self, conn: AsyncConnection) -> IndexKind:
        """The database's own index, which every write keeps up to date whatever searches use
        (so stores with different ``index`` settings can share a database)."""
        if self._native is None:
            self._native = await _detect(conn)
        return self._native

    async def add(self, conn: AsyncConnection, items: Sequence[MemoryItem]) -> None:
        """Store ``items``; an ``item_id`` already stored (or repeated in ``items``) is left
        as it is."""
        if not items:
            return
        rows = [
            {"item_id": it.item_id, "kind": it.kind, "tenant": it.tenant, "text": it.text,
             "vector": self._unit(it.vector).tobytes()}
            for it in items
        ]  # fmt: skip
        index = await self._native_index(conn)
        before = await conn.scalar(select(func.coalesce(func.max(memory_vectors.c.seq), 0)))
        await conn.execute(_insert_new(conn, memory_vectors, "item_id"), rows)
        await self._index_rows(conn, index, after=int(before or 0))

    async def delete(self, conn: AsyncConnection, item_ids: Sequence[str]) -> None:
        if not item_ids:
            return
        index = await self._native_index(conn)
        seqs = list(
            (await conn.execute(
                select(memory_vectors.c.seq).where(memory_vectors.c.item_id.in_(item_ids))
            )).scalars()
        )  # fmt: skip
        if not seqs:
            return
        await conn.execute(delete(memory_vectors).where(memory_vectors.c.seq.in_(seqs)))
        if index in ("sqlite-vec", "pgvector"):
            table = _VEC_TABLE if index == "sqlite-vec" else _PG_TABLE
            key = "rowid" if index == "sqlite-vec" else "seq"
            await conn.execute(
                text(f"DELETE FROM {table} WHERE {key} = :seq"), [{"seq": s} for s in seqs]
            )
        await self._bump_generation(conn)

    async def clear(self, conn: AsyncConnection) -> None:
        """Forget everything (before a rebuild)."""
        index = await self._native_index(conn)
        await conn.execute(delete(memory_vectors))
        if index == "sqlite-vec":
            await conn.exec_driver_sql(f"DELETE FROM {_VEC_TABLE}")
        elif index == "pgvector":
            await conn.exec_driver_sql(f"DELETE FROM {_PG_TABLE}")
        await self._bump_generation(conn)

    async def count(self, conn: AsyncConnection) -> int:
        return int(await conn.scalar(select(func.count()).select_from(memory_vectors)) or 0)

    async def search(
        self,
        conn: AsyncConnection,
        query: Vectors,
        *,
        k: int = 5,
        kind: str | None = None,
        tenant: str | None = None,
        min_score: float | None = None,
    ) -> list[Hit]:
        """The ``k`` items most similar to ``query`` (best first), of ``kind`` and ``tenant``
        if given (``None``: any; a caller serving a tenant always gives it), with a cosine
        similarity of at least ``min_score`` if given."""
        q = self._unit(query)
        index = await self.index(conn)
        try:
            if index == "sqlite-vec":
                found = await self._search_sqlite_vec(conn, q, k, kind, tenant)
            elif index == "pgvector":
                found = await self._search_pgvector(conn, q, k, kind, tenant)
            else:
                await self._exact.catch_up(conn)
                found = self._exact.top(q, k, kind, tenant)
        except DBAPIError as exc:
            raise NanocrabMemoryError(f"memory search failed on the {index} index: {exc}") from exc
        if min_score is not None:
            found = [(seq, score) for seq, score in found if score >= min_score]
        return await _hits(conn, found)

    async def _search_sqlite_vec(
        self, conn: AsyncConnection, q: Vectors, k: int, kind: str | None, tenant: str | None
    ) -> list[tuple[int, float]]:
        # metadata columns are filtered inside vec0's KNN scan: k rows that pass, not k then
        # filtered
        where = "".join(f" AND {name} = :{name}" for name, value in
                        (("kind", kind), ("tenant", tenant)) if value is not None)  # fmt: skip
        result = await conn.execute(
            text(
                f"SELECT rowid, distance FROM {_VEC_TABLE} "
                f"WHERE embedding MATCH :q AND k = :k{where} ORDER BY distance"
            ),
            {"q": q.tobytes(), "k": k, "kind": kind, "tenant": tenant},
        )
        return [(int(seq), 1.0 - float(dist)) for seq, dist in result]

    async def _search_pgvector(
        self, conn: AsyncConnection, q: Vectors, k: int, kind: str | None, tenant: str | None
    ) -> list[tuple[int, float]]:
        """HNSW filters the candidates its scan visits (``hnsw.ef_search``, 40 by default):
        behind a filter it can answer fewer than ``k`` when others' items are closer. Then the
        same query runs without the index (ordering by an expression it cannot serve), exact
        over the rows that pass. (Not exercised here: no pgvector on this machine.)"""
        where = " AND ".join(f"{name} = :{name}" for name, value in
                             (("kind", kind), ("tenant", tenant)) if value is not None)  # fmt: skip
        params = {"q": _pg_literal(q.tobytes()), "k": k, "kind": kind, "tenant": tenant}
        found: list[tuple[int, float]] = []
        for order in ("embedding <=> CAST(:q AS vector)", "(embedding <=> CAST(:q AS vector)) + 0"):
            result = await conn.execute(
                text(f"SELECT seq, 1 - (embedding <=> CAST(:q AS vector)) FROM {_PG_TABLE} "
                     f"{'WHERE ' + where if where else ''} ORDER BY {order} LIMIT :k"),
                params,
            )  # fmt: skip
            found = [(int(seq), float(score)) for seq, score in result]
            if len(found) >= k or not where:
                break
        return found

    async def nearest(
        self,
        conn: AsyncConnection,
        query: Vectors,
        *,
        k: int = 5,
        kind: str | None = None,
        tenant: str | None = None,
        min_score: float | None = None,
        generation: int | None = None,
        caught_up: bool = False,
    ) -> list[tuple[str, float]]:
        """:meth:`search`'s ``(item_id, score)`` pairs only: on the exact index, one query
        fewer (the index holds the ids), two with ``generation`` (the store's deletion
        generation, when the caller has just read it on ``conn``), none with ``caught_up``
        (the caller has just called :meth:`catch_up` on ``conn``)."""
        if not caught_up and not await self.catch_up(conn, generation):
            hits = await self.search(conn, query, k=k, kind=kind, tenant=tenant,
                                     min_score=min_score)  # fmt: skip
            return [(h.item_id, h.score) for h in hits]
        return self.nearest_held(query, k=k, kind=kind, tenant=tenant, min_score=min_score)

    def nearest_held(
        self, query: Vectors, *, k: int = 5, kind: str | None = None,
        tenant: str | None = None, min_score: float | None = None,
    ) -> list[tuple[str, float]]:  # fmt: skip
        """:meth:`nearest` on what the exact index holds now (no read: after :meth:`absorb`)."""
        found = self._exact.top_ids(self._unit(query), k, kind, tenant)
        return [(i, sc) for i, sc in found if min_score is None or sc >= min_score]

    async def catch_up(self, conn: AsyncConnection, generation: int | None = None) -> bool:
        """Read into the exact in-process index what was stored since it last looked (before
        a :meth:`nearest` that says ``caught_up``: a search can do it while its query is being
        embedded); ``False`` when searches use the database's own index instead, which needs
        nothing of the kind. ``generation`` as for :meth:`nearest`."""
        if await self.index(conn) != "exact":
            return False
        try:
            await self._exact.catch_up(conn, generation)
        except DBAPIError as exc:
            raise NanocrabMemoryError(f"memory search failed on the exact index: {exc}") from exc
        return True

    def exact_position(self) -> tuple[int, int] | None:
        """Where the exact index stands — ``(deletion generation, last seq read)`` — when
        searches use it, for a reader that fetches the rows past it elsewhere
        (:meth:`absorb`); ``None`` otherwise."""
        if self._forced != "exact":
            return None
        return self._exact.position()

    def absorb(self, generation: int, rows: Sequence[Any]) -> bool:
        """Add to the exact index ``rows`` — ``(seq, kind, vector, item_id, tenant)`` past the
        position :meth:`exact_position` gave, read from the store under ``generation`` — as
        :meth:`catch_up` would have. ``False`` (nothing added) when the store's generation is
        not the index's: a rebuild, to be read again the careful way."""
        if self._forced != "exact" or generation != self._exact.position()[0]:
            return False
        self._exact.add_rows(rows)
        return True

    def _unit(self, vector: Vectors) -> Vectors:
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        if v.shape[0] != self.dim:
            raise DimensionError(f"a vector of dimension {v.shape[0]}, the store's is {self.dim}")
        norm = float(np.linalg.norm(v))
        out: Vectors = v / norm if norm > 0 else v
        return out

    async def _bump_generation(self, conn: AsyncConnection) -> None:
        done = await conn.execute(
            update(memory_store_meta)
            .where(memory_store_meta.c.name == "vectors")
            .values(generation=memory_store_meta.c.generation + 1)
        )
        if done.rowcount == 0:
            await conn.execute(
                _insert_new(conn, memory_store_meta, "name"),
                {"name": "vectors", "generation": secrets.randbits(62)},
            )


def _insert_new(conn: AsyncConnection, table: Table, key: str) -> Insert:
    """An INSERT that skips rows whose unique ``key`` is stored (or came earlier)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=[key])
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=[key])
    raise NanocrabMemoryError(
        f"the memory store supports SQLite and PostgreSQL, not {conn.dialect.name}"
    )


async def _detect(conn: AsyncConnection) -> IndexKind:
    if conn.dialect.name == "sqlite":
        try:  # a failed statement leaves an SQLite transaction usable: no savepoint needed
            await conn.exec_driver_sql("SELECT vec_version()")
        except DBAPIError:
            log.warning(
                "this SQLite connection has no sqlite-vec (opened before nanocrab.memory.store "
                "was imported?): memory search is exact, in numpy"
            )
            return "exact"
        return "sqlite-vec"
    if conn.dialect.name == "postgresql":
        available = await conn.scalar(
            text("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")
        )
        if not available:
            return "exact"
        try:
            async with conn.begin_nested():
                await conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
        except DBAPIError as exc:
            log.warning("pgvector is available but cannot be created (%s): exact search", exc)
            return "exact"
        return "pgvector"
    return "exact"


def _pg_literal(blob: bytes) -> str:
    """pgvector's text form of a float32 vector: ``[0.1,0.2,...]`` (repr keeps every bit)."""
    return "[" + ",".join(repr(float(x)) for x in np.frombuffer(blob, dtype=np.float32)) + "]"


async def _hits(conn: AsyncConnection, found: list[tuple[int, float]]) -> list[Hit]:
    if not found:
        return []
    rows = {
        seq: (item_id, kind, text_)
        for seq, item_id, kind, text_ in await conn.execute(
            select(
                memory_vectors.c.seq,
                memory_vectors.c.item_id,
                memory_vectors.c.kind,
                memory_vectors.c.text,
            ).where(memory_vectors.c.seq.in_([seq for seq, _ in found]))
        )
    }
    return [Hit(*rows[seq], score=score) for seq, score in found if seq in rows]


@functools.cache
def vectors_after() -> Select[Any]:
    """The stored vectors past ``:after`` in order, as ``(seq, kind, vector, item_id,
    tenant)`` (built once, see :func:`plain_rows`)."""
    v = memory_vectors.c
    after = select(v.seq, v.kind, v.vector, v.item_id, v.tenant).where(v.seq > bindparam("after"))
    return after.order_by(v.seq)


class _ExactIndex:
    """Every stored vector in one float32 matrix, kept in step with ``memory_vectors``: rows
    with a ``seq`` above the last one seen are appended before a search; a new deletion
    generation reloads it all. Search is one matrix-vector product (exact cosine: the rows
    are unit vectors) over the rows that pass the kind and tenant filters, so a filtered search
    finds the best ``k`` of those rows however many closer ones the filters leave out."""

    def __init__(self, dim: int) -> None:
        self._dim = dim
        self._reset(-1)

    def _reset(self, generation: int) -> None:
        self._generation = generation
        self._last_seq = 0
        self._n = 0
        self._matrix = np.empty((1024, self._dim), dtype=np.float32)
        self._seqs = np.empty(1024, dtype=np.int64)
        self._kinds = np.empty(1024, dtype=np.int32)
        self._kind_codes: dict[str, int] = {}
        self._tenants = np.empty(1024, dtype=np.int32)
        self._tenant_codes: dict[str, int] = {}
        self._ids: list[str] = []

    async def catch_up(self, conn: AsyncConnection, generation: int | None = None) -> None:
        if generation is None:
            generation = int(
                await conn.scalar(
                    select(memory_store_meta.c.generation)
                    .where(memory_store_meta.c.name == "vectors")
                )
                or 0
            )  # fmt: skip
        if generation != self._generation:
            self._reset(generation)
        self.add_rows(await plain_rows(conn, vectors_after(), {"after": self._last_seq}))

    def position(self) -> tuple[int, int]:
        return self._generation, self._last_seq

    def add_rows(self, rows: Sequence[Any]) -> None:
        """Append ``(seq, kind, vector, item_id, tenant)`` rows in ``seq`` order; those at or
        below the last seq already held (read meanwhile by another reader) are skipped."""
        rows = [r for r in rows if int(r[0]) > self._last_seq]
        if not rows:
            return
        need = self._n + len(rows)
        if need > len(self._seqs):
            size = max(need, 2 * len(self._seqs))
            self._matrix = np.resize(self._matrix, (size, self._dim))
            self._seqs = np.resize(self._seqs, size)
            self._kinds = np.resize(self._kinds, size)
            self._tenants = np.resize(self._tenants, size)
        block = np.frombuffer(b"".join(bytes(r[2]) for r in rows), dtype=np.float32)
        self._matrix[self._n : need] = block.reshape(len(rows), self._dim)
        self._seqs[self._n : need] = [r[0] for r in rows]
        self._kinds[self._n : need] = [
            self._kind_codes.setdefault(r[1], len(self._kind_codes)) for r in rows
        ]
        self._tenants[self._n : need] = [
            self._tenant_codes.setdefault(r[4], len(self._tenant_codes)) for r in rows
        ]
        self._ids.extend(str(r[3]) for r in rows)
        self._n = need
        self._last_seq = int(rows[-1][0])

    def top(
        self, q: Vectors, k: int, kind: str | None, tenant: str | None
    ) -> list[tuple[int, float]]:
        return [(int(self._seqs[i]), score) for i, score in self._top(q, k, kind, tenant)]

    def top_ids(
        self, q: Vectors, k: int, kind: str | None, tenant: str | None
    ) -> list[tuple[str, float]]:
        return [(self._ids[i], score) for i, score in self._top(q, k, kind, tenant)]

    def _top(
        self, q: Vectors, k: int, kind: str | None, tenant: str | None
    ) -> list[tuple[int, float]]:
        """``(row, score)`` of the best ``k`` rows of ``kind`` and ``tenant`` (``None``: any),
        best first."""
        n = self._n
        passing: np.ndarray[Any, np.dtype[np.bool_]] | None = None
        for codes, column, wanted in ((self._kind_codes, self._kinds, kind),
                                      (self._tenant_codes, self._tenants, tenant)):  # fmt: skip
            if wanted is None:
                continue
            code = codes.get(wanted)
            if code is None:
                return []
            match = column[:n] == code
            passing = match if passing is None else passing & match
        rows: np.ndarray[Any, np.dtype[np.intp]] = (
            np.arange(n) if passing is None else np.flatnonzero(passing)
        )
        m = len(rows)
        k = min(k, m)
        if k <= 0:
            return []
        # most rows pass: one product over the whole matrix (no copy of it); one tenant among
        # many: only its rows are scored
        scores = (self._matrix[:n] @ q)[rows] if m * 4 > n else self._matrix[rows] @ q
        top = np.argpartition(-scores, k - 1)[:k] if k < m else np.arange(m)
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(rows[i]), float(scores[i])) for i in top]
