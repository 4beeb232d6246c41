"""A snapshot checked in isolation, with the loaders the handlers use.

The snapshot is written to a fresh temporary directory (never the live one) and loaded as a
handler would load it: policy parse and compile, guardrails chain, agents, every SKILL.md, and
each Python agent's module imported and its smoke tests run, in a subprocess with a time limit
(:func:`nanocrab.pyagent.smoke.check`). Each problem names the file relative to the
configuration directory and, where the loader knows it, the line. A snapshot with any problem
is never activated.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from nanocrab.events import ReloadProblem
from nanocrab.guardrails import GuardrailsError, load_guardrails
from nanocrab.policy import PolicyError, load_policy
from nanocrab.pyagent.smoke import DEFAULT_TIMEOUT_S, check
from nanocrab.reload.snapshot import Snapshot
from nanocrab.routing import AgentsConfig, AgentsError, load_agents
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


def python_agents(agents: AgentsConfig, root: Path, timeout_s: float) -> list[ReloadProblem]:
    """Each Python agent of ``agents`` (materialized at ``root``): its module imports, holds
    its class, and passes its smoke tests (``async def smoke(harness)``) within ``timeout_s``."""
    problems: list[ReloadProblem] = []
    for spec in agents.agents:
        if spec.module is None:
            continue
        path = root / spec.module
        if not path.is_file():
            why = f"agent {spec.name!r}: module {spec.module} not found"
            problems.append(ReloadProblem(file="agents.yaml", message=why))
            continue
        outcome = check(path, spec.agent_class, timeout_s=timeout_s)
        if not outcome.ok:
            file = spec.module if not Path(spec.module).is_absolute() else str(path)
            why = f"agent {spec.name!r}: {outcome.message}"
            problems.append(ReloadProblem(file=file, line=outcome.line, message=why))
    return problems


def validate(
    snapshot: Snapshot, *, smoke_timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[ReloadProblem]:
    """Every problem of ``snapshot`` (empty: it may be activated). ``smoke_timeout_s``: the
    time limit of each Python agent's import and smoke tests."""
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
                loaded = load(root / name)
            except error as exc:
                problems.append(problem(str(exc), root, name))
                continue
            if isinstance(loaded, AgentsConfig):
                problems.extend(python_agents(loaded, root, smoke_timeout_s))
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
