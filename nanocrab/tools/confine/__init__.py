"""The operating-system sandbox ``exec`` commands run in (Linux: Landlock, namespaces, seccomp).

A confined command can read the system's runtime trees and the workspace, write only the
workspace and a private temporary directory, reach no network unless its grant names hosts,
sees an environment built from an allow-list, runs under resource limits in its own process
group, and cannot signal or trace anything outside its sandbox. docs/security.md ("The exec
sandbox") explains the design, its measurements and its limits.

- :mod:`.spec` — :class:`Confinement`, what the executor asks for;
- :mod:`.jail` — the parent's per-call preparation; :mod:`.spawner` and :mod:`.zygote` — the
  helper process that forks and confines each command;
- :mod:`.probe` — whether this host can do it (cached per process);
- :mod:`.landlock`, :mod:`.seccomp` — the kernel interfaces, through ctypes;
- :mod:`.layout`, :mod:`.env` — which paths and which environment variables.
"""

from nanocrab.tools.confine.jail import (
    ConfinementError,
    Jail,
    SandboxFailed,
    SandboxStatus,
    SandboxUnavailable,
)
from nanocrab.tools.confine.probe import host_status, probe
from nanocrab.tools.confine.spec import Confinement, Limits

__all__ = [
    "Confinement",
    "ConfinementError",
    "Jail",
    "Limits",
    "SandboxFailed",
    "SandboxStatus",
    "SandboxUnavailable",
    "host_status",
    "probe",
]
