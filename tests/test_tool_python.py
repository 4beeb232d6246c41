"""The ``python`` tool through the Tool interface: the workspace read-only at /workspace, typed
errors for every limit. Shares the session's compiled-interpreter cache with test_sandbox.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from nanocrab.events import TextBlock
from nanocrab.sandbox import Limits
from nanocrab.tools import ToolRegistry, ToolResult
from nanocrab.tools.python import PythonArgs, PythonTool
from tests.test_tools_support import make_ctx


@pytest.fixture(scope="session")
def tool(tmp_path_factory: pytest.TempPathFactory) -> PythonTool:
    return PythonTool(tmp_path_factory.getbasetemp() / "sandbox-cache")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n")
    return tmp_path


def text(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def test_reads_a_workspace_file(tool: PythonTool, workspace: Path) -> None:
    code = "lines = open('notes.txt').read().split()\nprint(len(lines))\nlines"
    result = await tool.run(PythonArgs(code=code), make_ctx(workspace))
    assert not result.is_error, text(result)
    assert text(result) == 'stdout:\n2\n\nresult: ["alpha", "beta"]'


async def test_cannot_write_the_workspace(tool: PythonTool, workspace: Path) -> None:
    code = "open('/workspace/notes.txt', 'w').write('gone')"
    result = await tool.run(PythonArgs(code=code), make_ctx(workspace))
    assert result.is_error and result.error_kind == "failed"
    assert "PermissionError" in text(result) and "[error: PermissionError:" in text(result)
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\n"
    assert sorted(os.listdir(workspace)) == ["notes.txt"]


async def test_a_timeout_is_typed(tool: PythonTool, workspace: Path) -> None:
    # (the deadline counts the interpreter's start-up too: on a loaded machine the guest may not
    # reach a first print within it, so what was printed before a stop is checked with fuel,
    # which is deterministic, in the next test)
    code = "import time\ntime.sleep(600)"
    result = await tool.run(PythonArgs(code=code, timeout_s=0.5), make_ctx(workspace))
    assert result.is_error and result.error_kind == "timeout"
    assert text(result).endswith(
        "[stopped: timed out after 0.5 s. Pass a larger timeout_s (max 60) or do less work per "
        "call.]"
    )


async def test_other_limits_are_failures(
    tmp_path_factory: pytest.TempPathFactory, workspace: Path
) -> None:
    small = PythonTool(
        tmp_path_factory.getbasetemp() / "sandbox-cache",
        limits=Limits(fuel=500_000_000, memory_bytes=64 * 2**20, output_bytes=100),
    )
    spin_code = "print('started', flush=True)\nwhile True: pass"
    spin = await small.run(PythonArgs(code=spin_code), make_ctx(workspace))
    assert spin.error_kind == "failed" and "stopped: out of fuel" in text(spin)
    assert text(spin).startswith("stdout:\nstarted\n\n["), "what it printed before is kept"
    bomb = await small.run(PythonArgs(code="bytearray(2**30)"), make_ctx(workspace))
    assert bomb.error_kind == "failed" and "stopped: out of memory" in text(bomb)
    flood = await small.run(PythonArgs(code="print('z' * 10_000)"), make_ctx(workspace))
    assert not flood.is_error and "[stdout truncated at 100 bytes]" in text(flood)


async def test_a_value_that_is_not_json_is_reported_not_failed(
    tool: PythonTool, workspace: Path
) -> None:
    result = await tool.run(PythonArgs(code="{1, 2}"), make_ctx(workspace))
    assert not result.is_error and "not JSON-serialisable" in text(result)


async def test_cancel_aborts_the_call(tool: PythonTool, workspace: Path) -> None:
    ctx = make_ctx(workspace)
    call = asyncio.ensure_future(
        tool.run(PythonArgs(code="import time\ntime.sleep(600)", timeout_s=60), ctx)
    )
    await asyncio.sleep(0.2)
    ctx.cancel.set()
    result = await call
    assert result.is_error and result.error_kind == "aborted"


async def test_through_the_registry(tool: PythonTool, workspace: Path) -> None:
    registry = ToolRegistry([tool])
    ok = await registry.invoke("python", {"code": "6 * 7"}, make_ctx(workspace))
    assert text(ok) == "result: 42"
    bad = await registry.invoke("python", {"code": "", "timeout_s": 999}, make_ctx(workspace))
    assert bad.error_kind == "invalid_arguments"
    [spec] = registry.specs()
    assert set(spec.input_schema["properties"]) == {"code", "timeout_s", "write"}


async def test_the_result_carries_typed_details(tool: PythonTool, workspace: Path) -> None:
    from nanocrab.events import PythonDetails

    ok = await tool.run(PythonArgs(code="print('hi')\n1 + 1"), make_ctx(workspace))
    assert isinstance(ok.details, PythonDetails) and ok.details.outcome == "ok"
    assert ok.details.peak_memory_bytes > 0 and ok.details.fuel_used > 0
    stopped = await tool.run(
        PythonArgs(code="while True: pass", timeout_s=0.3), make_ctx(workspace)
    )
    assert isinstance(stopped.details, PythonDetails)
    assert stopped.details.outcome in ("timeout", "out_of_fuel")
