"""Whether this host can confine commands: probed once per process with a real confined
command, which shows that the kernel can do all of it — or which step failed, and why."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from nanocrab.tools.confine import landlock
from nanocrab.tools.confine.jail import (
    MIN_ABI,
    ConfinementError,
    Jail,
    SandboxFailed,
    SandboxStatus,
)
from nanocrab.tools.confine.seccomp import supported
from nanocrab.tools.confine.spec import Confinement

_STATUS: SandboxStatus | None = None
_NAMESPACE_HINT = (
    " (unprivileged user namespaces are not allowed here: see the sysctls "
    "user.max_user_namespaces, kernel.unprivileged_userns_clone and, on Ubuntu, "
    "kernel.apparmor_restrict_unprivileged_userns)"
)


async def host_status() -> SandboxStatus:
    """Whether this host can confine commands: probed once per process, then cached."""
    global _STATUS
    if _STATUS is None:
        _STATUS = await asyncio.to_thread(probe)
    return _STATUS


def probe() -> SandboxStatus:
    """Check the kernel (Landlock ABI, architecture) and run one confined command that must fail
    to read a file outside its workspace, to write into ``.git/hooks`` and to ``chmod`` a file
    outside."""
    if (problem := supported()) is not None:
        return SandboxStatus.unavailable(problem)
    abi = landlock.abi_version()
    if abi == 0:
        return SandboxStatus.unavailable(
            "Landlock is not enabled in this kernel (it needs Linux 6.2+ with landlock in the "
            "lsm= boot parameter or CONFIG_LSM)"
        )
    if abi < MIN_ABI:
        return SandboxStatus.unavailable(
            f"this kernel's Landlock ABI is {abi}; the sandbox needs ABI {MIN_ABI} (Linux 6.2+) "
            "to control truncate(2)"
        )
    with tempfile.TemporaryDirectory(prefix="nanocrab-probe-") as top:
        workspace = Path(top, "workspace").resolve()
        (workspace / ".git" / "hooks").mkdir(parents=True)
        (workspace / ".git" / "config").write_text("")
        outside = Path(top, "outside")
        outside.write_text("")
        script = (
            f"cat {outside} 2>/dev/null && exit 10; "
            "touch .git/hooks/probe 2>/dev/null && exit 11; "
            f"chmod 0 {outside} 2>/dev/null && exit 12; exit 0"
        )
        try:
            with Jail(Confinement(), workspace=workspace, timeout_s=10, abi=abi) as jail:
                returncode = _run(jail, script, workspace)
        except SandboxFailed as exc:
            hint = _NAMESPACE_HINT if str(exc).startswith(("unshare", "write")) else ""
            return SandboxStatus.unavailable(f"the sandbox could not be set up: {exc}{hint}")
        except (OSError, ConfinementError) as exc:
            return SandboxStatus.unavailable(f"the sandbox could not be prepared: {exc}")
    if returncode != 0:
        what = {10: "a file outside the workspace was readable", 11: ".git/hooks was writable",
                12: "a file outside the workspace could be chmod-ed"}  # fmt: skip
        failed = what.get(returncode, f"the probe command exited with {returncode}")
        return SandboxStatus.unavailable(f"the sandbox did not hold: {failed}")
    return SandboxStatus(True, _enforced(abi), abi)


def _run(jail: Jail, script: str, workspace: Path) -> int:
    with open(os.devnull, "wb") as null:
        child = jail.start(["/bin/sh", "-c", script], cwd=workspace, stdout=null.fileno(),
                           stderr=null.fileno())  # fmt: skip
    return child.wait_blocking()


def _enforced(abi: int) -> str:
    parts = [f"Landlock ABI {abi}", "user, mount, IPC, process-id and network namespaces",
             "seccomp"]  # fmt: skip
    if abi < 6:
        parts.append("no signal scoping (Landlock ABI < 6)")
    if os.geteuid() == 0:
        parts.append("as root, the kernel does not enforce the process limit")
    return "; ".join(parts)
