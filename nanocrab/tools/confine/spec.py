"""What one ``exec`` call's confinement is asked to be: typed values, no system calls.

The executor derives a :class:`Confinement` from the call's grant (its tier, the hosts it names)
and the policy's ``exec`` section; the exec tool hands it to the operations backend, which
builds the sandbox (:mod:`nanocrab.tools.confine.jail`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nanocrab.events.values import Capability, RiskTier


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Resource limits of every process a confined command starts.

    ``memory_mb`` bounds each process's data (``RLIMIT_DATA``: heap and private writable
    mappings, not address space merely reserved); ``processes`` the tasks (processes and
    threads) of the whole sandbox (``RLIMIT_NPROC``, counted per user namespace — the kernel
    exempts uid 0, see docs/security.md); ``file_size_mb`` any file written; ``open_files``
    descriptors per process. CPU time per process is the call's timeout plus a margin.
    """

    memory_mb: int = 4096
    processes: int = 1024
    file_size_mb: int = 1024
    open_files: int = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Confinement:
    """How one exec call must be confined.

    ``required``: ``False`` only when the policy opts out (``exec.sandbox: off``); then the
    command runs unconfined. ``tier`` is the grant's: a Safe call is refused when the sandbox is
    unavailable, a Guarded/Unsafe one (a person approved it) runs unconfined with a note.
    ``hosts``: the network hosts the grant names; empty means no network at all. ``env``:
    extra environment variable names passed through from the runtime (names that look like
    secrets never are). ``read_paths``: extra read-only trees. ``protected``: paths that must
    stay unreadable even when they lie inside a readable tree (the data directory, its keys):
    they are masked. ``protect_git``: the workspace's ``.git/config``, ``.git/hooks`` and
    ``.git/modules`` are read-only and ``.git`` cannot be replaced.
    """

    required: bool = True
    tier: RiskTier = "safe"
    hosts: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    read_paths: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = ()
    protect_git: bool = True
    limits: Limits = Limits()

    @property
    def approved(self) -> bool:
        """A person approved the call (its grant is Guarded or Unsafe)."""
        return self.tier in ("guarded", "unsafe")

    def for_grant(self, tier: RiskTier, capabilities: Iterable[Capability]) -> Confinement:
        """This confinement for a call granted at ``tier`` with ``capabilities`` (the network
        hosts among them open the network)."""
        hosts = tuple(c.resource for c in capabilities if c.access == "network" and c.resource)
        return dataclasses.replace(self, tier=tier, hosts=hosts)
