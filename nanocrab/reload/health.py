"""The health watch after an activation: roll back when runs on the new version fail.

Pure: fed the switches and the ends of runs (with the version each run was pinned to), it says
when to roll back. A version is watched from its activation for ``window_s`` seconds of log
time; once at least ``min_runs`` runs pinned to it ended in that window and the share of them
that failed reaches ``threshold``, the verdict is a rollback to the version before it. A
version is rolled back at most once; runs on other versions never count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta


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
