"""The vector store's contract, run on SQLite and PostgreSQL, with the database's own index
(sqlite-vec on SQLite; pgvector where it exists) and with the exact in-process index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.memory import DimensionError, IndexKind, MemoryItem, VectorStore
from nanocrab.memory.store import metadata

DIM = 16


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def items(vectors: np.ndarray, kind: str = "note", prefix: str = "m") -> list[MemoryItem]:
    return [
        MemoryItem(item_id=f"{prefix}{i}", kind=kind, text=f"text {prefix}{i}", vector=v)
        for i, v in enumerate(vectors)
    ]


@pytest.fixture(params=["native", "exact"])
async def store(request: pytest.FixtureRequest, engine: AsyncEngine) -> VectorStore:
    s = VectorStore(DIM, index="exact" if request.param == "exact" else None)
    async with engine.begin() as conn:
        await s.setup(conn)
    return s


async def test_the_native_index_is_sqlite_vec_on_sqlite(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        index = await VectorStore(DIM).setup(conn)
    if engine.dialect.name == "sqlite":
        assert index == "sqlite-vec"  # loaded into aiosqlite's connections
    else:
        assert index in ("pgvector", "exact")


async def test_search_returns_the_nearest_by_cosine_best_first(
    engine: AsyncEngine, store: VectorStore
) -> None:
    vectors = unit_vectors(200)
    async with engine.begin() as conn:
        await store.add(conn, items(vectors))
    queries = unit_vectors(10, seed=1)
    async with engine.connect() as conn:
        for q in queries:
            hits = await store.search(conn, q, k=5)
            expected = np.argsort(-(vectors @ q))[:5]
            assert [h.item_id for h in hits] == [f"m{i}" for i in expected]
            assert [h.score for h in hits] == pytest.approx(
                [float(vectors[i] @ q) for i in expected], abs=1e-5
            )
            assert hits[0].text == f"text m{expected[0]}"


async def test_an_item_is_stored_once_and_the_first_copy_wins(
    engine: AsyncEngine, store: VectorStore
) -> None:
    v = unit_vectors(3)
    async with engine.begin() as conn:
        await store.add(conn, [*items(v[:2]), MemoryItem("m1", "note", "repeated", v[2])])
        await store.add(conn, [MemoryItem("m0", "note", "a second copy", v[2]), *items(v[:1])])
    async with engine.connect() as conn:
        assert await store.count(conn) == 2
        hits = await store.search(conn, v[0], k=1)
    assert (hits[0].item_id, hits[0].text) == ("m0", "text m0")
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)


async def test_kind_and_min_score_filter(engine: AsyncEngine, store: VectorStore) -> None:
    v = unit_vectors(40)
    async with engine.begin() as conn:
        await store.add(conn, items(v[:20], kind="note", prefix="n"))
        await store.add(conn, items(v[20:], kind="episode", prefix="e"))
    async with engine.connect() as conn:
        hits = await store.search(conn, v[3], k=5, kind="episode")
        assert len(hits) == 5 and all(h.kind == "episode" for h in hits)
        assert await store.search(conn, v[3], k=5, kind="other") == []
        strict = await store.search(conn, v[3], k=5, min_score=0.999)
        assert [h.item_id for h in strict] == ["n3"]


async def test_deleted_and_cleared_items_are_not_found(
    engine: AsyncEngine, store: VectorStore
) -> None:
    v = unit_vectors(10)
    async with engine.begin() as conn:
        await store.add(conn, items(v))
    async with engine.connect() as conn:
        assert (await store.search(conn, v[4], k=1))[0].item_id == "m4"
    async with engine.begin() as conn:
        await store.delete(conn, ["m4"])
    async with engine.connect() as conn:
        assert "m4" not in [h.item_id for h in await store.search(conn, v[4], k=10)]
        assert await store.count(conn) == 9
    async with engine.begin() as conn:
        await store.clear(conn)
    async with engine.connect() as conn:
        assert await store.search(conn, v[4], k=3) == []
    async with engine.begin() as conn:
        await store.add(conn, items(v[:2], prefix="again"))
    async with engine.connect() as conn:
        assert [h.item_id for h in await store.search(conn, v[1], k=1)] == ["again1"]


async def test_a_rebuild_gives_the_same_results(engine: AsyncEngine, store: VectorStore) -> None:
    v, queries = unit_vectors(100), unit_vectors(5, seed=2)
    async with engine.begin() as conn:
        await store.add(conn, items(v))
    async with engine.connect() as conn:
        before = [await store.search(conn, q, k=5) for q in queries]
    async with engine.begin() as conn:
        await store.clear(conn)
        await store.add(conn, items(v))
    async with engine.connect() as conn:
        after = [await store.search(conn, q, k=5) for q in queries]
    assert [[h.item_id for h in hs] for hs in after] == [[h.item_id for h in hs] for hs in before]


async def test_tables_dropped_and_recreated_by_a_rebuild_leave_no_stale_index(
    engine: AsyncEngine, store: VectorStore
) -> None:
    """The projector drops and re-creates a projection's tables on a rebuild; the database's
    own index (not a table) is brought back in line by ``setup``."""
    v = unit_vectors(10)
    async with engine.begin() as conn:
        await store.add(conn, items(v, prefix="old"))
    async with engine.connect() as conn:
        assert (await store.search(conn, v[5], k=1))[0].item_id == "old5"
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all, tables=list(VectorStore.tables))
        await conn.run_sync(metadata.create_all, tables=list(VectorStore.tables))
    fresh = VectorStore(DIM, index=await _index_of(engine, store))
    async with engine.begin() as conn:
        await fresh.setup(conn)
        await fresh.add(conn, items(v[:3], prefix="new"))
    async with engine.connect() as conn:
        for s in (fresh, store):  # store's exact index, if it has one, held the old rows
            assert [h.item_id for h in await s.search(conn, v[1], k=10)][:1] == ["new1"]
            assert {h.item_id for h in await s.search(conn, v[5], k=10)} <= {"new0", "new1", "new2"}


async def _index_of(engine: AsyncEngine, store: VectorStore) -> IndexKind:
    async with engine.connect() as conn:
        return await store.index(conn)


async def test_another_store_on_the_same_database_sees_new_items(
    engine: AsyncEngine, store: VectorStore
) -> None:
    """Items written by another process (here, another store instance) are found, whatever
    each one searches with: the exact index catches up from the table, and writes always keep
    the database's own index."""
    v = unit_vectors(20)
    async with engine.begin() as conn:
        reader = VectorStore(DIM, index=None if await store.index(conn) == "exact" else "exact")
        await store.add(conn, items(v[:10]))
    async with engine.connect() as conn:
        assert (await reader.search(conn, v[2], k=1))[0].item_id == "m2"
    async with engine.begin() as conn:
        await store.add(conn, items(v[10:], prefix="late"))
        await store.delete(conn, ["m2"])
    async with engine.connect() as conn:
        assert (await reader.search(conn, v[15], k=1))[0].item_id == "late5"
        assert (await reader.search(conn, v[2], k=1))[0].item_id != "m2"


