"""Keeps one projection up to date from the log, exactly once.

Each batch is applied in one transaction that also moves the projection's checkpoint (the last
applied stream sequence) forward; anything at or below the checkpoint is skipped. A crash
mid-batch rolls the whole batch back and the projector resumes from the checkpoint. Delivery is
an ordered push consumer (fast; ~7x a durable pull here) that is re-created from the checkpoint
after a server restart, so no handler consumer is involved and nothing server-side needs to
survive.

A batch that cannot be applied raises :class:`ProjectionFailed`, which is also recorded in
``projection_failures`` (``nanocrab status`` shows it with the lag) and logged; while following
the log the projector retries from its checkpoint with backoff, so it never stops silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import cast

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from sqlalchemy import Table, delete, insert, inspect, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import BusError, EventLog, Stored
from nanocrab.bus.connection import reconnects_of
from nanocrab.events import Event, EventDecodeError
from nanocrab.projections import _reader
from nanocrab.projections.base import Projection, ProjectionFailed, SparseProjection
from nanocrab.projections.db import checkpoints, failures, metadata
from nanocrab.projections.feed import Batcher, SharedFeed, follow
from nanocrab.projections.spec import BusSpec

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
"""Called with (applied so far, total to apply) during catch-up and rebuild."""

_PIPE_READ_BYTES = 4 * 1024 * 1024  # a frame of a catch-up batch in a few reads, not dozens

_RESUBSCRIBE_ERRORS = (
    nats.errors.Error,
    nats.js.errors.Error,
    OSError,
    TimeoutError,
)


class Projector:
    def __init__(
        self,
        log_: EventLog,
        engine: AsyncEngine,
        projection: Projection,
        *,
        batch_size: int = 1000,
        catch_up_batch_size: int = 5000,
        idle_flush_s: float = 0.005,
        commit_interval_s: float = 0.05,
        stall_s: float = 6.0,
        reader_process_min: int = 20_000,
        retry_s: float = 1.0,
        retry_max_s: float = 30.0,
        feed: SharedFeed | None = None,
    ) -> None:
        """``retry_s`` is the first pause after a failed batch while following the log; it
        doubles per failure up to ``retry_max_s``. While following, a projector commits at most
        once per ``commit_interval_s``: an event that comes after a quiet spell is applied at
        once, those that follow within the interval wait for it and go in one transaction.
        ``feed``: follow the log through this subscription shared with the process's other
        projectors (``feed.py``) instead of one of its own."""
        self.log = log_
        self.engine = engine
        self.projection = projection
        self.batch_size = batch_size
        self.catch_up_batch_size = catch_up_batch_size
        self.idle_flush_s = idle_flush_s
        self.commit_interval_s = commit_interval_s
        self.stall_s = stall_s
        self.reader_process_min = reader_process_min
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.feed = feed
        self.failure: ProjectionFailed | None = None  # the last batch failed with this
        self.position = 0
        self._lazy_seq = 0  # a position not yet written (only ignored events since)
        self._flushed_at = 0.0
        self._committed_at = 0.0
        self._stopping = asyncio.Event()
        self._queue: Batcher | None = None
        self._ready = False

    @property
    def name(self) -> str:
        return self.projection.name

    async def setup(self) -> None:
        """Create the projection's tables and the shared ones if missing.

        When one of its tables is missing or has other columns than this version defines (an
        upgrade changed them), all of them are dropped with the checkpoint: the projection is
        rebuilt from the log, as read models are disposable.
        """
        own = list(self.projection.tables)
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.create_all, tables=[checkpoints, failures])
            outdated = await conn.run_sync(_outdated, own)
            if outdated is not None:
                if await _read_checkpoint(conn, self.name):
                    log.warning("projection %s: %s; rebuilding it from the log", self.name,
                                outdated)  # fmt: skip
                await conn.run_sync(metadata.drop_all, tables=own)
                await conn.execute(delete(checkpoints).where(checkpoints.c.name == self.name))
                await conn.run_sync(metadata.create_all, tables=own)
        self.position = await self.checkpoint()
        self._flushed_at = time.monotonic()
        self._ready = True

    async def checkpoint(self) -> int:
        async with self.engine.connect() as conn:
            return await _read_checkpoint(conn, self.name)

    async def apply_batch(self, batch: Sequence[Stored]) -> int:
        """Apply what is new in ``batch`` and advance the checkpoint, in one transaction."""
        relevant = getattr(self.projection, "relevant", None)
        if relevant is not None and batch and not any(relevant(s) for s in batch):
            self.position = max(self.position, batch[-1].seq)
            self._lazy_seq = self.position
            sparse = cast(SparseProjection, self.projection)  # it has ``relevant``: a sparse one
            if time.monotonic() - self._flushed_at >= sparse.lazy_checkpoint_s:
                await self.flush_checkpoint()
            return 0
        fresh = [s for s in batch if s.seq > self.position]
        if not fresh:
            return 0
        try:
            async with self.engine.begin() as conn:
                if not await _advance_checkpoint(conn, self.name, self.position, fresh[-1].seq):
                    # someone else advanced it (another instance, a rebuild), or it is the first
                    current = await _read_checkpoint(conn, self.name)
                    fresh = [s for s in batch if s.seq > current]
                    if not fresh:
                        self.position = current
                        return 0
                    await _write_checkpoint(conn, self.name, fresh[-1].seq, existed=current > 0)
                await self.projection.apply(conn, fresh)
                if self.failure is not None:
                    await conn.execute(delete(failures).where(failures.c.name == self.name))
        # whatever a projection's apply raises (a database error, a bug) stops it at this batch;
        # it is translated, recorded and re-raised, never swallowed
        except Exception as exc:
            await self._failed(exc)
            assert self.failure is not None
            raise self.failure from exc
        if self.failure is not None:
            log.warning("projection %s: applying again after %s", self.name, self.failure.reason)
            self.failure = None
        self.position = fresh[-1].seq
        self._lazy_seq, self._flushed_at = 0, time.monotonic()
        return len(fresh)

    async def flush_checkpoint(self) -> None:
        """Persist a position reached through ignored events only (see SparseProjection)."""
        seq, self._lazy_seq, self._flushed_at = self._lazy_seq, 0, time.monotonic()
        if not seq:
            return
        try:
            async with self.engine.begin() as conn:
                current = await _read_checkpoint(conn, self.name)
                if seq > current:
                    await _write_checkpoint(conn, self.name, seq, existed=current > 0)
        except SQLAlchemyError as exc:
            self._lazy_seq = max(self._lazy_seq, seq)  # still to be written
            await self._failed(exc)
            assert self.failure is not None
            raise self.failure from exc

    async def behind(self) -> int:
        """How many events matching this projection's filter it has not applied yet."""
        position = await self.checkpoint()
        stream = self.log.cfg.log_stream
        info = await self.log.js.add_consumer(
            stream,
            config=ConsumerConfig(
                filter_subject=self.projection.subject_filter(self.log.subjects),
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=position + 1,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=5.0,
                mem_storage=True,
            ),
        )
        # not deleted: the server drops it after 5 s without a pull (an identity may delete
        # only its own durable, bus/permissions.py — a refused request is never answered)
        return int(info.num_pending or 0)

    def stop(self) -> None:
        self._stopping.set()
        if self._queue is not None:
            self._queue.wake()  # a waiting take returns now, not at its timeout

    async def run(self) -> None:
        """Follow the log until ``stop()``; survive server restarts by re-subscribing."""
        if not self._ready:
            await self.setup()
        reconnects = reconnects_of(self.log.nc)
        pause = self.retry_s
        while not self._stopping.is_set():
            try:
                await self._follow(reconnects.generation)
            except _RESUBSCRIBE_ERRORS as exc:
                if self._stopping.is_set():
                    break
                log.info("projector %s: re-subscribing after %r", self.name, exc)
                await asyncio.sleep(0.25)
            except ProjectionFailed as exc:
                cause = exc.__cause__ if exc.attempts == 1 else None
                log.error("%s; retrying in %.1fs", exc, pause, exc_info=cause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause)
                pause = min(pause * 2, self.retry_max_s)
                continue
            pause = self.retry_s
        with contextlib.suppress(Exception):
            await self.flush_checkpoint()

    async def catch_up(self, progress: Progress | None = None) -> int:
        """Apply everything up to the log's current end, then return the number applied.

        Reading and decoding the next batch overlaps with writing the previous one (the database
        driver works in its own thread). From ``reader_process_min`` events behind on, the
        reading (nats-py's delivery, as costly as the rest together) runs in a process of its
        own (``_reader.py``) on another core: that is what makes a rebuild fast. Should that
        process fail, the rest is read here.
        """
        if not self._ready:
            await self.setup()
        end = await self.log.stream_last_seq()
        start = self.position
        total = max(0, end - start)
        if total == 0:
            if progress:
                progress(0, 0)
            return 0
        applied = 0
        Batches = asyncio.Queue[list[Stored] | None]

        async def pipeline(read: Callable[[Batches], Awaitable[None]]) -> None:
            batches: Batches = asyncio.Queue(maxsize=2)  # its own: a failed one leaves nothing

            async def reader() -> None:
                try:
                    await read(batches)
                finally:
                    await batches.put(None)

            async def writer() -> None:
                nonlocal applied
                while (batch := await batches.get()) is not None:
                    applied += await self.apply_batch(batch)
                    if progress:
                        progress(min(batch[-1].seq, end) - start, total)

            tasks = [asyncio.create_task(reader()), asyncio.create_task(writer())]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        with _old_objects_frozen():
            if total >= self.reader_process_min:
                try:
                    await pipeline(lambda batches: self._read_in_process(end, batches))
                except _ReaderFailed as exc:
                    log.warning("projection %s: the reader process failed (%s); reading here",
                                self.name, exc)  # fmt: skip
            if self.position < end:
                await pipeline(lambda batches: self._read_here(end, batches))
        await self.flush_checkpoint()
        if progress:
            progress(total, total)
        return applied

    async def _read_here(self, end: int, batches: asyncio.Queue[list[Stored] | None]) -> None:
        """Deliver what follows the checkpoint up to ``end`` on this connection."""
        # throughput over latency: big batches, fewer round trips to the database thread
        queue, sub = await self._subscribe(idle_flush_s=0.25, size=self.catch_up_batch_size)
        try:
            info = await sub.consumer_info()
            assert info.delivered is not None  # the server always reports it
            if not info.num_pending and not info.delivered.consumer_seq and not queue.buf:
                return  # nothing after the checkpoint matches this projection
            while True:
                msgs = await queue.take(self.stall_s)
                if msgs is None:
                    # nothing within stall_s: the rest of the log does not match the filter
                    if await self._pending(sub) == 0:
                        return
                    continue
                await batches.put([s for s, _ in msgs])
                last, pending = msgs[-1]
                if last.seq >= end or pending == 0:
                    return
        finally:
            with contextlib.suppress(*_RESUBSCRIBE_ERRORS):
                await sub.unsubscribe()

    async def _read_in_process(self, end: int, batches: asyncio.Queue[list[Stored] | None]) -> None:
        """Deliver what follows the checkpoint up to ``end`` through ``_reader.py``."""
        try:
            spec = BusSpec.of(self.log, "projector")
        except BusError as exc:
            raise _ReaderFailed(str(exc)) from exc
        request = {
            "url": spec.url, "seed": spec.seed, "stream": self.log.cfg.log_stream,
            "filter": self.projection.subject_filter(self.log.subjects),
            "start_seq": self.position + 1, "end_seq": end,
            "batch_size": self.catch_up_batch_size, "stall_s": self.stall_s,
        }  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", _reader.__file__,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=_PIPE_READ_BYTES,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        errors = asyncio.create_task(proc.stderr.read())
        frames = msgspec.msgpack.Decoder(list[tuple[int, int, str, bytes]])
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
            while True:
                try:
                    head = await proc.stdout.readexactly(4)
                    chunk = frames.decode(await proc.stdout.readexactly(int.from_bytes(head)))
                except (asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
                    await proc.wait()
                    reason = (await errors).decode(errors="replace").strip()
                    raise _ReaderFailed(reason or f"exit status {proc.returncode}") from exc
                if not chunk:
                    await asyncio.wait_for(proc.wait(), 5.0)  # it ends right after the last frame
                    return
                await batches.put([self._stored(*m) for m in chunk])
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            errors.cancel()

    def _stored(self, seq: int, stored_ns: int, subject: str, data: bytes) -> Stored:
        """As ``bus.replay.to_stored`` for a message the reader process delivered."""
        try:
            event: Event | None = self.log.decode(data, subject=subject)
            error = None
        except EventDecodeError as exc:
            event, error = None, exc
        raw = data if error else b""
        return Stored(seq=seq, subject=subject, stored_ns=stored_ns, event=event, error=error,
                      raw=raw)  # fmt: skip

    async def rebuild(self, progress: Progress | None = None) -> int:
        """Drop the projection's rows and checkpoint, then replay the whole log into it."""
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.drop_all, tables=list(self.projection.tables))
            await conn.run_sync(metadata.create_all, tables=[checkpoints, failures])
            await conn.execute(delete(checkpoints).where(checkpoints.c.name == self.name))
            await conn.execute(delete(failures).where(failures.c.name == self.name))
        self._ready = False
        await self.setup()
        return await self.catch_up(progress)

    async def _subscribe(
        self, *, idle_flush_s: float | None = None, size: int | None = None
    ) -> tuple[Batcher, JetStreamContext.PushSubscription]:
        batcher = Batcher(size or self.batch_size, idle_flush_s or self.idle_flush_s, self.log)
        subject = self.projection.subject_filter(self.log.subjects)
        return batcher, await follow(self.log, subject, self.position + 1, batcher.put)

    @staticmethod
    async def _pending(sub: JetStreamContext.PushSubscription) -> int:
        info = await sub.consumer_info()
        return int(info.num_pending or 0)

    async def _failed(self, exc: Exception) -> None:
        """Remember and record (in a transaction of its own) that the batch after ``position``
        failed with ``exc``. A database that cannot take the record is logged, not raised: the
        failure itself is what the caller raises."""
        reason = _reason(exc)
        before = self.failure
        again = before is not None and before.position == self.position
        attempts = before.attempts + 1 if before is not None and again else 1
        self.failure = ProjectionFailed(self.name, self.position, reason, attempts=attempts)
        now = datetime.now(UTC)
        try:
            async with self.engine.begin() as conn:
                await conn.run_sync(metadata.create_all, tables=[failures])
                query = select(failures).where(failures.c.name == self.name)
                row = (await conn.execute(query)).mappings().first()
                same = row is not None and row["position"] == self.position
                await conn.execute(delete(failures).where(failures.c.name == self.name))
                await conn.execute(
                    insert(failures).values(
                        name=self.name, position=self.position, error=reason,
                        attempts=row["attempts"] + 1 if row is not None and same else 1,
                        since=row["since"] if row is not None and same else now, updated_at=now,
                    )
                )  # fmt: skip
        except SQLAlchemyError as record_exc:
            log.error("projection %s: could not record its failure: %s", self.name, record_exc)

    async def _follow(self, generation: int) -> None:
        reconnects = reconnects_of(self.log.nc)
        sub: JetStreamContext.PushSubscription | None = None
        if self.feed is not None:
            queue = Batcher(self.batch_size, self.idle_flush_s)
            subject = self.projection.subject_filter(self.log.subjects)
            await self.feed.attach(self, subject, self.position + 1, queue)
        else:
            queue, sub = await self._subscribe()
        self._queue = queue
        try:
            gather_s = float(getattr(self.projection, "gather_s", 0.0))
            while not self._stopping.is_set() and reconnects.generation == generation:
                batch = await queue.take(0.5)
                if batch:
                    # live events arrive one by one: gather those of a burst into one
                    # transaction (a sparse read model gathers for longer)
                    since = time.monotonic() - self._committed_at
                    pause = max(gather_s, self.commit_interval_s - since)
                    if pause > 0 and not self._stopping.is_set():
                        # cut short by stop(): a stopping host does not wait out the interval
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stopping.wait(), pause)
                    while queue.buf and len(batch) < self.catch_up_batch_size:
                        batch += await queue.take(0) or []
                    await self.apply_batch([s for s, _ in batch])
                    self._committed_at = time.monotonic()
                else:
                    if self.feed is not None:
                        await self.feed.ensure()
                    if self._lazy_seq:
                        # idle: write the position reached through ignored events, so the lag
                        # that `status` computes from the checkpoint is the real one
                        await self.flush_checkpoint()
        finally:
            self._queue = None
            if sub is not None:
                with contextlib.suppress(*_RESUBSCRIBE_ERRORS):
                    await sub.unsubscribe()
            elif self.feed is not None:
                await self.feed.detach(self)


