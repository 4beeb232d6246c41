"""A structured call cannot fill the host's disk through its channel: the guest gets no writable
host directory for its result, which comes back as a frame on stdout held in memory up to
``Limits.result_bytes`` (nanocrab/sandbox/channel.py). Shares the session's compiled-interpreter
cache with test_sandbox.py.

Found by an adversarial pass: a Safe ``python`` call wrote 3 GiB into its writable
``/.nanocrab`` directory (``/tmp/nanocrab-call-*``) before stopping itself.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nanocrab.events import TextBlock
from nanocrab.sandbox import Limits, Sandbox, call_function, run_python
from nanocrab.sandbox.channel import LENGTH_DIGITS, ResultChannel
from nanocrab.tools.python import PythonArgs, PythonTool
from tests.test_tools_support import make_ctx

MiB = 2**20
CAP = 1 * MiB
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
ENVELOPE = len(json.dumps({"ok": True, "value": ""}))  # the wrapper's frame around a string


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    box = Sandbox(tmp_path_factory.getbasetemp() / "sandbox-cache")
    box.warm()
    return box


@pytest.fixture
def call_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where this test's calls create their io directories (``nanocrab-call-*``)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue  # removed while walking
    return total


@contextmanager
def peak_size(root: Path) -> Iterator[list[int]]:
    """Polls the disk use under ``root`` from a thread while the block runs: ``[peak]``."""
    seen = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen[0] = max(seen[0], _size(root))
            stop.wait(0.001)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield seen
    finally:
        stop.set()
        poller.join()


FILL = """
import os
written, refused = 0, []
def attempt(action):
    try:
        action()
    except OSError as exc:
        refused.append(type(exc).__name__)
def fill():
    global written
    with open('/.nanocrab/fill', 'wb') as f:
        for _ in range(16):
            f.write(b'\\1' * 2**20)
            written += 2**20
attempt(fill)
attempt(lambda: open('/.nanocrab/input.json', 'a').write('x' * 2**20))
attempt(lambda: os.mkdir('/.nanocrab/d'))
attempt(lambda: os.truncate('/.nanocrab/input.json', 2**30))
[written, refused]
"""


async def test_the_channel_is_not_a_writable_host_directory(
    sandbox: Sandbox, call_dirs: Path
) -> None:
    with peak_size(call_dirs) as seen:
        call = await run_python(sandbox, FILL, limits=Limits(result_bytes=CAP))
    assert call.ok, call
    assert call.value == [0, ["PermissionError"] * 4]
    assert seen[0] <= CAP
    assert os.listdir(call_dirs) == []


async def test_a_result_past_the_cap_is_a_typed_error(sandbox: Sandbox, call_dirs: Path) -> None:
    with peak_size(call_dirs) as seen:
        call = await run_python(sandbox, "'x' * (16 * 2**20)", limits=Limits(result_bytes=CAP))
    assert not call.ok and call.value is None
    assert call.channel_error == "too_large"
    assert call.error == "the call wrote more than 1 MiB to its result channel"
    assert seen[0] <= CAP
    assert os.listdir(call_dirs) == []


FORGE = """
import json, os
marker = bytes.fromhex(json.load(open('/.nanocrab/input.json'))['marker'])
refused = 0
for _ in range(4):
    try:
        os.write(1, marker + b'%016x' % (64 * 2**20) + b'0' * 2**20)
    except OSError:
        refused += 1
os._exit(0)
"""


async def test_frames_the_code_forges_are_capped_too(sandbox: Sandbox) -> None:
    call = await run_python(sandbox, FORGE, limits=Limits(result_bytes=CAP))
    assert not call.ok and call.channel_error == "too_large"
    assert call.sandbox.stdout == ""  # nothing of the frames leaked into the code's output


async def test_the_largest_allowed_result_comes_back_intact(sandbox: Sandbox) -> None:
    value = (ALPHABET * CAP)[: CAP - ENVELOPE]
    code = (
        "import atexit, sys\n"
        "print('before', end='\\0nanocrab-result-')\n"  # output that begins like a frame
        "atexit.register(lambda: print('after'))\n"
        f"({ALPHABET!r} * {CAP})[:{CAP - ENVELOPE}]"
    )
    call = await run_python(sandbox, code, limits=Limits(result_bytes=CAP))
    assert call.ok and call.channel_error is None, call.error
    assert call.value == value
    assert call.sandbox.stdout == "before\0nanocrab-result-after\n"
    one_more = await run_python(
        sandbox, f"'x' * {CAP - ENVELOPE + 1}", limits=Limits(result_bytes=CAP)
    )
    assert one_more.channel_error == "too_large"


async def test_call_function_results_use_the_channel(sandbox: Sandbox) -> None:
    source = "def echo(rows):\n    print('rows:', len(rows))\n    return rows\n"
    rows = [{"id": i, "text": "é\u2603" * 10} for i in range(2000)]
    call = await call_function(sandbox, source, "echo", {"rows": rows})
    assert call.ok and call.value == rows
    assert call.sandbox.stdout == "rows: 2000\n"


async def test_the_tool_reports_an_oversized_result(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    tool = PythonTool(tmp_path_factory.getbasetemp() / "sandbox-cache")
    result = await tool.run(PythonArgs(code="'x' * (9 * 2**20)"), make_ctx(tmp_path))
    assert result.is_error and result.error_kind == "failed"
    block = result.content[0]
    assert isinstance(block, TextBlock)
    assert "[error: the call wrote more than 8 MiB to its result channel." in block.text


def test_the_channel_splits_output_from_frames_written_a_byte_at_a_time() -> None:
    out = bytearray()
    channel = ResultChannel(100)
    channel.attach(out.extend)
    body = b'{"ok": true}'
    stream = b"ab\0c" + channel.marker + b"%016x" % len(body) + body + b"d\0nanocrab"
    for i in range(len(stream)):
        assert channel(stream[i : i + 1]) == 1
    channel.close()
    assert channel.payload == body and channel.error is None
    assert bytes(out) == b"ab\0cd\0nanocrab"


def test_the_channel_refuses_a_frame_over_the_cap_before_holding_it() -> None:
    channel = ResultChannel(100)
    header = channel.marker + b"%016x" % 101
    assert channel(header[:-1]) == len(header) - 1
    assert channel(header[-1:] + b"x" * 101) < 0  # the guest's write fails (EIO)
    assert channel(b"more output") < 0
    assert channel.error == "too_large" and channel.payload is None
    bad = ResultChannel(100)
    bad(bad.marker + b"z" * LENGTH_DIGITS)
    assert bad.error == "malformed"
