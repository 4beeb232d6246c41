"""The three Landlock system calls, through ctypes (Linux 5.13+, kernel ABI versions 1 to 7).

Landlock lets an unprivileged process restrict itself: a *ruleset* names the access rights it
handles (everything not granted by a rule is then denied) and rules grant rights beneath a
directory (or on one file) and TCP ports; ``landlock_restrict_self`` applies it to the calling
thread and, through fork and exec, to everything it starts. Restrictions only ever narrow.

A ruleset is built in the runtime (:class:`Ruleset`) and its descriptor handed to the spawner,
whose forked child calls ``landlock_restrict_self`` with it, so the child does no path lookups.
Rights the running kernel's ABI does not know are left out ("best effort", as the kernel
documentation recommends): :func:`abi_version` says which ABI that is. Constants are from
``include/uapi/linux/landlock.h``.
"""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

# landlock_create_ruleset, landlock_add_rule (landlock_restrict_self is 446): the same numbers on
# every architecture (they were added after the syscall tables were unified).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

# File system rights (ABI in brackets where above 1).
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # [2] link or rename a file into another directory
TRUNCATE = 1 << 14  # [3]
IOCTL_DEV = 1 << 15  # [5] ioctl on character and block devices
# Network rights [4].
BIND_TCP = 1 << 0
CONNECT_TCP = 1 << 1
# Scopes [6]: no connecting to abstract unix sockets, no signals, outside the domain.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights that apply to a file itself; a rule on a non-directory may only grant these."""
READ_ONLY = EXECUTE | READ_FILE | READ_DIR

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_LATEST = (1 << 16) - 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def abi_version() -> int:
    """The Landlock ABI the kernel offers; 0 when Landlock is missing or disabled at boot."""
    result = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                      ctypes.c_uint32(_CREATE_RULESET_VERSION))  # fmt: skip
    return max(int(result), 0)


def fs_rights(abi: int) -> int:
    """Every file system right ABI ``abi`` handles."""
    return _FS_BY_ABI.get(abi, _FS_LATEST) if abi >= 1 else 0


class Ruleset:
    """A Landlock ruleset under construction, owned by this process until :meth:`close`.

    Handles every right ``abi`` knows: file system always, TCP bind/connect from ABI 4, the
    signal and abstract-socket scopes from ABI 6. Rights asked for in :meth:`allow_path` that the
    ABI lacks are dropped. Raises ``OSError`` from the kernel (``ENOSYS``, ``EOPNOTSUPP``: no
    Landlock).
    """

    def __init__(self, abi: int) -> None:
        self.abi = abi
        self.handled_fs = fs_rights(abi)
        self.handled_net = BIND_TCP | CONNECT_TCP if abi >= 4 else 0
        self.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
        self.fd = _check(
            _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                     ctypes.c_uint32(0)),
            "landlock_create_ruleset",
        )  # fmt: skip

    def allow_path(self, path: Path | str, rights: int, *, missing_ok: bool = True) -> bool:
        """Grant ``rights`` beneath ``path`` (or on it, for a file: only :data:`FILE_RIGHTS`).

        Symbolic links are followed: the rule lands on the target. A path that does not exist
        or cannot be opened gets no rule: ``False``, or with ``missing_ok=False`` the
        ``OSError``.
        """
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            if not missing_ok:
                raise
            return False
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= FILE_RIGHTS
            attr = _PathBeneathAttr(rights & self.handled_fs, fd)
            _check(
                _syscall(_SYS_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(_RULE_PATH_BENEATH),
                         ctypes.byref(attr), ctypes.c_uint32(0)),
                f"landlock_add_rule({path})",
            )  # fmt: skip
        finally:
            os.close(fd)
        return True

    def allow_tcp_connect(self, port: int) -> None:
        """Allow TCP connections to ``port`` (ABI 4+; a no-op below, where TCP is unhandled)."""
        if not self.handled_net:
            return
        attr = _NetPortAttr(CONNECT_TCP, port)
        _check(
            _syscall(_SYS_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(_RULE_NET_PORT),
                     ctypes.byref(attr), ctypes.c_uint32(0)),
            f"landlock_add_rule(tcp {port})",
        )  # fmt: skip

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
