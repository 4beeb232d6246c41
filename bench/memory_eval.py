"""Memory quality and speed: recall@5 of similar past tasks, embedding throughput, search p50.

- recall@5 on tests/data/memory (110 past agent tasks, 62 queries written in other words, each
  labelled with the past tasks it should recall): vector search alone, BM25 (SQLite FTS5) alone,
  and both fused (reciprocal rank fusion), so "does hybrid help" is measured, not assumed;
- embedding throughput of all-MiniLM-L6-v2 (onnxruntime by default, ``--backend numpy`` for the
  fallback): batched texts/s, and one short text at a time (p50), uncached;
- run-start recall (what a run's first model call waits for, ``projections/memory_search.py``
  ``recaller``): p50 with no episode (one query, no embedding), and over the labelled episodes
  for a new text and a repeated (cached) one; the lazy vectorising rate of the memory projection's
  rows (items/s, one text per call);
- search p50 (a whole ``VectorStore.search``: index query plus fetching the hits' rows) with
  10k and 100k memories, for each index: sqlite-vec and exact on SQLite, exact on PostgreSQL
  (when reachable; pgvector when installed). The bulk memories are real task embeddings mixed
  with noise: brute-force search time does not depend on the data, only on its size.

Usage: python bench/memory_eval.py [--sizes 10000,100000] [--pg URL | --no-pg] [--skip-search]
                                   [--backend auto|onnx|numpy]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import machine, pct

from nanocrab.memory import CachedEmbedder, MemoryItem, MiniLMEmbedder, VectorStore
from nanocrab.projections import make_engine
from nanocrab.projections.memory import MemoryProjection, memory_items
from nanocrab.projections.memory_search import recaller, vectorise

DATA = Path(__file__).parent.parent / "tests" / "data" / "memory"
K = 5


def load() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    def read(name: str) -> list[dict[str, object]]:
        return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line]

    return read("tasks.jsonl"), read("queries.jsonl")


def memory_text(task: dict[str, object]) -> str:
    """What an episode's memory holds: the task and the summary of what was done."""
    return f"{task['task']}. {task['summary']}"


def recall_at(ranked: list[list[str]], queries: list[dict[str, object]], k: int = K) -> float:
    total = 0.0
    for got, q in zip(ranked, queries, strict=True):
        relevant = set(q["relevant"])  # type: ignore[call-overload]
        total += len(relevant & set(got[:k])) / len(relevant)
    return total / len(queries)


def bm25_rankings(
    tasks: list[dict[str, object]], queries: list[dict[str, object]]
) -> list[list[str]]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(id UNINDEXED, body, tokenize='porter')")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(t["id"], memory_text(t)) for t in tasks])
    out = []
    for q in queries:
        words = [w for w in "".join(c if c.isalnum() else " " for c in str(q["query"])).split()]
        match = " OR ".join(f'"{w}"' for w in words)
        rows = db.execute(
            "SELECT id FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT 50", (match,)
        ).fetchall()
        out.append([r[0] for r in rows])
    return out


def fuse(a: list[list[str]], b: list[list[str]], c: int = 60) -> list[list[str]]:
    """Reciprocal rank fusion of two rankings per query."""
    fused = []
    for ra, rb in zip(a, b, strict=True):
        score: dict[str, float] = {}
        for ranking in (ra, rb):
            for rank, item in enumerate(ranking):
                score[item] = score.get(item, 0.0) + 1.0 / (c + rank + 1)
        fused.append(sorted(score, key=lambda i: -score[i]))
    return fused


async def quality(model: MiniLMEmbedder, tasks: list[dict[str, object]],
                  queries: list[dict[str, object]], tmp: Path) -> None:  # fmt: skip
    vectors = model.embed([memory_text(t) for t in tasks])
    qvecs = model.embed([str(q["query"]) for q in queries])
    engine = make_engine(f"sqlite+aiosqlite:///{tmp / 'quality.db'}")
    store = VectorStore(model.dim)
    async with engine.begin() as conn:
        index = await store.setup(conn)
        await store.add(conn, [
            MemoryItem(str(t["id"]), "episode", memory_text(t), v)
            for t, v in zip(tasks, vectors, strict=True)
        ])  # fmt: skip
    async with engine.connect() as conn:
        vector_ranked = [[h.item_id for h in await store.search(conn, q, k=50)] for q in qvecs]
    await engine.dispose()
    lexical = bm25_rankings(tasks, queries)
    hybrid = fuse(vector_ranked, lexical)
    top1 = sum(r[0] in q["relevant"] for r, q in zip(vector_ranked, queries, strict=True))  # type: ignore[operator]
    print(f"labelled set: {len(tasks)} past tasks, {len(queries)} queries ({DATA})")
    print(f"recall@5 vector ({index}): {recall_at(vector_ranked, queries):.3f}   "
          f"top-1 correct {top1}/{len(queries)}")  # fmt: skip
    print(f"recall@5 BM25 (FTS5):      {recall_at(lexical, queries):.3f}")
    print(f"recall@5 hybrid (RRF):     {recall_at(hybrid, queries):.3f}")
    row = {str(t["id"]): i for i, t in enumerate(tasks)}
    own, other = [], []
    for q, qv in zip(queries, qvecs, strict=True):
        relevant = [row[r] for r in q["relevant"]]  # type: ignore[attr-defined]
        sims = vectors @ qv
        own.append(float(sims[relevant].max()))
        other.append(float(np.delete(sims, relevant).max()))
    print(
        f"cosine of a query to its best relevant task: p50 {np.median(own):.3f} "
        f"(min {min(own):.3f}); to the best irrelevant one: p50 {np.median(other):.3f}"
    )


