"""Where a run may touch files: the task's workspace, or the host's default."""

from __future__ import annotations

import os
from pathlib import Path

from nanocrab.events import TaskSubmitted


def workspace_of(task: TaskSubmitted, default: Path) -> Path:
    """The real path of the run's workspace (symlinks resolved once, here)."""
    return Path(os.path.realpath(task.workspace or default))
