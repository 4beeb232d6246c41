"""The reloader: configuration versions proposed, validated, activated, watched, rolled back.

Identity ``reloader``. Its background loop watches the configuration directory (``watchfiles``,
debounced; :mod:`nanocrab.reload.snapshot` says which files count) and, when the snapshot there
differs from the active version, stores the snapshot in the object store (content-addressed:
``<version>/config.msgpack``) and appends ``reload.proposed`` (content hashes, the changed
paths, a unified diff). The event id derives from the version, its predecessor and the last
switch, so several reloaders watching the same directory propose a change once, and a version
saved again after a switch is proposed again. A version just rolled back is not proposed again
from the unchanged directory (that would undo the rollback): a person activates it, or edits.

Consumes:

* ``reload.proposed`` → validates the snapshot in isolation (:func:`nanocrab.reload.validate`:
  policy compile, guardrails, agents, every SKILL.md, each problem with file:line) →
  ``reload.rejected`` with the problems, or ``reload.activated``;
* ``reload.requested`` (``nanocrab config activate V | rollback``) → ``reload.activated``
  (reason ``manual``) / ``reload.rolled_back``, or ``reload.rejected`` naming why not;
* ``reload.activated`` / ``reload.rolled_back`` → the health watch follows the switches;
* ``run.started`` / ``run.completed`` / ``run.failed`` → which version each run is pinned to,
  and whether it failed (a kind the configuration can cause: not a guardrail's block, a budget
  or a refused task, which a submitter chooses): when the share of failed runs on a freshly
  activated version crosses the threshold within the window
  (:class:`~nanocrab.reload.health.HealthWatch`), ``reload.rolled_back`` (automatic) and an
  ``alert.raised`` — or only the alert when going back would change a file that decides what
  runs may do (``policy.yaml``, ``guardrails.yaml``, ``agents.yaml``): a person decides.

Every switch is appended with an expected last sequence on the switch subject filter, so two
decisions never both switch on the same state (the later one is dropped; a redelivery decides
again on the new state). Reactions derive their ids from their cause, so a redelivered event
never switches twice. The health counts live in memory: after a restart the watch starts over
from the next switch (run one reloader; two would split the runs between their counts).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import msgspec
import nats.errors

from nanocrab.bus import Delivery, EventLog, Expect, Reaction
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.bus.errors import TransientError
from nanocrab.bus.replay import read
from nanocrab.events import (
    AlertRaised,
    Event,
    ReloadActivated,
    ReloadProblem,
    ReloadProposed,
    ReloadRejected,
    ReloadRequested,
    ReloadRolledBack,
    RunCompleted,
    RunFailed,
    RunStarted,
    derive_event_id,
)
from nanocrab.reload import ConfigView, HealthWatch, Snapshot, collect, diff, validate
from nanocrab.reload.health import HealthOptions, counts_against, touches_permissions
from nanocrab.reload.snapshot import relevant
from nanocrab.reload.view import SNAPSHOT_NAME

log = logging.getLogger(__name__)

NAME = "reloader"
RUNS_KEPT = 4096
"""Runs whose pinned version the health watch remembers until they end."""


class Reloader:
    name = NAME
    consumes: tuple[type[Event], ...] = (
        ReloadProposed, ReloadRequested, ReloadActivated, ReloadRolledBack,
        RunStarted, RunCompleted, RunFailed,
    )  # fmt: skip

    def __init__(
        self,
        log_: EventLog,
        *,
        view: ConfigView,
        config_dir: Path,
        health: HealthOptions | None = None,
        debounce_ms: int = 1000,
        step_ms: int = 50,
        rescan_ms: int = 5000,
        watch: bool = True,
    ) -> None:
        """``config_dir``: the directory watched; ``watch=False`` proposes only through
        :meth:`propose_now` (tests, ``nanocrab config`` in-process). ``rescan_ms``: the
        directory is also compared this often without a file event (a change made while the
        watcher was starting, or one the platform's watcher missed)."""
        self.log = log_
        self.view = view
        self.config_dir = config_dir
        self.health = HealthWatch(health or HealthOptions())
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.watch = watch
        self.rescan_ms = rescan_ms
        self.startup = collect(config_dir) if config_dir.is_dir() else Snapshot()
        """The directory when the process loaded its start-up configuration (version ``""``)."""
        self.store = JetStreamArtifacts(log_)
        self.snapshots: dict[str, Snapshot] = {}
        self.runs: OrderedDict[str, str] = OrderedDict()
        self._held_back = ""  # the rolled-back version the directory still holds (logged once)
        self.watching = asyncio.Event()
        """Set once the watcher is up (tests and the bench edit files after it)."""

    # -- the watcher ------------------------------------------------------------------------

    async def background(self) -> None:
        """Watch the configuration directory; propose each new snapshot."""
        from watchfiles import awatch  # the Rust watcher: only in a process that reloads

        self.config_dir.mkdir(parents=True, exist_ok=True)
        await self.view.ready()  # the active version as the log has it (after a restart too)
        if not self.watch:
            return
        stop = asyncio.Event()
        watcher = awatch(
            self.config_dir, debounce=self.debounce_ms, step=self.step_ms, stop_event=stop,
            watch_filter=lambda _change, path: relevant(self.config_dir, path),
            rust_timeout=self.rescan_ms, yield_on_timeout=True,
        )  # fmt: skip
        try:
            self.watching.set()
            await self.propose_now()  # a change made while nothing watched
            async for _changes in watcher:  # changes, or an empty set every ``rescan_ms``
                await self.propose_now()
        except asyncio.CancelledError:
            await self.view.stop()  # the host is stopping: the view stops following too
            raise
        finally:
            stop.set()
            self.watching.clear()

    async def propose_now(self, *, force: bool = False) -> ReloadProposed | None:
        """Snapshot the directory and propose it unless it is the active version (or, before
        any activation, the directory the start-up configuration came from; ``force``
        proposes that one too, giving it a version)."""
        snapshot = await asyncio.to_thread(collect, self.config_dir)
        active = self.view.active
        unchanged = not active and snapshot == self.startup and not force
        if snapshot.version == active or unchanged:
            return None
        last = self.view.switches[-1] if self.view.switches else None
        if (
            last is not None
            and isinstance(last.event, ReloadRolledBack)
            and last.event.from_version == snapshot.version
            and not force
        ):  # the files still hold what was just rolled back: a person activates it again
            if self._held_back != snapshot.version:
                self._held_back = snapshot.version
                log.warning(
                    "reloader: the directory still holds version %s, rolled back at stream "
                    "sequence %d; not proposing it again (edit the files, or `nanocrab config "
                    "activate %s`)", snapshot.version[:12], last.seq, snapshot.version[:12],
                )  # fmt: skip
            return None
        previous = self.snapshots.get(active) or await self._snapshot_of(active)
        changed, text = diff(previous, snapshot)
        data = snapshot.encode()
        ref = await self.store.put(SNAPSHOT_NAME, data, media_type="application/msgpack",
                                   preview=", ".join(changed)[:200])  # fmt: skip
        self.snapshots[snapshot.version] = snapshot
        event = ReloadProposed(
            id=derive_event_id(NAME, f"{active}:{snapshot.version}@{last.seq if last else 0}", 0),
            source=NAME,
            version=snapshot.version, previous=active, files=snapshot.manifest(),
            changed=changed, diff=text, snapshot=ref,
        )  # fmt: skip
        await self.log.append(event)
        log.info("reloader: proposed %s (%s)", snapshot.version[:12], ", ".join(changed))
        return event

    async def _snapshot_of(self, version: str) -> Snapshot:
        """A version's snapshot: ``""`` is the start-up directory as the view loaded it."""
        if version in self.snapshots:
            return self.snapshots[version]
        if not version:
            return self.startup
        root = self.view.get(version).root if version in self.view.versions else None
        if root is None:
            return Snapshot()
        snap = await asyncio.to_thread(collect, root)
        self.snapshots[version] = snap
        return snap

    # -- the reactor ------------------------------------------------------------------------

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction:
        match event:
            case ReloadProposed():
                return await self._proposed(event)
            case ReloadRequested():
                return await self._requested(event)
            case ReloadActivated():
                self.health.activated(event.version, event.previous, event.time)
            case ReloadRolledBack():
                self.health.rolled(event.from_version)
            case RunStarted():
                if event.run_id is not None:
                    self.runs[event.run_id] = event.config
                    while len(self.runs) > RUNS_KEPT:
                        self.runs.popitem(last=False)
            case RunCompleted() | RunFailed():
                return await self._ended(event)
        return []

    async def _guard(self) -> tuple[str, Expect]:
        """The version active now and the precondition of a switch decided on it: no other
        switch may land in between (the reloader decides on the newest state, so proposals
        arriving in a burst activate in turn instead of tripping over each other)."""
        seq, active = await self.view.latest()
        return active, Expect(seq, self.view.scope)

    async def _proposed(self, event: ReloadProposed) -> Reaction:
        active, guard = await self._guard()
        if event.version == active:
            return Reaction()
        snapshot = self.snapshots.get(event.version) or await self._fetch(event)
        problems = await asyncio.to_thread(validate, snapshot)
        if problems:
            for p in problems:
                log.warning("reloader: %s rejected: %s:%d: %s", event.version[:12], p.file,
                            p.line, p.message)  # fmt: skip
            return Reaction([ReloadRejected(version=event.version, problems=problems)])
        await asyncio.to_thread(self.view.remember, snapshot)
        activated = ReloadActivated(
            version=event.version, previous=active, reason="change", snapshot=event.snapshot
        )
        return Reaction([activated], expect=guard)

    async def _fetch(self, event: ReloadProposed) -> Snapshot:
        if event.snapshot is None:
            return Snapshot()
        try:
            snap = Snapshot.decode(await self.store.get(event.snapshot))
        except (nats.errors.Error, OSError, msgspec.DecodeError) as exc:
            raise TransientError(f"cannot fetch snapshot {event.version[:12]}: {exc!r}") from exc
        self.snapshots[event.version] = snap
        return snap

    async def _requested(self, event: ReloadRequested) -> Reaction:
        active, guard = await self._guard()
        if event.action == "rollback":
            current = self.view.switches[-1] if self.view.switches else None
            if current is None:
                return self._refuse(event, "nothing to roll back: no version was activated yet")
            back = (
                current.event.previous
                if isinstance(current.event, ReloadActivated)
                else _before(self.view, current.seq)
            )
            rolled = ReloadRolledBack(
                version=back, from_version=active, reason=f"manual rollback by {event.by or '?'}",
            )  # fmt: skip
            return Reaction([rolled], expect=guard)
        versions = await known_versions(self.log)
        matches = [v for v in versions if v.startswith(event.version)] if event.version else []
        if len(matches) != 1:
            why = "unknown" if not matches else f"ambiguous ({len(matches)} versions match)"
            return self._refuse(event, f"version {event.version!r} is {why}")
        version = matches[0]
        if version == active:
            return Reaction()
        proposal = versions[version]
        snapshot = self.snapshots.get(version) or await self._fetch(proposal)
        problems = await asyncio.to_thread(validate, snapshot)
        if problems:
            return Reaction([ReloadRejected(version=version, problems=problems)])
        await asyncio.to_thread(self.view.remember, snapshot)
        activated = ReloadActivated(
            version=version, previous=active, reason="manual", snapshot=proposal.snapshot
        )
        return Reaction([activated], expect=guard)

    def _refuse(self, event: ReloadRequested, why: str) -> Reaction:
        problem = ReloadProblem(file="-", message=why)
        return Reaction([ReloadRejected(version=event.version, problems=[problem])])

    async def _ended(self, event: RunCompleted | RunFailed) -> Reaction:
        if event.run_id is None or event.run_id not in self.runs:
            return Reaction()  # started before this reloader watched: not on a watched version
        version = self.runs.pop(event.run_id)
        failed = isinstance(event, RunFailed) and counts_against(event.kind)
        verdict = self.health.ended(version, failed, event.time)
        if verdict is None:
            return Reaction()
        active, guard = await self._guard()
        if active != verdict.from_version:
            return Reaction()  # switched away meanwhile: nothing of it to roll back
        changed, _ = diff(
            await self._snapshot_of(verdict.to_version),
            await self._snapshot_of(verdict.from_version),
        )
        held = touches_permissions(changed)
        if held:  # going back could allow what this version forbids: a person decides
            self.health.rolled(verdict.from_version)  # judged once, like a rollback
            log.error("reloader: not rolling back automatically (%s changed): %s",
                      ", ".join(held), verdict.reason)  # fmt: skip
            return Reaction([AlertRaised(
                severity="critical", origin="reload",
                summary=f"configuration {verdict.from_version[:12]}: {verdict.reason}; not "
                f"rolled back automatically, since it changes {', '.join(held)} and going "
                "back could allow what it forbids: `nanocrab config rollback` to go back",
            )])  # fmt: skip
        log.error("reloader: rolling back: %s", verdict.reason)
        return Reaction(
            [
                ReloadRolledBack(
                    version=verdict.to_version, from_version=verdict.from_version,
                    reason=verdict.reason, automatic=True, runs=verdict.runs,
                    failed=verdict.failed,
                ),
                AlertRaised(
                    severity="critical", origin="reload",
                    summary=f"configuration {verdict.from_version[:12]} rolled back to "
                    f"{verdict.to_version[:12] or 'the start-up configuration'}: "
                    f"{verdict.reason}",
                ),
            ],
            expect=guard,
        )  # fmt: skip


def _before(view: ConfigView, seq: int) -> str:
    """What was active before the version the switch at ``seq`` went back to: the
    ``previous`` of that version's latest activation (``""``: the start-up configuration)."""
    target = next(s.version for s in view.switches if s.seq == seq)
    for s in reversed(view.switches):
        if s.seq < seq and isinstance(s.event, ReloadActivated) and s.version == target:
            return s.event.previous
    return ""


async def known_versions(log_: EventLog) -> dict[str, ReloadProposed]:
    """Every proposed version of the log (one pass over ``reload.proposed``), newest last."""
    out: dict[str, ReloadProposed] = {}
    async for stored in read(log_, log_.subjects.of_type("reload.proposed")):
        if isinstance(stored.event, ReloadProposed):
            out.pop(stored.event.version, None)
            out[stored.event.version] = stored.event
    return out
