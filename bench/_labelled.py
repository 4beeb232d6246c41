"""Writing a labelled evaluation set built from a benchmark's own texts (``bench/*_set.py``).

No import of nanocrab: the generators run in environments of their own (AgentDojo's, Faker's).
"""

from __future__ import annotations

import json
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def read_from_clone(repo: Path, path: str) -> str:
    """``path`` of a benchmark's repository: from its work tree, else (a bare clone) from
    ``HEAD`` with ``git show``."""
    if (repo / path).exists():
        return (repo / path).read_text(encoding="utf-8")
    return subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip


def write_jsonl(out: Path, rows: list[Row]) -> None:
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def finish(rows: list[Row], out: Path, prefix: str, *, width: int, key: Callable[[Row], str],
           numbered: bool = True, checkpoint: str = "tool_output") -> None:  # fmt: skip
    """Give each row an id (``prefix`` + its index), a checkpoint (unless it has one) and a
    split — ``prefix + "a"`` (may be looked at) or ``prefix + "b"`` (never looked at item by
    item) by a stable hash of ``key(row)``, with its ordinal among rows of the same key when
    ``numbered`` (not the text: some tools stamp results with the time they ran) — then write
    ``out`` and say how many attacks and benign rows it holds."""
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        row["id"] = f"{prefix}{i:0{width}d}"
        row.setdefault("checkpoint", checkpoint)
        k = key(row)
        if numbered:
            seen[k] = seen.get(k, -1) + 1
            k = f"{k}/{seen[k]}"
        row["split"] = prefix + ("a" if zlib.crc32(k.encode()) % 2 == 0 else "b")
    write_jsonl(out, rows)
    attacks = sum(r["label"] == "attack" for r in rows)
    print(f"wrote {out.name}: {attacks} attacks, {len(rows) - attacks} benign")
