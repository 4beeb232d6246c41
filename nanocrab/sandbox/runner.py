"""Structured calls into the sandbox: a value in, a JSON value out, stdout left to the code.

The host writes the request to ``input.json`` in a private temporary directory, mounted
**read-only** at :data:`IO_GUEST` for this one invocation, and runs :data:`WRAPPER` (with
``-c``). The wrapper executes the user's code in a fresh ``__main__`` module, then sends the
result back as one frame on file descriptor 1 (:mod:`.channel`), which the host takes out of
stdout and keeps in memory, at most ``Limits.result_bytes``. The guest has no writable
directory of the host's but the mounts it was given: a call cannot fill the host's disk
through its channel.

The guest can forge its own frame; that only lets it misreport its own result. The host checks
its size (as it arrives) and its shape.

Writable mounts are snapshotted (``lstat``, links not followed) before and after the run: the
difference is ``files_written``, and a symlink the run left pointing outside its mount (the
guest cannot create one, but it can rename one that was there) is removed (:mod:`.links`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanocrab.sandbox import links
from nanocrab.sandbox.channel import ChannelError, ResultChannel
from nanocrab.sandbox.limits import Limits, Mount, SandboxError, SandboxResult
from nanocrab.sandbox.runtime import Sandbox

log = logging.getLogger(__name__)

IO_GUEST = "/.nanocrab"
MODULE_NAME = "sandboxed"  # what call_function's source is imported as

_Stat = tuple[int, int, int, int]  # mtime ns, size, inode, lstat mode: links.Snapshot's entries

# Runs as ``python -c WRAPPER``; tracebacks start at the user's first frame.
WRAPPER = r"""
def _nanocrab_main():
    import json, os, sys, types
    with open("/.nanocrab/input.json", encoding="utf-8") as f:
        request = json.load(f)
    dumps, channel = json.dumps, (bytes.fromhex(request["marker"]), sys.stdout, os.write)
    if request["cwd"]:
        os.chdir(request["cwd"])
        os.environ["PWD"] = request["cwd"]
    result = {"ok": True, "value": None}
    created = []
    try:
        result["value"] = _nanocrab_invoke(request, sys, types, created)
    except SystemExit as exc:
        status = exc.code
        result = {"ok": status in (None, 0), "type": "SystemExit", "error": f"SystemExit: {status}"}
        _nanocrab_write(channel, dumps(result))
        raise
    except BaseException as exc:
        if isinstance(exc, MemoryError):  # free what the code holds before reporting
            for module in created:
                module.__dict__.clear()
        kind = type(exc).__name__
        try:
            message = str(exc)
        except Exception:
            message = "(the exception could not be shown)"
        result = {"ok": False, "type": kind, "error": f"{kind}: {message}" if message else kind}
        import linecache, traceback
        source = request["source"]
        linecache.cache[request["filename"]] = (len(source), None, source.splitlines(True), "")
        tb = exc.__traceback__  # from the first frame of the user's code (none: SyntaxError)
        while tb is not None and tb.tb_frame.f_code.co_filename != request["filename"]:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        _nanocrab_write(channel, dumps(result))
        raise SystemExit(1)
    try:
        text = dumps(result)
    except (TypeError, ValueError, RecursionError) as exc:
        value = result["value"]
        try:
            shown = repr(value)[:2000]
        except Exception:
            shown = object.__repr__(value)
        error = f"the value is not JSON-serialisable ({type(value).__name__}: {exc}): {shown}"
        text = dumps({"ok": False, "type": "unserialisable", "error": error})
    _nanocrab_write(channel, text)


def _nanocrab_invoke(request, sys, types, created):
    filename = request["filename"]
    source = request["source"]
    if request["mode"] == "cell":
        import _ast  # the C module: importing ``ast`` would cost ~10 ms of start-up
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        created.append(main)
        tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
        exec(compile(tree, filename, "exec"), main.__dict__)
        if last is None:
            return None
        return eval(compile(_ast.Expression(last.value), filename, "eval"), main.__dict__)
    module = types.ModuleType(request["module"])
    module.__file__ = filename
    sys.modules[request["module"]] = module
    created.append(module)
    exec(compile(source, filename, "exec"), module.__dict__)
    value = getattr(module, request["entry"])(**request["kwargs"])
    if isinstance(value, types.CoroutineType):
        return _nanocrab_drive(value)
    return value


