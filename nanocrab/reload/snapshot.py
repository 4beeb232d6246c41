"""The configuration directory as one content-addressed snapshot.

What a snapshot holds, relative to the configuration directory: ``policy.yaml``,
``guardrails.yaml``, ``agents.yaml``, every regular, non-hidden file under ``skills/`` and
``prompts/``, and the modules of the Python agents ``agents.yaml`` declares (``module:``, when
the path is relative and stays inside the directory; docs/agents.md). Nothing else there (the
data dir's stores, keys, workspace) is configuration.

Its version is the sha256 of its canonical encoding (paths sorted, msgpack), so the same files
always give the same version on every machine, and the reloader's events derive their ids from
it (a second reloader proposing the same change is a duplicate).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from nanocrab.events import ConfigFile

CONFIG_FILES = ("policy.yaml", "guardrails.yaml", "agents.yaml")
"""Top-level files of the configuration directory a snapshot holds."""
CONFIG_DIRS = ("skills", "prompts")
"""Directories of the configuration directory a snapshot holds, recursively."""
MAX_FILE_BYTES = 1 << 20
"""A file larger than this is refused (it is a validation problem, not configuration)."""
MAX_DIFF_CHARS = 64 * 1024

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[tuple[str, bytes]])


@dataclass(frozen=True)
class Snapshot:
    """Files by relative POSIX path. ``version``: sha256 hex of :meth:`encode`."""

    files: dict[str, bytes] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _encoder.encode(sorted(self.files.items()))

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        return cls(dict(_decoder.decode(data)))

    @property
    def version(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    def manifest(self) -> list[ConfigFile]:
        return [
            ConfigFile(path=p, sha256=hashlib.sha256(b).hexdigest(), size=len(b))
            for p, b in sorted(self.files.items())
        ]

    def materialize(self, root: Path) -> Path:
        """Write the files under ``root`` (created; existing files are overwritten) and return
        it. A path that would leave ``root`` is skipped (a snapshot is data, never trusted)."""
        root.mkdir(parents=True, exist_ok=True)
        base = root.resolve()
        for rel, data in self.files.items():
            target = (root / rel).resolve()
            if not target.is_relative_to(base) or target == base:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return root


def watched(config_dir: Path) -> list[Path]:
    """What a watcher should watch: the directory itself (top-level files, and ``skills/`` or
    ``prompts/`` appearing) and those of :data:`CONFIG_DIRS` that exist."""
    return [config_dir, *(config_dir / d for d in CONFIG_DIRS if (config_dir / d).is_dir())]


def agent_modules(config_dir: Path) -> list[str]:
    """The Python agent modules ``config_dir/agents.yaml`` declares inside ``config_dir``, as
    relative POSIX paths (read leniently: a broken file declares none, validation says why)."""
    import yaml

    try:
        data = yaml.safe_load((config_dir / "agents.yaml").read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    agents = data.get("agents") if isinstance(data, dict) else None
    base = config_dir.resolve()
    out: list[str] = []
    for agent in agents if isinstance(agents, list) else ():
        module = agent.get("module") if isinstance(agent, dict) else None
        if not isinstance(module, str) or Path(module).is_absolute():
            continue
        target = (config_dir / module).resolve()
        if target.is_relative_to(base) and target != base:
            rel = target.relative_to(base).as_posix()
            if not any(p.startswith(".") for p in Path(rel).parts) and rel not in out:
                out.append(rel)
    return out


def relevant(config_dir: Path, path: str) -> bool:
    """Whether a changed ``path`` (absolute) can change the snapshot of ``config_dir``.

    Called for every change the watcher sees in the directory — the data files beside the
    configuration (``traces.jsonl``, the SQLite databases) change on every run — so a path
    whose first component under ``config_dir`` cannot be part of a snapshot is ruled out by
    its name alone, before resolving symbolic links (two ``realpath`` walks of the tree)."""
    first = _first_part(str(config_dir), path)
    if first is not None and not (
        first in CONFIG_DIRS or first in CONFIG_FILES or path.endswith(".py")
    ):
        return False
    try:
        rel = Path(path).resolve().relative_to(_resolved(config_dir))
    except ValueError:
        return False
    parts = rel.parts
    if not parts or any(p.startswith(".") for p in parts):
        return False
    if parts[0] in CONFIG_DIRS or (len(parts) == 1 and parts[0] in CONFIG_FILES):
        return True
    return rel.suffix == ".py" and rel.as_posix() in agent_modules(config_dir)


def _first_part(base: str, path: str) -> str | None:
    """The first component of ``path`` under ``base`` by their spelling (``None``: ``path`` is
    not spelled under ``base``, resolve to know)."""
    base = base.rstrip(os.sep)
    if not path.startswith(base + os.sep):
        return None
    return path[len(base) + 1 :].split(os.sep, 1)[0]


@functools.lru_cache(maxsize=64)
def _resolved(config_dir: Path) -> Path:
    return config_dir.resolve()


def collect(config_dir: Path) -> Snapshot:
    """The snapshot of ``config_dir`` now. Unreadable or oversized files are kept as an empty
    marker file ``<path>.unreadable`` holding the reason, so validation reports them."""
    files: dict[str, bytes] = {}

    def add(path: Path, rel: str) -> None:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                files[rel + ".unreadable"] = f"larger than {MAX_FILE_BYTES} bytes".encode()
                return
            files[rel] = path.read_bytes()
        except OSError as exc:
            files[rel + ".unreadable"] = str(exc.strerror or exc).encode()

    for name in CONFIG_FILES:
        path = config_dir / name
        if path.is_file():
            add(path, name)
    for name in CONFIG_DIRS:
        top = config_dir / name
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if f.startswith("."):
                    continue
                path = Path(dirpath) / f
                if path.is_file():
                    add(path, path.relative_to(config_dir).as_posix())
    for rel in agent_modules(config_dir):
        if rel not in files and (config_dir / rel).is_file():
            add(config_dir / rel, rel)
    return Snapshot(files)


def diff(old: Snapshot, new: Snapshot) -> tuple[list[str], str]:
    """The changed paths (added, removed or modified, sorted) and a unified diff of them, cut
    at :data:`MAX_DIFF_CHARS`. Binary content shows as a one-line note."""
    paths = sorted(set(old.files) | set(new.files))
    changed = [p for p in paths if old.files.get(p) != new.files.get(p)]
    out: list[str] = []
    for p in changed:
        a, b = old.files.get(p), new.files.get(p)
        try:
            la = a.decode("utf-8").splitlines(keepends=True) if a is not None else []
            lb = b.decode("utf-8").splitlines(keepends=True) if b is not None else []
        except UnicodeDecodeError:
            out.append(f"Binary file {p} differs\n")
            continue
        out.extend(
            difflib.unified_diff(
                la, lb,
                fromfile=f"a/{p}" if a is not None else "/dev/null",
                tofile=f"b/{p}" if b is not None else "/dev/null",
            )
        )  # fmt: skip
    text = "".join(line if line.endswith("\n") else line + "\n" for line in out)
    if len(text) > MAX_DIFF_CHARS:
        text = text[:MAX_DIFF_CHARS] + "\n[diff cut]\n"
    return changed, text
