"""What a skill ``requires``, and whether this machine has it.

Each entry of a SKILL.md's ``requires`` is one of:

- ``env:NAME``: the environment variable ``NAME`` is set and not empty (an API token, say);
- ``bin:NAME``: the program ``NAME`` is on ``PATH``;
- ``tool:NAME``: the runtime has a tool called ``NAME``;
- ``NAME``: a runtime tool of that name (``exec``, ``read``, ...), else a program on ``PATH``
  (``python3``, ``git``): what the bundled skills write.

A skill with a missing requirement is hidden from the agent (the catalogue, the ``skill`` tool,
``get_skills_for_task``): it would tell the model to run what is not there. ``nanocrab skills
check`` lists each hidden skill with the reasons (:func:`missing`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal

RequirementKind = Literal["env", "bin", "tool", "tool_or_bin"]

Which = Callable[[str], str | None]
"""``shutil.which``: the path of a program on ``PATH``, ``None`` when there is none."""


@dataclass(frozen=True, slots=True)
class Requirement:
    kind: RequirementKind
    name: str

    @classmethod
    def parse(cls, entry: str) -> Requirement:
        prefix, sep, rest = entry.partition(":")
        if sep and prefix in ("env", "bin", "tool") and rest:
            return cls(prefix, rest.strip())  # type: ignore[arg-type]
        return cls("tool_or_bin", entry.strip())


@dataclass(frozen=True, slots=True)
class Missing:
    """A requirement this machine does not meet, and why (one sentence)."""

    entry: str
    reason: str


def runtime_tools() -> frozenset[str]:
    """The tool names a nanocrab runtime has: the default agent's tools and the discovery ones."""
    from nanocrab.agents import DEFAULT

    return frozenset({*DEFAULT.tools, "get_skills_for_task", "get_available_agents"})


def missing(
    requires: Collection[str],
    *,
    tools: Collection[str] | None = None,
    environ: Mapping[str, str] | None = None,
    which: Which | None = None,
) -> list[Missing]:
    """The entries of ``requires`` not met here, in order. ``tools`` defaults to
    :func:`runtime_tools`, ``environ`` to ``os.environ``, ``which`` to ``shutil.which``."""
    import os

    known = runtime_tools() if tools is None else frozenset(tools)
    env = os.environ if environ is None else environ
    find = which or shutil.which
    out: list[Missing] = []
    for entry in requires:
        req = Requirement.parse(entry)
        match req.kind:
            case "env":
                if not env.get(req.name):
                    out.append(Missing(entry, f"the environment variable {req.name} is not set"))
            case "bin":
                if find(req.name) is None:
                    out.append(Missing(entry, f"the program {req.name!r} is not on PATH"))
            case "tool":
                if req.name not in known:
                    out.append(Missing(entry, f"this runtime has no tool {req.name!r}"))
            case "tool_or_bin":
                if req.name not in known and find(req.name) is None:
                    out.append(Missing(
                        entry, f"{req.name!r} is neither a tool of this runtime nor a program "
                        "on PATH",
                    ))  # fmt: skip
    return out