def _nanocrab_drive(coroutine):
    # asyncio cannot start under WASI (no socketpair): step the coroutine by hand.
    try:
        while True:
            if coroutine.send(None) is not None:
                coroutine.close()
                raise RuntimeError("the sandbox has no event loop: an async entry may await "
                                   "coroutines but not asyncio futures, sleeps or tasks")
    except StopIteration as stop:
        return stop.value


def _nanocrab_write(channel, text):
    # One frame on fd 1, after the code's own buffered output (nanocrab/sandbox/channel.py).
    marker, stdout, write = channel
    data = text.encode("utf-8", "surrogatepass")
    try:
        stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        for part in (marker + b"%016x" % len(data), data):
            part = memoryview(part)
            while part:
                part = part[write(1, part):]
    except OSError:  # refused by the host: past the size cap (the host reports it)
        raise SystemExit(1) from None


_nanocrab_main()
"""


@dataclass(frozen=True)
class CallResult:
    """A structured call's result. ``ok`` means the code ran to completion and its value came
    back; ``value`` is that JSON value (``None`` for none). Otherwise ``error`` says why in one
    line: the exception (``"ZeroDivisionError: division by zero"``), the limit that stopped
    the run (``sandbox.outcome`` types it), or a value that is not JSON-serialisable (then
    ``sandbox.outcome`` is still ``"ok"``). ``files_written`` lists files created or changed in
    writable mounts: paths relative to the mount, or ``<guest path>/<relative>`` when there
    are several writable mounts. ``links_removed`` (named the same way) lists symlinks the
    run left pointing outside their mount, which were removed; they are not in
    ``files_written``. ``channel_error`` types a result the host refused: ``too_large``
    (more than ``Limits.result_bytes`` sent back; ``error`` says so) or ``malformed``."""

    sandbox: SandboxResult
    ok: bool
    value: Any
    error: str | None
    files_written: list[str]
    links_removed: list[str] = dataclasses.field(default_factory=list)
    channel_error: ChannelError | None = None


async def run_python(
    sandbox: Sandbox,
    code: str,
    *,
    mounts: Sequence[Mount] = (),
    limits: Limits | None = None,
) -> CallResult:
    """Run ``code`` like a REPL cell: when its last statement is an expression, that value is
    returned (if JSON-serialisable; else ``error`` says it is not and shows its repr)."""
    request = {"mode": "cell", "source": code, "filename": "<cell>"}
    return await _invoke(sandbox, request, mounts, limits)


async def call_function(
    sandbox: Sandbox,
    source: str,
    entry: str,
    kwargs: Mapping[str, Any],
    *,
    mounts: Sequence[Mount] = (),
    limits: Limits | None = None,
) -> CallResult:
    """Import ``source`` as module :data:`MODULE_NAME` in the sandbox and return the JSON value
    of ``entry(**kwargs)``. ``kwargs`` must be JSON-serialisable (:class:`SandboxError` if
    not). An ``async def`` entry is stepped without an event loop (asyncio cannot start under
    WASI): it may await other coroutines, not asyncio sleeps, futures or tasks."""
    request = {
        "mode": "call",
        "source": source,
        "filename": f"<{MODULE_NAME}>",
        "module": MODULE_NAME,
        "entry": entry,
        "kwargs": dict(kwargs),
    }
    return await _invoke(sandbox, request, mounts, limits)


async def _invoke(
    sandbox: Sandbox,
    request: dict[str, Any],
    mounts: Sequence[Mount],
    limits: Limits | None,
) -> CallResult:
    if any(m.guest == IO_GUEST or m.guest.startswith(IO_GUEST + "/") for m in mounts):
        raise SandboxError(f"the guest path {IO_GUEST} is reserved for the call channel")
    request["cwd"] = mounts[0].guest if mounts else None  # "/" is not a preopen: stay there
    channel = ResultChannel((limits or sandbox.limits).result_bytes)
    request["marker"] = channel.marker.hex()
    try:
        encoded = json.dumps(request, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SandboxError(f"the call's arguments are not JSON-serialisable: {exc}") from exc
    writable = [m for m in mounts if m.writable]
    io_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="nanocrab-call-"))
    try:
        before = await asyncio.to_thread(_prepare, io_dir, encoded, writable)
        io_mount = Mount(io_dir, IO_GUEST, writable=False)
        result = await sandbox.run(
            WRAPPER, mounts=[*mounts, io_mount], limits=limits, channel=channel
        )
        files, removed = await asyncio.to_thread(_settle, writable, before)
    finally:
        await asyncio.to_thread(shutil.rmtree, io_dir, ignore_errors=True)
    if channel.error is not None:
        error = _CHANNEL_ERRORS[channel.error].format(mib=channel.cap / 2**20)
        return CallResult(result, False, None, error, files, removed, channel.error)
    return _call_result(result, _parse_result(channel.payload), files, removed)


_CHANNEL_ERRORS: dict[ChannelError, str] = {
    "too_large": "the call wrote more than {mib:g} MiB to its result channel",
    "malformed": "the result channel carried a malformed frame",
}


_Before = tuple[dict[str, _Stat], set[str]]  # a mount's snapshot, its links that point outside


def _prepare(io_dir: Path, encoded: str, writable: Sequence[Mount]) -> list[_Before]:
    (io_dir / "input.json").write_text(encoded, encoding="utf-8")
    snapshots = [(m.host, _snapshot(m.host)) for m in writable]
    return [(snap, links.links_out(host, snap)) for host, snap in snapshots]


def _call_result(
    result: SandboxResult, payload: dict[str, Any], files: list[str], removed: list[str]
) -> CallResult:
    if payload.get("type") == "MemoryError" and result.outcome == "exit_code":
        result = dataclasses.replace(result, outcome="memory")
    if result.outcome not in ("ok", "exit_code"):
        return CallResult(result, False, None, result.detail, files, removed)
    if payload.get("ok") is True and result.outcome == "ok":
        return CallResult(result, True, payload.get("value"), None, files, removed)
    error = payload.get("error")
    if not isinstance(error, str):
        error = (
            "the code exited before returning a result"
            if result.outcome == "ok"
            else f"{result.detail}: {_last_line(result.stderr)}"
        )
    return CallResult(result, False, None, error, files, removed)


def _parse_result(raw: bytes | None) -> dict[str, Any]:
    """The guest's result frame (already within the cap), or ``{"error": ...}`` saying what is
    wrong with it; none is ``{}`` (the guest stopped before sending it)."""
    if raw is None:
        return {}
    try:
        payload = json.loads(raw)
    except ValueError:
        return {"error": "the result is not valid JSON"}
    if not isinstance(payload, dict):
        return {"error": "the result is not a JSON object"}
    return payload


def _last_line(text: str) -> str:
    return next((line for line in reversed(text.splitlines()) if line.strip()), "(no output)")


def _snapshot(root: Path) -> dict[str, _Stat]:
    """(mtime, size, inode, mode) of every file and symlink under ``root``, without following
    links."""
    seen: dict[str, _Stat] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            seen[os.path.relpath(path, root)] = (
                st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode
            )  # fmt: skip
    return seen


def _settle(writable: Sequence[Mount], before: Sequence[_Before]) -> tuple[list[str], list[str]]:
    """What the run changed in each writable mount (``files_written``), after removing the
    symlinks it left pointing outside (``links_removed``)."""
    changed: list[str] = []
    removed: list[str] = []
    for mount, (old, out_before) in zip(writable, before, strict=True):
        prefix = f"{mount.guest}/" if len(writable) > 1 else ""
        now = _snapshot(mount.host)
        for rel in links.new_links_out(mount.host, old, now, out_before):
            del now[rel]  # never reported as written, removed or not
            if links.remove_beneath(mount.host, rel):
                removed.append(prefix + rel)
            else:
                log.warning("could not remove %s, a symlink out of %s", rel, mount.host)
        changed.extend(prefix + rel for rel, stat in sorted(now.items()) if old.get(rel) != stat)
    return changed, removed
