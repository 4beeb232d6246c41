"""The demo: a small broken project and the offline model's script for fixing it."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "script.yaml"
TASK = "The greeting in greet.py is wrong: make the tests pass, then tell me what you changed."


def make_workspace(target: Path) -> Path:
    """Copy the demo project into ``target`` (created) and return it."""
    shutil.copytree(HERE / "workspace", target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return target