def _reason(exc: Exception) -> str:
    """The error in a line or a few: a database error without its SQL statement and parameters
    (they can hold a whole batch)."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return f"{type(inner).__name__}: {inner}"[:2000]


def _outdated(conn: Connection, tables: Sequence[Table]) -> str | None:
    """Why ``tables`` as stored are not what this version defines (``None`` when they are)."""
    inspector = inspect(conn)
    stored = set(inspector.get_table_names())
    for t in tables:
        if t.name not in stored:
            return f"table {t.name} does not exist"
        columns = {c["name"] for c in inspector.get_columns(t.name)}
        if columns != set(t.c.keys()):
            return f"the columns of table {t.name} changed"
    return None


async def _read_checkpoint(conn: AsyncConnection, name: str) -> int:
    value = await conn.scalar(select(checkpoints.c.stream_seq).where(checkpoints.c.name == name))
    return int(value or 0)


async def _advance_checkpoint(conn: AsyncConnection, name: str, position: int, seq: int) -> bool:
    """Move the checkpoint to ``seq`` if it stands at or below ``position``, the first statement
    of the batch's transaction: on SQLite it takes the write lock, on PostgreSQL the row's, so
    no other writer applies the same events before this transaction ends. ``False``: it stands
    past ``position`` (someone else applied events after it) or there is none yet. One round
    trip to the database where reading it first took two."""
    result = await conn.execute(
        update(checkpoints)
        .where(checkpoints.c.name == name, checkpoints.c.stream_seq <= position)
        .values(stream_seq=seq, updated_at=datetime.now(UTC))
    )
    return bool(result.rowcount)


async def _write_checkpoint(conn: AsyncConnection, name: str, seq: int, *, existed: bool) -> None:
    now = datetime.now(UTC)
    if existed:
        result = await conn.execute(
            update(checkpoints)
            .where(checkpoints.c.name == name)
            .values(stream_seq=seq, updated_at=now)
        )
        if result.rowcount:
            return
    await conn.execute(insert(checkpoints).values(name=name, stream_seq=seq, updated_at=now))


@contextlib.contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """Keep the objects alive now (modules, SQLAlchemy, the SDKs) out of the collections a
    catch-up's many short-lived objects trigger: the full ones, which walk them all, cost a
    rebuild ~15 % of its CPU. Unfrozen after, unless something had frozen them before (as
    ``nanocrab up`` does for good)."""
    frozen = gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen:
            gc.unfreeze()


class _ReaderFailed(Exception):
    """The reader process ended without reading its range; the message says why."""
