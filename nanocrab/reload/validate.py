"""A snapshot checked in isolation, with the loaders the handlers use.

The snapshot is written to a fresh temporary directory (never the live one) and loaded as a
handler would load it: policy parse and compile, guardrails chain, agents, every SKILL.md. Each
problem names the file relative to the configuration directory and, where the loader knows it,
the line. A snapshot with any problem is never activated.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from nanocrab.events import ReloadProblem
from nanocrab.guardrails import GuardrailsError, load_guardrails
from nanocrab.policy import PolicyError, load_policy
from nanocrab.reload.snapshot import Snapshot
from nanocrab.routing import AgentsError, load_agents
from nanocrab.skills import SkillError, SkillLibrary

_LOCATED = re.compile(r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+)(?::\d+)?:\s*(?P<msg>.*)$", re.S)
_LINE = re.compile(r"\bline (\d+)")


def problem(text: str, root: Path, fallback_file: str) -> ReloadProblem:
    """A loader's ``file:line: message`` as a :class:`ReloadProblem` relative to ``root``."""
    text = text.replace(f"{root.resolve()}/", "").replace(f"{root}/", "")
    m = _LOCATED.match(text)
    if m is not None:
        return ReloadProblem(file=m["file"], line=int(m["line"]), message=m["msg"].strip())
    file, sep, rest = text.partition(": ")
    if not (sep and ("/" in file or file.endswith((".yaml", ".md")))):
        file, rest = fallback_file, text
    rest = rest.strip().removeprefix(f"{file}: ")
    m = _LINE.search(rest)
    return ReloadProblem(file=file, line=int(m[1]) if m else 0, message=rest)


def validate(snapshot: Snapshot) -> list[ReloadProblem]:
    """Every problem of ``snapshot`` (empty: it may be activated)."""
    problems: list[ReloadProblem] = []
    for rel, data in snapshot.files.items():
        if rel.endswith(".unreadable"):
            name = rel.removesuffix(".unreadable")
            problems.append(ReloadProblem(file=name, message=f"cannot read: {data.decode()}"))
    with tempfile.TemporaryDirectory(prefix="nanocrab-reload-") as tmp:
        root = snapshot.materialize(Path(tmp) / "config")
        for name, load, error in (
            ("policy.yaml", load_policy, PolicyError),
            ("guardrails.yaml", load_guardrails, GuardrailsError),
            ("agents.yaml", load_agents, AgentsError),
        ):
            if not (root / name).is_file():
                continue
            try:
                load(root / name)
            except error as exc:
                problems.append(problem(str(exc), root, name))
        if (root / "skills").is_dir():
            library = SkillLibrary.discover([root / "skills"])
            for p in library.problems:
                problems.append(problem(f"{p.path}: {p.message}", root, "skills"))
            # what the model reads when it triggers a skill: every body must read too
            for name in library.names():
                try:
                    library.body(name)
                except SkillError as exc:
                    problems.append(problem(str(exc), root, f"skills/{name}/SKILL.md"))
    return problems
