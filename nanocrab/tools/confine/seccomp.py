"""A small seccomp filter for exec's children: the few system calls Landlock does not cover.

Landlock decides which *paths* a command may open, but connecting to a Unix socket by path
(``/run/docker.sock``, ``/run/systemd/private``, a D-Bus or X11 socket) is not a file access it
controls, and a root-owned daemon on such a socket can start anything outside the sandbox. So
the filter refuses, with ``EPERM``:

- ``socket(AF_UNIX, …)`` — new Unix sockets (``socketpair``, which pipes and asyncio use, stays
  allowed: its two ends are already connected to each other);
- ``io_uring_setup``/``_enter``/``_register`` — io_uring creates sockets without the ``socket``
  system call, around this filter;
- ``keyctl``, ``add_key``, ``request_key`` — the kernel keyrings, whose session keyring the
  child would otherwise share with the runtime;
- a mode with the set-user-ID or set-group-ID bit in ``chmod`` and the calls that create files
  (:data:`SET_ID_BITS`); extended attributes are not set (``EOPNOTSUPP``: file capabilities live
  in one), and ``openat2``, whose mode the filter cannot see, is "not implemented" (``ENOSYS``).

System calls of another ABI than the native one (32-bit ``int 0x80``, x32) are refused whole,
so none of the above can be reached by another number. The filter is classic BPF assembled here
(no libseccomp); the spawner installs it with one ``prctl`` after ``PR_SET_NO_NEW_PRIVS``.
"""

from __future__ import annotations

import errno
import platform
import socket
import struct
from dataclasses import dataclass

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# BPF opcodes: ld word absolute, jeq/jge immediate, ret immediate.
_LD_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0 = 16  # low 32 bits on little-endian machines


@dataclass(frozen=True, slots=True)
class _Arch:
    audit: int
    socket: int
    blocked: tuple[int, ...]  # io_uring_setup/enter/register, keyctl, add_key, request_key
    moded: tuple[tuple[int, int], ...]  # (call, index of its mode argument)
    xattr_set: tuple[int, ...]  # setxattr, lsetxattr, fsetxattr, setxattrat
    openat2: int
    x32_bit: int = 0


_ARCHES = {
    "x86_64": _Arch(
        0xC000003E, 41, (425, 426, 427, 250, 248, 249),
        # chmod, fchmod, fchmodat, fchmodat2, open, openat, creat, mknod, mknodat
        ((90, 1), (91, 1), (268, 2), (452, 2), (2, 2), (257, 3), (85, 1), (133, 1), (259, 2)),
        (188, 189, 190, 463), 437, x32_bit=0x40000000,
    ),
    "aarch64": _Arch(
        0xC00000B7, 198, (425, 426, 427, 219, 217, 218),
        # fchmod, fchmodat, fchmodat2, openat, mknodat
        ((52, 1), (53, 2), (452, 2), (56, 3), (33, 2)),
        (5, 6, 7, 463), 437,
    ),
}  # fmt: skip

SET_ID_BITS = 0o6000
"""``S_ISUID | S_ISGID``: a mode with either is refused (``EPERM``) in ``chmod`` and the calls
that create files. The sandbox's files are the runtime user's: a set-user-ID file made in the
workspace would run as that user for anyone, as root when the runtime is root."""


def supported() -> str | None:
    """``None`` when this machine's architecture has a filter; else why not."""
    machine = platform.machine()
    if machine not in _ARCHES:
        return f"no seccomp filter for the {machine} architecture (x86_64 and aarch64 only)"
    if struct.pack("=H", 1) != b"\x01\x00":
        return "the seccomp filter assumes a little-endian machine"
    return None


def _program(arch: _Arch) -> list[Instruction]:
    """The filter as (code, jt, jf, k) instructions; jumps are relative, forward only. After
    the ABI checks, one block per rule, each leaving the call's number in the accumulator for
    the next; a call no block refuses is allowed."""
    deny = _RET_ERRNO | errno.EPERM
    prog: list[Instruction] = [
        (_LD_ABS, 0, 0, _OFF_ARCH),
        (_JEQ, 1, 0, arch.audit),
        (_RET, 0, 0, deny),  # a foreign ABI
        (_LD_ABS, 0, 0, _OFF_NR),
    ]
    if arch.x32_bit:
        prog += [(_JGE, 0, 1, arch.x32_bit), (_RET, 0, 0, deny)]
    refusals = [(nr, deny) for nr in arch.blocked]
    # extended attributes: not supported, as on many file systems (copies carry on without);
    # security.capability would give a file capabilities, and the name cannot be inspected here
    refusals += [(nr, _RET_ERRNO | errno.EOPNOTSUPP) for nr in arch.xattr_set]
    # openat2's mode is inside a structure the filter cannot read: "no such call", so C
    # libraries and runtimes fall back to openat
    refusals.append((arch.openat2, _RET_ERRNO | errno.ENOSYS))
    for nr, answer in refusals:
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, answer)]
    for nr, index in arch.moded:
        prog += _argument_block(nr, index, (_JSET, 0, 1, SET_ID_BITS), deny)
    prog += _argument_block(arch.socket, 0, (_JEQ, 0, 1, socket.AF_UNIX), deny)
    prog.append((_RET, 0, 0, _RET_ALLOW))
    return prog


def _argument_block(nr: int, index: int, test: Instruction, deny: int) -> list[Instruction]:
    """Refuse call ``nr`` when ``test`` (jumping to the next instruction when true, past it
    when false) holds for the low 32 bits of its argument ``index``."""
    return [
        (_JEQ, 0, 4, nr),
        (_LD_ABS, 0, 0, _OFF_ARG0 + 8 * index),
        test,
        (_RET, 0, 0, deny),
        (_LD_ABS, 0, 0, _OFF_NR),
    ]


Instruction = tuple[int, int, int, int]


def program() -> list[Instruction]:
    """The filter for this machine as (code, jt, jf, k) instructions. Raises ``RuntimeError``
    when :func:`supported` says no."""
    problem = supported()
    if problem is not None:
        raise RuntimeError(problem)
    return _program(_ARCHES[platform.machine()])
