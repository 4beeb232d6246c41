"""Branching a session from any event of it: find the fork point, describe the branch.

``nanocrab branch RUN_OR_SESSION --at EVENT_ID``, ``/branch EVENT_ID`` in ``nanocrab run`` and
``POST /v1/runs/{id}/branch`` all come here. The answer is a :class:`SessionBranched` for a new
session, not yet appended (the caller appends it as its own identity, then submits tasks on the
branch). Nothing of the parent is copied: the LLM handler's history builder reads the parent's
history up to the fork event, then the branch's own (``handlers/branches.py``).

What can be forked at: any durable event of a top-level or child run, named by its whole id, or
a unique prefix or suffix of it (at least :data:`MIN_SHORT` characters). A session is searched
through its runs (the ``task.submitted`` events naming it), newest first.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.errors import NotFoundError

from nanocrab.bus import EventLog, Stored, read, read_run
from nanocrab.bus.subjects import sanitize_token
from nanocrab.events import EventDecodeError, SessionBranched, TaskSubmitted, new_event_id

MIN_SHORT = 6
"""Shortest prefix or suffix of an event id accepted."""


class BranchError(Exception):
    """The fork point cannot be found: the message says what was not found and what to do."""


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """An event of a run, where it is in the log, and the session the run belongs to."""

    run_id: str
    session_id: str | None
    stored: Stored

    def branch(self, *, by: str = "", source: str = "cli", session_id: str = "") -> SessionBranched:
        """A new session forking here (``session_id``: its id, a new one when empty)."""
        event = self.stored.event
        assert event is not None
        return SessionBranched(
            parent_run_id=self.run_id,
            parent_session_id=self.session_id,
            at_event_id=event.id,
            at_seq=self.stored.seq,
            at_type=event.type,
            by=by,
            session_id=session_id or new_event_id(),
            tenant=event.tenant,
            correlation_id=self.run_id,
            causation_id=event.id,
            source=source,
        )


def _matches(event_id: str, given: str) -> bool:
    g = given.strip().upper()
    e = event_id.upper()
    return e == g or (len(g) >= MIN_SHORT and (e.startswith(g) or e.endswith(g)))


def find_in_run(run_id: str, events: list[Stored], at: str) -> ForkPoint | None:
    """The event ``at`` among run ``run_id``'s ``events`` (``None``: not there); raises
    :class:`BranchError` when ``at`` is part of several of their ids."""
    found = [s for s in events if s.event is not None and _matches(s.event.id, at)]
    exact = [s for s in found if s.event is not None and s.event.id == at]
    found = exact or found
    if len(found) > 1:
        raise BranchError(
            f"event id {at!r} is ambiguous in run {run_id}: it matches "
            + ", ".join(s.event.id for s in found[:5] if s.event is not None)
            + "; give more characters"
        )
    if not found:
        return None
    task = next((s.event for s in events if isinstance(s.event, TaskSubmitted)), None)
    return ForkPoint(run_id, task.session_id if task is not None else None, found[0])


async def fork_in_run(log: EventLog, run_id: str, at: str) -> ForkPoint:
    """The event ``at`` of run ``run_id``; :class:`BranchError` when the run has none."""
    events = await read_run(log, run_id)
    if not events:
        raise BranchError(f"no run {run_id!r}: it has no events on the log")
    point = find_in_run(run_id, events, at)
    if point is None:
        raise BranchError(
            f"run {run_id} has no event {at!r}: list its events with `nanocrab replay {run_id}`"
        )
    return point


async def session_runs(log: EventLog, session_id: str) -> list[str]:
    """The runs whose task names session ``session_id``, oldest first."""
    return (await runs_of_sessions(log, {session_id})).get(session_id, [])


async def runs_of_sessions(
    log: EventLog, sessions: set[str], *, tenant: str = "*"
) -> dict[str, list[str]]:
    """The runs of each of ``sessions`` (top-level tasks naming it), oldest first: one pass
    over the log's ``task.submitted`` events."""
    found: dict[str, list[str]] = {}
    async for s in read(log, log.subjects.of_type("task.submitted", tenant=tenant)):
        e = s.event
        if isinstance(e, TaskSubmitted) and e.session_id in sessions and e.run_id:
            runs = found.setdefault(e.session_id, [])
            if e.run_id not in runs:
                runs.append(e.run_id)
    return found


