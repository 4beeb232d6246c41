"""The operations backend on a remote host: files over SFTP, commands over SSH exec channels.

:class:`SshOperations` implements :class:`~nanocrab.tools.ops.Operations` for one remote
workspace (``root``, a directory on the remote host). The run's workspace as the tools, the
policy, the model and the audit name it (a path on the executor's host) is *mapped* onto it:
``<workspace>/src/a.py`` is ``<root>/src/a.py`` there, so a call's arguments, details and
audit row read the same on either backend.

Confinement is the local backend's, done over SFTP (which has no ``openat``). A tool's first
check (:meth:`SshOperations.resolve`) resolves its argument on the remote tree; then every path is
resolved from ``root`` one component at a time with ``lstat``; a symlink met on the way is read
(``readlink``) and its target spliced into the walk, ``..`` climbs only the components already
walked, an absolute target must name a place under ``root``, at most
:data:`~nanocrab.tools.paths.MAX_LINKS` links per resolution. A link leading out, or ``..``
above the root, fails the call with :class:`~nanocrab.tools.paths.PathEscape` before anything
is opened. What it cannot give is the local backend's guarantee *at the moment of use*: the
SFTP server opens the resolved path by name, so a process on the remote host that swaps a
directory on the way for a symlink between the check and the open (one SFTP round trip) can
redirect that one operation. Writes go to a new temporary file in the resolved directory and
are renamed over the target (``posix-rename``), which replaces a symlink swapped in at the
target rather than writing through it.

Commands run as ``/bin/sh -c`` in ``root`` through the remote user's login shell (which must
accept ``exec /bin/sh -c '…'``: any POSIX shell). sshd makes each session's process a session
and process-group leader; the wrapper reports its pid first (a marker line on stderr, stripped
here), so a timeout or an abort signals the whole group (SIGTERM, SIGKILL after the grace
period) over a second channel, and what the command left running in its group when it exited
gets SIGTERM. The backend has no sandbox: a confined command raises
:class:`~nanocrab.tools.confine.SandboxUnavailable` (the exec tool then refuses a Safe call and
runs an approved one unconfined, saying so).

The connection (one per backend, with one SFTP session) is opened at the first call and again
after it was lost; the host key must be known (``known_hosts``), the client key is loaded at
each connect (a rotated credential applies to the next connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import secrets
import stat
import time
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import asyncssh
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from nanocrab.tools.base import OutputSink, ToolError
from nanocrab.tools.confine import Confinement, SandboxUnavailable
from nanocrab.tools.ops import DirEntry, FileInfo, WalkEntry
from nanocrab.tools.paths import MAX_LINKS, PathEscape
from nanocrab.tools.process import ProcessOutcome
from nanocrab.tools.ssh_exec import Channel, wait_channel, wrapper

__all__ = ["SshOperations", "SshTarget"]

_NEW_FILE_MODE = 0o644
_DIR_MODE = 0o755
_LOST = (asyncssh.DisconnectError, ConnectionError, BrokenPipeError)
# OpenSSH's default MaxSessions is 10 channels per connection: one is the SFTP session, one is
# kept for the kill of a command that times out, the rest run commands (more wait their turn)
_COMMAND_CHANNELS = 8
_CHANNEL_PATIENCE_S = 3.0


@dataclass(frozen=True, slots=True)
class SshTarget:
    """Where a remote workspace is: ``user@host:port``, the remote directory ``root``, how to
    prove who we are (``key``: called at each connect, returns the private key) and whom to
    trust (``known_hosts``: an OpenSSH known_hosts file; ``None``: ``~/.ssh/known_hosts``)."""

    host: str
    port: int
    user: str
    root: str
    key: Callable[[], asyncssh.SSHKey]
    known_hosts: Path | None = None
    connect_timeout_s: float = 15.0


def _os_error(exc: asyncssh.SFTPError, shown: str) -> OSError:
    """The ``os`` exception an SFTP status stands for (what the tools translate)."""
    reason = exc.reason or "SFTP failure"
    if isinstance(exc, asyncssh.SFTPNoSuchFile | asyncssh.SFTPNoSuchPath):
        return FileNotFoundError(errno.ENOENT, reason, shown)
    if isinstance(exc, asyncssh.SFTPPermissionDenied):
        return PermissionError(errno.EACCES, reason, shown)
    if isinstance(exc, asyncssh.SFTPNotADirectory):
        return NotADirectoryError(errno.ENOTDIR, reason, shown)
    if isinstance(exc, asyncssh.SFTPFileIsADirectory):
        return IsADirectoryError(errno.EISDIR, reason, shown)
    if isinstance(exc, asyncssh.SFTPConnectionLost | asyncssh.SFTPNoConnection):
        return ConnectionResetError(errno.ECONNRESET, reason, shown)
    return OSError(errno.EIO, reason, shown)


def _mode(attrs: asyncssh.SFTPAttrs) -> int:
    """The file-type bits of ``attrs`` (SFTP v3 sends them with the permissions)."""
    if attrs.permissions is not None and stat.S_IFMT(attrs.permissions):
        return attrs.permissions
    kinds = {
        asyncssh.FILEXFER_TYPE_DIRECTORY: stat.S_IFDIR,
        asyncssh.FILEXFER_TYPE_SYMLINK: stat.S_IFLNK,
        asyncssh.FILEXFER_TYPE_REGULAR: stat.S_IFREG,
    }
    return kinds.get(attrs.type, 0)


def _below(base: str, path: str) -> list[str] | None:
    """``path``'s components below ``base``, last first (a stack), or ``None`` if not below."""
    if path == base:
        return []
    prefix = base.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    return path[len(prefix) :].split("/")[::-1]