def throughput(model: MiniLMEmbedder, tasks: list[dict[str, object]],
               queries: list[dict[str, object]]) -> None:  # fmt: skip
    texts = [memory_text(t) for t in tasks] + [str(q["query"]) for q in queries]
    model.embed(texts[:8])  # warm up
    for batch in (texts, [f"{t} ({i})" for i in range(4) for t in texts]):
        t0 = time.perf_counter()
        model.embed(batch)
        took = time.perf_counter() - t0
        print(f"embed batched: {len(batch)} texts in {took:.2f}s = {len(batch) / took:.0f} texts/s")
    shorts = [str(q["query"]) for q in queries]
    batch = [f"{s} ({i})" for i in range(4) for s in shorts]
    t0 = time.perf_counter()
    model.embed(batch)
    took = time.perf_counter() - t0
    print(f"embed batched short texts: {len(batch)} in {took:.2f}s = {len(batch) / took:.0f} "
          f"texts/s = {took / len(batch) * 1e3:.2f} ms per text")  # fmt: skip
    times, cpu = [], []
    for text in shorts * 2:
        t0, c0 = time.perf_counter(), time.process_time()
        model.embed([text])
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    words = np.mean([len(s.split()) for s in shorts])
    print(f"embed one short text (~{words:.0f} words, uncached): p50 {pct(times, 50) * 1e3:.2f} ms "
          f"p90 {pct(times, 90) * 1e3:.2f} ms = {len(times) / sum(times):.0f} texts/s; "
          f"CPU time p50 {pct(cpu, 50) * 1e3:.2f} ms")  # fmt: skip


