"""The sandbox's spawner process: forks confined commands on the runtime's behalf.

Run as ``python -I -S zygote.py FD`` by :mod:`nanocrab.tools.confine.spawner`, with ``FD`` one end
of a ``SOCK_SEQPACKET`` socket pair. It imports only the standard library, so it starts in a few
milliseconds and stays small: forking it costs a fraction of forking the runtime (whose page
tables grow with everything it has loaded), and no Python runs after ``fork`` in a process with
other threads.

One request per message: a JSON object (``argv``, ``cwd``, ``env``, ``unshare``, ``id_maps``,
``mounts``, ``seccomp``, ``rlimits``) with four descriptors (stdout, stderr, a status pipe, the
Landlock ruleset). The forked child starts a session, takes stdout/stderr, ``chdir``s, then
confines itself in this order and ``exec``s:

1. ``unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID [| CLONE_NEWNET])`` and
   an identity map of its uid and gid (``setgroups`` denied): same owner on every file, no
   capability outside the new namespaces;
2. mounts in its private mount namespace, in the request's order: ``["mount", …]`` is a
   ``mount(2)``, ``["setattr", path, recursive, set, clear]`` a ``mount_setattr(2)`` (every
   mount read-only but the workspace's and the temporary directory's, ``.git`` pinned and parts
   or all of it read-only, protected paths masked);
3. ``PR_SET_NO_NEW_PRIVS``, the seccomp filter, ``landlock_restrict_self``;
4. resource limits (``RLIMIT_NPROC`` after the user namespace exists, so it counts the sandbox's
   own tasks);
5. with a new process-id namespace, a fork: the command runs as its first process and this
   child waits for it and ends as it ended (``_init``).

The reply is ``{"pid": N}`` (the child's: the command's parent in step 5) once ``exec``
succeeded, or ``{"error": "<step>: <reason>"}`` (the child exited, nothing ran). When the
command exits, its wait status (``int32``, ``-N`` for signal ``N``) is written to its status
pipe, which is then closed. End of file on the socket ends the spawner.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys

TYPE_CHECKING = False  # not ``typing.TYPE_CHECKING``: the spawner does not import ``typing``
if TYPE_CHECKING:
    from typing import Any

_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_PR_SET_PDEATHSIG = 1
_CLONE_NEWPID = 0x20000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_MAX_MESSAGE = 1 << 20
_MAX_FDS = 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]  # fmt: skip


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _check(failed: bool, step: str) -> None:
    if failed:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), step)


def _enc(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def _confine(req: dict[str, Any], ruleset: int) -> None:
    """Steps 1 to 4 of the module docstring; raises ``OSError`` naming the failed step."""
    _check(_libc.unshare(ctypes.c_int(req["unshare"])) != 0, "unshare")
    for path, data in req["id_maps"]:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, data.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, f"write {path}") from None
    for op, *args in req["mounts"]:
        if op == "mount":
            source, target, fstype, flags, data = args
            failed = _libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data))
            _check(failed != 0, f"mount {target}")
        else:  # "setattr": mount_setattr(2)
            path, recursive, attr_set, attr_clr = args
            attr = struct.pack("=QQQQ", attr_set, attr_clr, 0, 0)  # struct mount_attr, v0
            failed = _libc.syscall(_SYS_MOUNT_SETATTR, ctypes.c_int(_AT_FDCWD), _enc(path),
                                   ctypes.c_uint(_AT_RECURSIVE if recursive else 0),
                                   ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)))  # fmt: skip
            _check(failed != 0, f"mount_setattr {path}")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0, "prctl(PR_SET_NO_NEW_PRIVS)")
    prog = req["seccomp"]
    insns = (_SockFilter * len(prog))(*(_SockFilter(*i) for i in prog))
    fprog = _SockFprog(len(prog), insns)
    failed = _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    _check(failed != 0, "seccomp")
    failed = _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    _check(failed != 0, "landlock_restrict_self")
    for which, value in req["rlimits"]:
        try:
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as exc:
            raise OSError(0, str(exc), f"setrlimit({which})") from None


def _child(req: dict[str, Any], stdout: int, stderr: int, ruleset: int, report: int) -> None:
    """In the forked child: never returns (``exec`` or ``_exit``)."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # the spawner's dispositions are not the command's
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.chdir(req["cwd"])
        _confine(req, ruleset)
        os.chdir(req["cwd"])  # again: onto the workspace's own mount, made since
        if req["unshare"] & _CLONE_NEWPID:
            _init(req, report, null)  # never returns
        os.execve(req["argv"][0], req["argv"], req["env"])
    except OSError as exc:
        step = exc.filename if isinstance(exc.filename, str) else "exec"
        os.write(report, f"{step}: {exc.strerror or exc}".encode(errors="replace"))
    except BaseException as exc:  # a bug here must still end this child, never return
        os.write(report, f"spawner: {exc!r}".encode(errors="replace"))
    finally:
        os._exit(127)


