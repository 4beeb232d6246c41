"""The health watch after an activation: roll back when runs on the new version fail.

Pure: fed the switches and the ends of runs (with the version each run was pinned to), it says
when to roll back. A version is watched from its activation for ``window_s`` seconds of log
time; once at least ``min_runs`` runs pinned to it ended in that window and the share of them
that failed reaches ``threshold``, the verdict is a rollback to the version before it. A
version is rolled back at most once; runs on other versions never count.

Only failures a configuration can cause count (:func:`counts_against`): whoever submits tasks
can make runs fail on a guardrail or a budget at will, and those failures must not be able to
switch the configuration. Whether a verdict is carried out automatically is the reloader's
call: never when going back would change :data:`PERMISSION_FILES`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

PERMISSION_FILES = frozenset({"policy.yaml", "guardrails.yaml", "agents.yaml"})
"""Files that decide what runs may do (the policy's tiers, the guardrails chain, the tools and
models each agent has). A version changing one of them is never rolled back automatically:
going back could allow what the new version forbids (an operator's tightening undone by
runs an attacker made fail). Its failing runs raise an alert; a person rolls back."""

SUBMITTER_FAILURES = frozenset({"rejected", "guardrail", "budget"})
"""``run.failed`` kinds that do not count against a version: a refused task, a blocked input
or action, a spent budget — outcomes the submitter of the task chooses, not faults of the
configuration."""


def counts_against(kind: str) -> bool:
    """Whether a ``run.failed`` of ``kind`` counts as a failure of the run's version."""
    return kind not in SUBMITTER_FAILURES


def touches_permissions(changed: Iterable[str]) -> list[str]:
    """Those of ``changed`` (paths of a snapshot) in :data:`PERMISSION_FILES`, sorted."""
    return sorted(p for p in changed if p in PERMISSION_FILES)


@dataclass(frozen=True, kw_only=True)
class HealthOptions:
    """``threshold``: failure share (0-1] that triggers; ``min_runs``: ended runs needed before
    deciding; ``window_s``: how long after activation runs are watched."""

    threshold: float = 0.5
    min_runs: int = 3
    window_s: float = 300.0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Roll ``from_version`` back to ``to_version``."""

    from_version: str
    to_version: str
    runs: int
    failed: int
    reason: str


@dataclass
class _Watched:
    version: str
    previous: str
    since: datetime
    runs: int = 0
    failed: int = 0


@dataclass
class HealthWatch:
    options: HealthOptions = field(default_factory=HealthOptions)
    watched: _Watched | None = None
    rolled_back: set[str] = field(default_factory=set)

    def activated(self, version: str, previous: str, at: datetime) -> None:
        """A switch to ``version`` (from ``previous``) at log time ``at``; a rollback to a
        version is not watched (there is nothing safer to go back to automatically)."""
        self.watched = _Watched(version, previous, at) if version else None

    def rolled(self, from_version: str) -> None:
        self.rolled_back.add(from_version)
        self.watched = None

    def ended(self, version: str, failed: bool, at: datetime) -> Verdict | None:
        """A run pinned to ``version`` ended at ``at`` (``failed``: ``run.failed``)."""
        w = self.watched
        if w is None or version != w.version or version in self.rolled_back:
            return None
        if at - w.since > timedelta(seconds=self.options.window_s):
            self.watched = None  # survived its window
            return None
        w.runs += 1
        w.failed += int(failed)
        if w.runs < self.options.min_runs or w.failed / w.runs < self.options.threshold:
            return None
        return Verdict(
            from_version=w.version, to_version=w.previous, runs=w.runs, failed=w.failed,
            reason=(
                f"{w.failed} of {w.runs} runs on version {w.version[:12]} failed within "
                f"{self.options.window_s:g} s of its activation (threshold "
                f"{self.options.threshold:.0%})"
            ),
        )  # fmt: skip