class SshOperations:
    """:class:`~nanocrab.tools.ops.Operations` on ``target.root`` of a remote host (the module
    docstring says how paths are mapped and confined). ``close`` ends the connection."""

    def __init__(
        self,
        target: SshTarget,
        *,
        kill_grace_s: float = 2.0,
        drain_s: float = 1.0,
        max_output_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.target = target
        self.kill_grace_s = kill_grace_s
        self.drain_s = drain_s
        self.max_output_bytes = max_output_bytes
        self._lock = asyncio.Lock()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._roots: tuple[str, ...] = ()  # the root as configured and its real path there
        self._channels = asyncio.Semaphore(_COMMAND_CHANNELS)

    # -- connection -------------------------------------------------------------------------

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]:
        """The open connection and its SFTP session; (re)connects when there is none."""
        async with self._lock:
            if self._conn is not None and self._sftp is not None and not self._conn.is_closed():
                return self._conn, self._sftp
            await self._drop()
            t = self.target
            where = f"{t.user}@{t.host}:{t.port}"
            try:
                key = t.key()
            except Exception as exc:  # the loader's message names the credential, never a key
                raise ConnectionError(errno.EACCES, f"ssh {where}: no client key: {exc}") from exc
            try:
                known: Any = str(t.known_hosts) if t.known_hosts is not None else ()
                conn = await asyncssh.connect(
                    t.host, port=t.port, username=t.user, client_keys=[key],
                    known_hosts=known, agent_path=None, password=None,
                    kbdint_auth=False, gss_auth=False, host_based_auth=False,
                    connect_timeout=t.connect_timeout_s, config=None, keepalive_interval=30,
                )  # fmt: skip
            except (OSError, asyncssh.Error) as exc:
                raise ConnectionError(errno.ECONNREFUSED, f"ssh {where}: {exc}") from exc
            try:
                sftp = await conn.start_sftp_client()
                real = await sftp.realpath(t.root)
                if not stat.S_ISDIR(_mode(await sftp.stat(real))):
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", t.root)
            except asyncssh.SFTPError as exc:
                conn.close()
                raise _os_error(exc, f"{where}:{t.root}") from exc
            except BaseException:
                conn.close()
                raise
            self._conn, self._sftp = conn, sftp
            self._roots = (posixpath.normpath(t.root), real)
            return conn, sftp

    async def _drop(self) -> None:
        conn, self._conn, self._sftp = self._conn, None, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    async def close(self) -> None:
        """End the connection (a later call opens a new one)."""
        async with self._lock:
            await self._drop()

    async def _sftp_call(self, shown: str, call: Callable[[asyncssh.SFTPClient], Any]) -> Any:
        """``call(sftp)`` with SFTP failures as ``OSError``s; a lost connection is dropped (the
        next call reconnects)."""
        _, sftp = await self._connect()
        try:
            return await call(sftp)
        except asyncssh.SFTPError as exc:
            err = _os_error(exc, shown)
            if isinstance(err, ConnectionResetError):
                await self.close()
            raise err from exc
        except _LOST as exc:
            await self.close()
            raise ConnectionResetError(errno.ECONNRESET, f"ssh connection lost: {exc}") from exc

    async def _lstat(self, shown: str, path: str) -> asyncssh.SFTPAttrs:
        attrs: asyncssh.SFTPAttrs = await self._sftp_call(shown, lambda s: s.lstat(path))
        return attrs

    async def _readlink(self, shown: str, path: str) -> str:
        target: str = await self._sftp_call(shown, lambda s: s.readlink(path))
        return target

    async def _readdir(self, shown: str, path: str) -> list[asyncssh.SFTPName]:
        names: list[asyncssh.SFTPName] = await self._sftp_call(shown, lambda s: s.readdir(path))
        return names

    async def _exists(self, shown: str, path: str) -> asyncssh.SFTPAttrs | None:
        try:
            return await self._lstat(shown, path)
        except FileNotFoundError:
            return None

    async def _mkdir(self, shown: str, path: str) -> None:
        attrs = asyncssh.SFTPAttrs(permissions=_DIR_MODE)
        await self._sftp_call(shown, lambda s: s.mkdir(path, attrs))

    # -- confinement ------------------------------------------------------------------------

    def _pending(self, workspace: Path, path: Path | str) -> list[str]:
        """The components of ``path`` below the run's ``workspace`` (last first)."""
        given = os.fspath(path)
        if not given.startswith("/"):
            return given.split("/")[::-1]
        rest = _below(os.fspath(workspace), given)
        if rest is None:
            raise PathEscape(errno.EPERM, f"{given!r} is outside the workspace {workspace}", given)
        return rest

    async def _resolve(
        self, workspace: Path, path: Path | str, *, make_dirs: bool = False
    ) -> tuple[str, asyncssh.SFTPAttrs | None]:
        """The remote path ``path`` names, reached from the root without leaving it (symlinks
        followed only inside), and its attributes (``None``: nothing there yet). Missing
        directories on the way are created with ``make_dirs``."""
        await self._connect()
        root = self._roots[1]
        given = os.fspath(path)
        pending = self._pending(workspace, path)
        names: list[str] = []
        budget = MAX_LINKS
        via = repr(given)
        while True:
            name = pending.pop() if pending else ""
            if name == "..":
                if not names:
                    raise PathEscape(errno.EPERM, f"{via} climbs above the workspace", given)
                names.pop()
                continue
            here = posixpath.join(root, *names)
            if name in ("", "."):
                if pending:
                    continue
                attrs = await self._lstat(given, here)
                return here, attrs
            here = posixpath.join(here, name)
            try:
                attrs = await self._lstat(given, here)
            except FileNotFoundError:
                if not pending:
                    return here, None
                if not make_dirs:
                    raise
                try:
                    await self._mkdir(given, here)
                except OSError:
                    # made concurrently (then it is there now), or it cannot be made
                    if await self._exists(given, here) is None:
                        raise
                pending.append(name)
                continue
            mode = _mode(attrs)
            if stat.S_ISLNK(mode):
                budget -= 1
                if budget < 0:
                    raise OSError(errno.ELOOP, f"more than {MAX_LINKS} symlinks", given)
                target = await self._readlink(given, here)
                via = f"the symlink {'/'.join([*names, name])!r} -> {target!r}"
                if target.startswith("/"):
                    rest = next(
                        (r for r in (_below(b, target) for b in self._roots) if r is not None),
                        None,
                    )
                    if rest is None:
                        raise PathEscape(errno.EPERM, f"{via} leads outside the workspace", given)
                    names = []
                    pending.extend(rest)
                else:
                    pending.extend(reversed(target.split("/")))
                continue
            if pending and not stat.S_ISDIR(mode):
                if all(p in ("", ".") for p in pending):
                    pending.clear()  # a trailing slash
                else:
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", given)
            names.append(name)
            if not pending:
                return here, attrs

    async def resolve(self, workspace: Path, path: str) -> Path:
        """:func:`~nanocrab.tools.paths.resolve_in_workspace` on the remote tree: ``path``
        joined to the workspace (an absolute one may also be spelled from the remote root),
        symlinks resolved on the remote host (a missing part taken as it is, like
        ``os.path.realpath``), the answer a path under the run's ``workspace``. Raises the same
        ``ToolError`` s, and ``unavailable`` when the host cannot be reached."""
        if not path or not path.strip():
            raise ToolError(
                "invalid_arguments", "The path is empty; give a path inside the workspace."
            )
        if "\x00" in path:
            raise ToolError("invalid_arguments", f"The path {path!r} contains a NUL byte.")
        base = os.fspath(workspace)
        outside = ToolError(
            "path_escape",
            f"Path {path!r} resolves outside the workspace {base}; "
            "only paths inside the workspace are allowed (relative paths are joined to it).",
        )
        try:
            await self._connect()
            real = self._roots[1]
            pending = path.split("/")[::-1]
            if path.startswith("/"):
                found = (_below(b, path) for b in (base, *self._roots))
                rest = next((r for r in found if r is not None), None)
                if rest is None:
                    raise outside
                pending = rest
            names: list[str] = []
            missing_from: int | None = None  # names from here on do not exist (lexical)
            budget = MAX_LINKS
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if not names:
                        raise outside
                    names.pop()
                    if missing_from is not None and len(names) <= missing_from:
                        missing_from = None
                    continue
                if missing_from is not None:
                    names.append(name)
                    continue
                here = posixpath.join(real, *names, name)
                try:
                    attrs = await self._lstat(path, here)
                except ConnectionError:
                    raise
                except OSError:
                    missing_from = len(names)
                    names.append(name)
                    continue
                if not stat.S_ISLNK(_mode(attrs)):
                    names.append(name)
                    continue
                budget -= 1
                if budget < 0:
                    raise ToolError(
                        "failed", f"Path {path!r} has more than {MAX_LINKS} symbolic links."
                    )
                target = await self._readlink(path, here)
                if target.startswith("/"):
                    found = (_below(b, target) for b in self._roots)
                    rest = next((r for r in found if r is not None), None)
                    if rest is None:
                        raise outside
                    names = []
                    missing_from = None
                    pending.extend(rest)
                else:
                    pending.extend(reversed(target.split("/")))
        except ConnectionError as exc:
            raise ToolError(
                "unavailable", f"The workspace's host cannot be reached: {exc.strerror or exc}."
            ) from exc
        except OSError as exc:
            raise ToolError(
                "failed", f"Could not resolve {path!r}: {exc.strerror or exc}."
            ) from exc
        return Path(base, *names)

    async def _linked(self, workspace: Path, rel: str) -> FileInfo | None:
        """What the symlink at ``rel`` leads to; ``None`` when it dangles or leads out."""
        try:
            _, attrs = await self._resolve(workspace, rel)
        except OSError:
            return None
        return None if attrs is None else _info(attrs)

    # -- files ------------------------------------------------------------------------------

    async def read_bytes(self, path: Path, *, workspace: Path) -> bytes:
        remote, attrs = await self._resolve(workspace, path)
        if attrs is None:
            raise FileNotFoundError(errno.ENOENT, "No such file", os.fspath(path))
        if stat.S_ISDIR(_mode(attrs)):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))

        async def read(sftp: asyncssh.SFTPClient) -> bytes:
            async with sftp.open(remote, "rb", encoding=None) as f:
                data: bytes = await f.read()
                return data

        data: bytes = await self._sftp_call(os.fspath(path), read)
        return data

    async def write_bytes(self, path: Path, data: bytes, *, workspace: Path) -> None:
        shown = os.fspath(path)
        remote, attrs = await self._resolve(workspace, path, make_dirs=True)
        if attrs is not None and stat.S_ISDIR(_mode(attrs)):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", shown)
        mode = _NEW_FILE_MODE if attrs is None else stat.S_IMODE(attrs.permissions or 0o644)
        folder, name = posixpath.split(remote)
        tmp = posixpath.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")

        async def write(sftp: asyncssh.SFTPClient) -> None:
            try:
                async with sftp.open(
                    tmp, "xb", asyncssh.SFTPAttrs(permissions=0o600), encoding=None
                ) as f:
                    await f.write(data)
                    with contextlib.suppress(asyncssh.SFTPOpUnsupported):
                        await f.fsync()
                await sftp.chmod(tmp, mode)
                await sftp.posix_rename(tmp, remote)
            except BaseException:
                with contextlib.suppress(Exception):
                    await sftp.remove(tmp)
                raise

        await self._sftp_call(shown, write)

    async def stat(self, path: Path, *, workspace: Path) -> FileInfo | None:
        try:
            _, attrs = await self._resolve(workspace, path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if attrs is None else _info(attrs)

    async def list_dir(self, path: Path, *, workspace: Path) -> list[DirEntry]:
        shown = os.fspath(path)
        remote, attrs = await self._resolve(workspace, path)
        if attrs is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", shown)
        if not stat.S_ISDIR(_mode(attrs)):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", shown)
        rel = posixpath.relpath(remote, self._roots[1])
        found = await self._readdir(shown, remote)
        entries = []
        for n in found:
            name = str(n.filename)
            if name in (".", ".."):
                continue
            mode = _mode(n.attrs)
            if stat.S_ISLNK(mode):
                info = await self._linked(workspace, posixpath.normpath(posixpath.join(rel, name)))
                is_dir = info is not None and info.is_dir
                size = 0 if info is None else info.size
            else:
                is_dir = stat.S_ISDIR(mode)
                size = 0 if is_dir else (n.attrs.size or 0)
            entries.append(DirEntry(name=name, is_dir=is_dir, size=size))
        return entries

    async def walk(
        self, root: Path, *, workspace: Path, prune: Collection[str] = ()
    ) -> AsyncGenerator[WalkEntry, None]:
        try:
            top, attrs = await self._resolve(workspace, root)
        except PathEscape:
            raise
        except OSError:
            return  # an unreadable root is skipped like any unreadable directory
        if attrs is None or not stat.S_ISDIR(_mode(attrs)):
            return
        base = os.fspath(root)
        real = self._roots[1]
        pending: list[tuple[str, str]] = [(top, "")]  # (remote directory, rel), last first
        while pending:
            remote, rel = pending.pop()
            try:
                if rel:  # entered by name: skip one swapped for a symlink since it was listed
                    now = await self._lstat(remote, remote)
                    if not stat.S_ISDIR(_mode(now)):
                        continue
                found = await self._readdir(remote, remote)
            except OSError:
                continue
            subdirs = []
            for n in sorted(found, key=lambda n: str(n.filename)):
                name = str(n.filename)
                if name in (".", "..") or name in prune:
                    continue
                entry_rel = f"{rel}/{name}" if rel else name
                mode = _mode(n.attrs)
                is_symlink = stat.S_ISLNK(mode)
                if is_symlink:
                    below = posixpath.relpath(posixpath.join(remote, name), real)
                    info = await self._linked(workspace, below)
                    is_dir = info is not None and info.is_dir
                else:
                    is_dir = stat.S_ISDIR(mode)
                yield WalkEntry(
                    path=Path(os.path.join(base, entry_rel)),
                    rel=entry_rel,
                    is_dir=is_dir,
                    is_symlink=is_symlink,
                )
                if is_dir and not is_symlink:
                    subdirs.append((posixpath.join(remote, name), entry_rel))
            pending.extend(reversed(subdirs))

    # -- processes --------------------------------------------------------------------------

    async def run_process(
        self,
        command: str,
        *,
        cwd: Path,
        timeout_s: float,
        cancel: asyncio.Event,
        on_output: OutputSink,
        env: dict[str, str] | None = None,
        confinement: Confinement | None = None,
    ) -> ProcessOutcome:
        """Run ``command`` with ``/bin/sh -c`` in the remote root (``cwd`` is the run's
        workspace, which maps to it); the contract is
        :func:`~nanocrab.tools.process.run_local_process`'s. ``env`` replaces the remote
        environment; ``None`` keeps the remote login's (this process's never travels)."""
        if confinement is not None:
            raise SandboxUnavailable(
                f"commands on the ssh backend ({self.target.host}) run without the "
                "operating-system sandbox"
            )
        started = time.monotonic()
        if cancel.is_set():
            return ProcessOutcome(
                exit_code=None, timed_out=False, aborted=True, duration_ms=0.0, output=b""
            )
        async with self._channels:
            return await self._command(command, timeout_s, cancel, on_output, env, started)

    async def _command(
        self,
        command: str,
        timeout_s: float,
        cancel: asyncio.Event,
        on_output: OutputSink,
        env: dict[str, str] | None,
        started: float,
    ) -> ProcessOutcome:
        conn, _ = await self._connect()
        root = self._roots[1]
        channel = Channel(self.max_output_bytes)
        try:
            # sshd counts a session against MaxSessions until it has cleaned it up, a moment
            # after the channel closed on our side: a refused open is tried again, briefly
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(asyncssh.ChannelOpenError),
                wait=wait_exponential(multiplier=0.05, max=0.5),
                stop=stop_after_delay(_CHANNEL_PATIENCE_S),
                reraise=True,
            ):
                with attempt:
                    chan, _ = await conn.create_session(
                        lambda: channel, wrapper(command, root, env), encoding=None
                    )
        except asyncssh.ChannelOpenError as exc:  # refused by the server; the connection is fine
            raise OSError(errno.EAGAIN, f"ssh: the server refused a channel: {exc}") from exc
        except _LOST as exc:
            await self.close()
            raise ConnectionResetError(errno.ECONNRESET, f"ssh: {exc}") from exc
        chan.write_eof()  # stdin: nothing, like /dev/null
        pump = asyncio.create_task(channel.pump(on_output))
        ending: Literal["exited", "timeout", "aborted"] = "aborted"
        try:
            ending = await wait_channel(channel, cancel, pump, timeout_s)
        finally:
            if not channel.exited.is_set():
                await self._kill(conn, channel)
            try:
                await asyncio.wait_for(asyncio.shield(channel.closed.wait()), self.drain_s)
            except TimeoutError:
                chan.close()
            channel.finish()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        return ProcessOutcome(
            exit_code=channel.exit_code if ending == "exited" else None,
            timed_out=ending == "timeout",
            aborted=ending == "aborted",
            duration_ms=(time.monotonic() - started) * 1000,
            output=bytes(channel.output),
            dropped_bytes=channel.dropped,
        )

    async def _kill(self, conn: asyncssh.SSHClientConnection, channel: Channel) -> None:
        """SIGTERM the command's process group, SIGKILL what is left after the grace period."""
        if channel.pid is None:
            return  # it never reported its pid: closing the channel is all there is
        for sig, wait_s in (("TERM", self.kill_grace_s), ("KILL", 1.0)):
            with contextlib.suppress(asyncssh.Error, OSError):
                await conn.run(f"kill -{sig} -- -{channel.pid} 2>/dev/null", check=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(channel.exited.wait()), wait_s)
            if channel.exited.is_set():
                return


def _info(attrs: asyncssh.SFTPAttrs) -> FileInfo:
    is_dir = stat.S_ISDIR(_mode(attrs))
    return FileInfo(is_dir=is_dir, size=0 if is_dir else (attrs.size or 0))