async def fork_point(log: EventLog, target: str, at: str) -> ForkPoint:
    """The event ``at`` of ``target``: a run id, else a session id (its runs, newest first).

    Raises :class:`BranchError` when ``target`` names neither, or none of its runs holds ``at``.
    """
    if await log.last_seq(log.subjects.run(target)):
        return await fork_in_run(log, target, at)
    runs = await session_runs(log, target)
    if not runs:
        raise BranchError(f"{target!r} is neither a run nor a session with runs on the log")
    for run_id in reversed(runs):
        point = find_in_run(run_id, await read_run(log, run_id), at)
        if point is not None:
            return point
    raise BranchError(
        f"no event {at!r} in session {target} ({len(runs)} run(s)): "
        "list a run's events with `nanocrab replay RUN_ID`"
    )


async def branches_of(
    log: EventLog, run_ids: set[str] | None = None, *, tenant: str = "*"
) -> list[SessionBranched]:
    """Every ``session.branched`` on the log (forked from one of ``run_ids`` when given), in
    log order: the edges of the session tree (``nanocrab replay``, the web view)."""
    out: list[SessionBranched] = []
    async for s in read(log, log.subjects.of_type("session.branched", tenant=tenant)):
        e = s.event
        if isinstance(e, SessionBranched) and (run_ids is None or e.parent_run_id in run_ids):
            out.append(e)
    return out


async def origin_of(
    log: EventLog, session_id: str, *, tenant: str = "*"
) -> tuple[int, SessionBranched] | None:
    """The first ``session.branched`` of ``session_id`` (of ``tenant``; ``*``: any) and its
    sequence, if it is a branch (one direct get: the first message on that subject)."""
    t = tenant if tenant == "*" else sanitize_token(tenant)
    scope = f"{log.cfg.root}.{t}.session.{sanitize_token(session_id)}.session.branched"
    try:
        msg = await log.js.get_msg(
            log.cfg.log_stream, seq=1, subject=scope, next=True, direct=log.direct
        )
    except NotFoundError:
        return None
    seq = int(msg.seq or 0)
    try:
        event = log.decode(msg.data or b"", subject=msg.subject or "")
    except EventDecodeError:
        return None  # a forged or broken record opens no branch
    return (seq, event) if isinstance(event, SessionBranched) else None


@dataclass(frozen=True, slots=True)
class Branch:
    """A session forked from a run, and the runs of that session so far."""

    branched: SessionBranched
    runs: list[str]


@dataclass(frozen=True, slots=True)
class RunTree:
    """Where a run sits in the session tree: ``lineage``, the forks that led to its session
    (oldest first; empty when its session is no branch), and the ``branches`` forked from it."""

    lineage: list[SessionBranched]
    branches: list[Branch]

    @property
    def empty(self) -> bool:
        return not self.lineage and not self.branches


MAX_DEPTH = 64
"""Forks followed up a lineage at most (a guard, not a limit anyone should reach)."""


async def run_tree(
    log: EventLog, run_id: str, session_id: str | None, *, tenant: str = "*"
) -> RunTree:
    """The lineage of ``session_id`` (the run's session) and the branches of ``run_id``."""
    lineage: list[SessionBranched] = []
    current = session_id
    while current and len(lineage) < MAX_DEPTH:
        found = await origin_of(log, current)
        if found is None or (tenant != "*" and found[1].tenant != tenant):
            break
        lineage.insert(0, found[1])
        current = found[1].parent_session_id
    forks = await branches_of(log, {run_id}, tenant=tenant)
    runs = await runs_of_sessions(
        log, {b.session_id for b in forks if b.session_id}, tenant=tenant
    ) if forks else {}  # fmt: skip
    return RunTree(lineage, [Branch(b, runs.get(b.session_id or "", [])) for b in forks])


def fork_json(b: SessionBranched) -> dict[str, object]:
    """One fork as the gateway answers it."""
    return {
        "session_id": b.session_id, "parent_session_id": b.parent_session_id,
        "parent_run_id": b.parent_run_id, "at_event_id": b.at_event_id, "at_seq": b.at_seq,
        "at_type": b.at_type, "by": b.by, "time": b.time.isoformat(),
    }  # fmt: skip


def tree_json(tree: RunTree) -> dict[str, object]:
    """The tree as the gateway answers it (``GET /v1/runs/{id}/tree``)."""
    return {
        "lineage": [fork_json(b) for b in tree.lineage],
        "branches": [{**fork_json(b.branched), "runs": b.runs} for b in tree.branches],
    }
