"""Tasks that cannot start are rejected where their publisher listens: on the task's run.

A ``task.submitted`` the orchestrator dead-letters — it does not decode (say ``schemaversion`` is
missing), it belongs on another subject than the one it was stored on, or its id is already the
id of another event — would leave its run with nothing after the task, and a client following
``<root>.*.run.<run_id>.>`` (docs/events.md §6) would wait forever. So the orchestrator consumes
its own dead letters, and answers each one about a task on a run subject with ``run.failed``
(kind ``rejected``, the dead letter's reason) on that run — unless the run has started already
(a broken copy of a task does not end a live run). The run id is then spent: a corrected task
needs a new one.
"""

from __future__ import annotations

import re

from nanocrab.bus import Subjects
from nanocrab.events import BusDeadLettered, BusMalformed, RunFailed
from nanocrab.handlers.runstate import RunState

DeadLetter = BusMalformed | BusDeadLettered

_WHERE = re.compile(r" at \S+\.py:\d+$")
"""The source location the runtime appends to a poison reason: noise for a task's publisher."""


class TaskRejected(Exception):
    """A ``task.submitted`` the orchestrator will not start. Raised from ``handle`` so the
    runtime dead-letters the task (with a log line), which :func:`reject` then answers on the
    task's run."""


def task_run(subjects: Subjects, record: DeadLetter) -> tuple[str, str] | None:
    """``(tenant, run id)`` tokens of the ``task.submitted`` subject ``record`` is about, or
    ``None`` when it is about something else (or a task without a run id, subject token ``-``).

    The tokens are what the publisher listens on; for the ids nanocrab documents (ULIDs) they
    are the ids themselves.
    """
    tokens = record.subject.split(".")
    if len(tokens) != 6:
        return None
    root, tenant, kind, run_id, family, name = tokens
    if (root, kind, family, name) != (subjects.root, "run", "task", "submitted") or run_id == "-":
        return None
    return tenant, run_id


def reject(state: RunState, record: DeadLetter, *, tenant: str) -> list[RunFailed]:
    """The answer to the dead-lettered task ``record`` on its run, whose state is ``state``:
    ``run.failed`` (kind ``rejected``) while the run has not started, else nothing."""
    if state.status != "new":
        return []
    reason = _WHERE.sub("", record.reason) if record.reason_kind == "poison" else record.reason
    return [
        RunFailed(
            kind="rejected",
            reason=f"the task was rejected ({record.reason_kind}): {reason}",
            run_id=state.run_id,
            task_id=state.run_id,
            tenant=tenant,
        )
    ]