def _init(req: dict[str, Any], report: int, null: int) -> None:
    """In the confined child, whose next child is the first of its new PID namespace: start
    the command as that process, wait for it and end as it ended. When the command ends, the
    kernel kills every process left in its namespace (a daemon it started, a process that
    left its session): nothing the command started outlives it. When this process is killed
    (a time-out), the command is too (``PR_SET_PDEATHSIG``), and with it the rest."""
    pid = os.fork()
    if pid == 0:
        try:
            _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0,
                   "prctl(PR_SET_PDEATHSIG)")  # fmt: skip
            os.execve(req["argv"][0], req["argv"], req["env"])
        except OSError as exc:
            step = exc.filename if isinstance(exc.filename, str) else "exec"
            os.write(report, f"{step}: {exc.strerror or exc}".encode(errors="replace"))
        finally:
            os._exit(127)
    code = 127
    try:
        os.close(report)  # the spawner reads to end of file: the command's exec closes the rest
        os.dup2(null, 1)  # the command's output is its own: no copy held open here
        os.dup2(null, 2)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(status)
        if code < 0:  # killed by a signal: end by the same one, so the status says so
            with contextlib.suppress(OSError, ValueError):
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code & 0xFF)


def _spawn(req: dict[str, Any], fds: list[int], statuses: dict[int, int]) -> dict[str, int | str]:
    stdout, stderr, status, ruleset = fds
    report_r, report_w = os.pipe()
    pid = -1
    failure = b""
    try:
        pid = os.fork()
        if pid == 0:
            _child(req, stdout, stderr, ruleset, report_w)
        os.close(report_w)
        report_w = -1
        while chunk := os.read(report_r, 4096):
            failure += chunk
    except OSError as exc:
        failure = f"fork: {exc.strerror}".encode()
    finally:
        for fd in (stdout, stderr, ruleset, report_r, report_w):
            if fd >= 0:
                os.close(fd)
    if failure:
        if pid > 0:
            os.waitpid(pid, 0)
        os.close(status)
        return {"error": failure.decode(errors="replace")}
    statuses[pid] = status
    return {"pid": pid}


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the runtime stopped waiting for it
                os.write(fd, struct.pack("=i", os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    space = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
    msg, ancdata, _flags, _addr = sock.recvmsg(_MAX_MESSAGE, space, socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    statuses: dict[int, int] = {}
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _events in selector.select():
            if key.fileobj is sock:
                msg, fds = _receive(sock)
                if not msg:
                    return
                if len(fds) != _MAX_FDS:
                    for fd in fds:
                        os.close(fd)
                    reply: dict[str, int | str] = {
                        "error": f"spawner: expected {_MAX_FDS} descriptors, got {len(fds)}"
                    }
                else:
                    reply = _spawn(json.loads(msg), fds, statuses)
                sock.send(json.dumps(reply).encode())
            else:
                os.read(wake_r, 512)
        _reap(statuses)


if __name__ == "__main__":
    main()