async def test_a_vector_of_another_dimension_is_rejected(
    engine: AsyncEngine, store: VectorStore
) -> None:
    async with engine.begin() as conn:
        with pytest.raises(DimensionError):
            await store.add(conn, [MemoryItem("x", "note", "x", np.ones(DIM + 1, np.float32))])
        with pytest.raises(DimensionError):
            await store.search(conn, np.ones(3, np.float32))


@pytest.fixture(scope="module")
def labelled() -> tuple[list[dict], list[dict], np.ndarray, np.ndarray]:
    """The labelled memory set (tests/data/memory) embedded once with the real model."""
    from nanocrab.memory import MiniLMEmbedder

    data = Path(__file__).parent / "data" / "memory"
    tasks = [json.loads(line) for line in (data / "tasks.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines()]
    model = MiniLMEmbedder()
    vectors = model.embed([f"{t['task']}. {t['summary']}" for t in tasks])
    return tasks, queries, vectors, model.embed([q["query"] for q in queries])


async def test_past_tasks_are_recalled_from_new_wording(
    engine: AsyncEngine, labelled: tuple[list[dict], list[dict], np.ndarray, np.ndarray]
) -> None:
    """recall@5 >= 0.8 on the labelled set (110 past tasks, 62 queries), on every backend."""
    tasks, queries, vectors, qvecs = labelled
    store = VectorStore(vectors.shape[1])
    async with engine.begin() as conn:
        await store.setup(conn)
        await store.add(conn, [
            MemoryItem(t["id"], "episode", t["task"], v) for t, v in zip(tasks, vectors, strict=True)
        ])  # fmt: skip
    recall = 0.0
    async with engine.connect() as conn:
        for q, qv in zip(queries, qvecs, strict=True):
            found = {h.item_id for h in await store.search(conn, qv, k=5)}
            recall += len(found & set(q["relevant"])) / len(q["relevant"])
    assert len(tasks) >= 100 and len(queries) >= 50
    assert recall / len(queries) >= 0.8


async def test_plain_rows_read_what_sqlalchemy_reads_and_fail_as_it_does(
    engine: AsyncEngine, store: VectorStore
) -> None:
    """The recall's one-trip reads (memory/sqlrows.py) give the rows, the column names and the
    errors that ``conn.execute`` gives, on every backend."""
    from sqlalchemy import Column, Integer, MetaData, Table, bindparam, literal, select
    from sqlalchemy.exc import DBAPIError

    from nanocrab.memory.sqlrows import plain_rows
    from nanocrab.memory.store import memory_vectors

    async with engine.begin() as conn:
        await store.add(conn, items(unit_vectors(5)))
    stmt = (
        select(memory_vectors.c.seq, memory_vectors.c.item_id, memory_vectors.c.vector,
               literal(7).label("seven"))
        .where(memory_vectors.c.seq > 1)
        .order_by(memory_vectors.c.seq)
        .limit(3)
    )  # fmt: skip
    async with engine.connect() as conn:
        expected = [tuple(r) for r in (await conn.execute(stmt)).all()]
        rows = await plain_rows(conn, stmt)
        assert [tuple(r) for r in rows] == expected and len(expected) == 3
        assert [r.item_id for r in rows] == [r[1] for r in expected]
        assert rows[0]._mapping["seven"] == 7 and bytes(rows[0].vector) == bytes(expected[0][2])
        missing = Table("no_such_table", MetaData(), Column("x", Integer))
        with pytest.raises(DBAPIError):
            await plain_rows(conn, select(missing.c.x))
        await conn.rollback()  # PostgreSQL: the failed statement ended the transaction
        # a statement built once with placeholders: each call reads with its own values
        after = select(memory_vectors.c.seq).where(memory_vectors.c.seq > bindparam("after"))
        after = after.order_by(memory_vectors.c.seq)
        for n in (0, 3, 1, 5):
            expected = [tuple(r) for r in (await conn.execute(after, {"after": n})).all()]
            got = [tuple(r) for r in await plain_rows(conn, after, {"after": n})]
            assert got == expected and len(got) == 5 - n


async def test_a_search_caught_up_beforehand_finds_what_one_without_finds(
    engine: AsyncEngine, store: VectorStore
) -> None:
    """``catch_up`` then ``nearest(caught_up=True)`` (how a search overlaps reading the index
    with embedding its query) sees items stored since the index last looked."""
    vectors = unit_vectors(40, seed=7)
    async with engine.begin() as conn:
        await store.add(conn, items(vectors[:20]))
    async with engine.connect() as conn:
        caught_up = await store.catch_up(conn)
        assert caught_up == (await store.index(conn) == "exact")
        ahead = await store.nearest(conn, vectors[3], k=5, caught_up=caught_up)
        assert ahead == await store.nearest(conn, vectors[3], k=5)
        assert ahead[0][0] == "m3"
    async with engine.begin() as conn:
        await store.add(conn, items(vectors[20:], prefix="n"))
    async with engine.connect() as conn:
        caught_up = await store.catch_up(conn)
        (best,) = await store.nearest(conn, vectors[25], k=1, caught_up=caught_up)
        assert best[0] == "n5"
