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
  child would otherwise share with the runtime.

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
    x32_bit: int = 0


_ARCHES = {
    "x86_64": _Arch(0xC000003E, 41, (425, 426, 427, 250, 248, 249), x32_bit=0x40000000),
    "aarch64": _Arch(0xC00000B7, 198, (425, 426, 427, 219, 217, 218)),
}


def supported() -> str | None:
    """``None`` when this machine's architecture has a filter; else why not."""
    machine = platform.machine()
    if machine not in _ARCHES:
        return f"no seccomp filter for the {machine} architecture (x86_64 and aarch64 only)"
    if struct.pack("=H", 1) != b"\x01\x00":
        return "the seccomp filter assumes a little-endian machine"
    return None


def _program(arch: _Arch) -> list[Instruction]:
    """The filter as (code, jt, jf, k) instructions; jumps are relative, forward only."""
    deny = _RET_ERRNO | errno.EPERM
    blocked = list(arch.blocked)
    prog: list[Instruction] = [
        (_LD_ABS, 0, 0, _OFF_ARCH),
        (_JEQ, 1, 0, arch.audit),
        (_RET, 0, 0, deny),  # a foreign ABI
        (_LD_ABS, 0, 0, _OFF_NR),
    ]
    if arch.x32_bit:
        prog += [(_JGE, 0, 1, arch.x32_bit), (_RET, 0, 0, deny)]
    # each blocked number jumps to the shared "deny" that ends the program: past the rest of
    # the block (n - i - 1) and the five socket-check instructions that follow it
    for i, nr in enumerate(blocked):
        prog.append((_JEQ, len(blocked) - i + 4, 0, nr))
    prog += [
        (_JEQ, 1, 0, arch.socket),
        (_RET, 0, 0, _RET_ALLOW),
        (_LD_ABS, 0, 0, _OFF_ARG0),  # socket(domain, ...)
        (_JEQ, 1, 0, socket.AF_UNIX),
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, deny),
    ]
    return prog


Instruction = tuple[int, int, int, int]


def program() -> list[Instruction]:
    """The filter for this machine as (code, jt, jf, k) instructions. Raises ``RuntimeError``
    when :func:`supported` says no."""
    problem = supported()
    if problem is not None:
        raise RuntimeError(problem)
    return _program(_ARCHES[platform.machine()])