async def run_start_recall(model: MiniLMEmbedder, tasks: list[dict[str, object]],
                           queries: list[dict[str, object]], tmp: Path) -> None:  # fmt: skip
    from datetime import UTC, datetime

    engine = make_engine(f"sqlite+aiosqlite:///{tmp / 'recall.db'}")
    cached = CachedEmbedder(model)
    recall = recaller(engine, lambda: cached, k=3, min_score=0.6)

    async def timed(text: str, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            await recall(text, tenant="default")
            out.append(time.perf_counter() - t0)
        return out

    projection = MemoryProjection()
    async with engine.begin() as conn:
        for table in projection.tables:
            await conn.run_sync(table.create, checkfirst=True)
        await projection.store.setup(conn)
    empty = await timed("list the files", 50)
    print(f"run-start recall, no episode yet: p50 {pct(empty, 50) * 1e3:.2f} ms (one query, "
          f"no embedding, model not loaded)")  # fmt: skip
    now = datetime.now(UTC)
    async with engine.begin() as conn:
        await conn.execute(memory_items.insert(), [
            {"item_id": f"episode:{t['id']}", "seq": i + 1, "kind": "episode",
             "run_id": str(t["id"]), "session_id": "s", "text": memory_text(t),
             "outcome": "completed", "summary": "ok",
             "tools": "[]", "files": "[]", "time": now}
            for i, t in enumerate(tasks)
        ])  # fmt: skip
    t0 = time.perf_counter()
    done = await vectorise(engine, lambda: cached)
    took = time.perf_counter() - t0
    print(f"lazy vectorising of the projection's rows: {done} items in {took:.2f}s = "
          f"{done / took:.0f} items/s (one text per call)")  # fmt: skip
    fresh = []
    for q in queries:
        fresh += await timed(str(q["query"]), 1)
    again = await timed(str(queries[0]["query"]), 50)
    print(f"run-start recall over {done} episodes: new text p50 {pct(fresh, 50) * 1e3:.2f} ms "
          f"(embedding included); repeated text p50 {pct(again, 50) * 1e3:.2f} ms")  # fmt: skip
    # the usual case in a running system: the previous run's episode has no vector yet
    one_new = []
    for i, q in enumerate(queries[:20]):
        async with engine.begin() as conn:
            await conn.execute(memory_items.insert(), [{
                "item_id": f"episode:new-{i}", "seq": 10_000 + i, "kind": "episode",
                "run_id": f"new-{i}", "session_id": "s", "text": str(q["query"]),
                "outcome": "completed", "summary": "ok", "tools": "[]", "files": "[]",
                "time": now}])  # fmt: skip
        one_new += await timed(str(queries[0]["query"]), 1)
    print(f"run-start recall with one episode not vectorised yet (scored in memory, stored in "
          f"the background): p50 {pct(one_new, 50) * 1e3:.2f} ms")  # fmt: skip
    await engine.dispose()


async def search_speed(model: MiniLMEmbedder, tasks: list[dict[str, object]],
                       queries: list[dict[str, object]], sizes: list[int], pg: str | None,
                       tmp: Path) -> None:  # fmt: skip
    base = model.embed([memory_text(t) for t in tasks])
    qvecs = model.embed([str(q["query"]) for q in queries])
    rng = np.random.default_rng(0)
    targets: list[tuple[str, str, str | None]] = [
        ("sqlite", f"sqlite+aiosqlite:///{tmp / 'speed.db'}", None),
        ("sqlite", f"sqlite+aiosqlite:///{tmp / 'speed.db'}", "exact"),
    ]
    if pg:
        targets.append(("postgresql", pg, None))
    for size in sizes:
        mix = rng.integers(0, len(base), (size, 2))
        bulk = base[mix[:, 0]] + 0.5 * base[mix[:, 1]]
        bulk += 0.05 * rng.standard_normal(bulk.shape).astype(np.float32)
        bulk /= np.linalg.norm(bulk, axis=1, keepdims=True)
        loaded: set[str] = set()
        for backend, url, forced in targets:
            engine = make_engine(url)
            store = VectorStore(model.dim, index=forced)  # type: ignore[arg-type]
            async with engine.begin() as conn:
                index = await store.setup(conn)
                if url not in loaded:
                    await store.clear(conn)
            if url not in loaded:
                t0 = time.perf_counter()
                for i in range(0, size, 5000):
                    async with engine.begin() as conn:
                        await store.add(conn, [
                            MemoryItem(f"m{size}-{j}", "episode", f"memory {j}", bulk[j])
                            for j in range(i, min(size, i + 5000))
                        ])  # fmt: skip
                took = time.perf_counter() - t0
                print(f"[{size:>7,}] {backend}: stored {size:,} memories in {took:.1f}s "
                      f"= {size / took:,.0f}/s (index {index})")  # fmt: skip
                loaded.add(url)
            times, cpu = [], []
            async with engine.connect() as conn:
                t0 = time.perf_counter()
                await store.search(conn, qvecs[0], k=K)  # the exact index loads here
                first = time.perf_counter() - t0
                for q in list(qvecs) * 2:
                    t0, c0 = time.perf_counter(), time.process_time()
                    hits = await store.search(conn, q, k=K)
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                    assert len(hits) == K
            print(f"[{size:>7,}] {backend} {index:<10} search top-{K}: p50 "
                  f"{pct(times, 50) * 1e3:.1f} ms  p90 {pct(times, 90) * 1e3:.1f} ms  "
                  f"(first search {first * 1e3:.0f} ms; CPU time here p50 "
                  f"{pct(cpu, 50) * 1e3:.1f} ms)")  # fmt: skip
            await engine.dispose()


async def create_pg_db() -> tuple[str, str] | None:
    try:
        import asyncpg

        admin = await asyncpg.connect(host="127.0.0.1", user="postgres", database="postgres",
                                      timeout=2)  # fmt: skip
    except (TimeoutError, OSError, ImportError):
        return None
    name = f"nanocrab_bench_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}", name


async def drop_pg_db(name: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(host="127.0.0.1", user="postgres", database="postgres")
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def main(args: argparse.Namespace) -> None:
    print(f"machine: {machine()}; load {os.getloadavg()[0]:.2f}; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")  # fmt: skip
    t0 = time.perf_counter()
    model = MiniLMEmbedder(backend=args.backend)
    print(f"model {model.model_id} (dim {model.dim}, {model.backend}) loaded in "
          f"{time.perf_counter() - t0:.2f}s")  # fmt: skip
    tasks, queries = load()
    with tempfile.TemporaryDirectory(prefix="nanocrab-bench-memory-") as d:
        tmp = Path(d)
        await quality(model, tasks, queries, tmp)
        throughput(model, tasks, queries)
        await run_start_recall(model, tasks, queries, tmp)
        if args.skip_search:
            return
        sizes = [int(s) for s in args.sizes.split(",")]
        created = None if (args.no_pg or args.pg) else await create_pg_db()
        pg = args.pg or (created[0] if created else None)
        try:
            await search_speed(model, tasks, queries, sizes, pg, tmp)
        finally:
            if created:
                await drop_pg_db(created[1])
    print(f"load at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--pg", help="a PostgreSQL URL (default: a scratch database on localhost)")
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--backend", default="auto", choices=["auto", "onnx-int8", "onnx", "numpy"])
    asyncio.run(main(parser.parse_args()))
