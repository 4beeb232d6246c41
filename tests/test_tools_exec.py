"""exec and the local process runner: streaming, exit codes, timeouts and aborts that kill the
whole process tree, and truncation with the full output kept as a real JetStream artifact."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from nanocrab.bus import EventLog
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.events import ExecDetails, TextBlock
from nanocrab.tools import (
    ExecArgs,
    ExecTool,
    LocalOperations,
    ToolContext,
    ToolRegistry,
    ToolResult,
    default_tools,
)
from tests.test_tools_support import Recorder, make_ctx, sleep_marker, sleeping

FAST_KILL = LocalOperations(kill_grace_s=0.3, drain_s=0.3)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def exec_(ctx: ToolContext, command: str, **arguments: object) -> ToolResult:
    return await ToolRegistry(default_tools()).invoke(
        "exec", {"command": command, **arguments}, ctx
    )


async def test_success_returns_output_and_details(tmp_path: Path) -> None:
    (tmp_path / "here.txt").write_text("")
    result = await exec_(make_ctx(tmp_path), "ls; echo done")
    assert not result.is_error
    assert text_of(result) == "here.txt\ndone"
    assert isinstance(result.details, ExecDetails)
    assert result.details.exit_code == 0 and result.details.output_bytes == 14
    assert not (result.details.timed_out or result.details.aborted or result.details.truncated)


async def test_output_streams_in_arrival_order(tmp_path: Path) -> None:
    sink = Recorder()
    ctx = make_ctx(tmp_path, emit_output=sink)
    result = await exec_(ctx, "echo a; sleep 0.05; echo b >&2; sleep 0.05; echo c")
    assert sink.chunks == [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")]
    assert text_of(result) == "a\nb\nc"


async def test_output_is_streamed_while_the_command_runs(tmp_path: Path) -> None:
    """The command only finishes after the sink saw its first line: no streaming, no finish."""
    go = tmp_path / "go"

    async def sink(stream: str, chunk: str) -> None:
        if "ready" in chunk:
            go.write_text("")

    ctx = make_ctx(tmp_path, emit_output=sink, timeout_s=5)
    result = await exec_(ctx, "echo ready; while [ ! -e go ]; do sleep 0.01; done; echo finished")
    assert not result.is_error, result
    assert text_of(result) == "ready\nfinished"


async def test_multibyte_characters_split_across_reads_survive(tmp_path: Path) -> None:
    sink = Recorder()
    ctx = make_ctx(tmp_path, emit_output=sink)
    result = await exec_(ctx, r"printf '\303'; sleep 0.05; printf '\251\n'")
    assert sink.text == "é\n"
    assert text_of(result) == "é"


async def test_non_zero_exit_is_failed_and_shows_output(tmp_path: Path) -> None:
    result = await exec_(make_ctx(tmp_path), "echo oops >&2; exit 3")
    assert result.is_error and result.error_kind == "failed"
    assert text_of(result) == "oops\n\n[exit code 3]"
    assert isinstance(result.details, ExecDetails) and result.details.exit_code == 3


async def test_timeout_kills_the_whole_process_tree(tmp_path: Path) -> None:
    sink = Recorder()
    ctx = make_ctx(tmp_path, emit_output=sink, ops=FAST_KILL)
    m = sleep_marker()
    command = (
        f"sleep {m} & echo started; "
        f"setsid sleep {m} & echo started; "
        f"sh -c 'sleep {m} & echo started; sleep {m}' & echo started; "
        f"sleep {m}"
    )
    started = time.monotonic()
    task = asyncio.create_task(exec_(ctx, command, timeout_s=3))
    result = await task
    assert time.monotonic() - started < 50, "it did not wait for the 100 s sleeps"
    assert result.error_kind == "timeout"
    assert "timed out after 3 s" in text_of(result)
    assert isinstance(result.details, ExecDetails)
    assert result.details.timed_out and result.details.exit_code is None
    assert sink.text.count("started") == 4, sink.text
    assert sleeping(m) == []


async def test_processes_ignoring_sigterm_get_sigkill(tmp_path: Path) -> None:
    sink = Recorder()
    ctx = make_ctx(tmp_path, emit_output=sink, ops=FAST_KILL)
    m = sleep_marker()
    command = f"trap '' TERM; sleep {m} & echo started; sleep {m}"
    result = await exec_(ctx, command, timeout_s=0.3)
    assert result.error_kind == "timeout"
    assert sleeping(m) == []


async def test_cancel_aborts_and_kills_the_tree(tmp_path: Path) -> None:
    sink = Recorder()
    ctx = make_ctx(tmp_path, emit_output=sink, ops=FAST_KILL, timeout_s=60)
    m = sleep_marker()
    task = asyncio.create_task(exec_(ctx, f"sleep {m} & echo started; sleep {m}"))
    await sink.wait_for("started")
    started = time.monotonic()
    ctx.cancel.set()
    result = await task
    assert time.monotonic() - started < 50, "it did not wait for the 100 s sleep"
    assert result.error_kind == "aborted"
    assert isinstance(result.details, ExecDetails) and result.details.aborted
    assert text_of(result).startswith("started")
    assert sleeping(m) == []


async def test_cancelled_before_start_runs_nothing(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.cancel.set()
    result = await ExecTool().run(ExecArgs(command="touch ran"), ctx)
    assert result.error_kind == "aborted"
    assert not (tmp_path / "ran").exists()


async def test_cancelling_the_calling_task_kills_the_tree(tmp_path: Path) -> None:
    sink = Recorder()
    ctx = make_ctx(tmp_path, emit_output=sink, ops=FAST_KILL)
    m = sleep_marker()
    task = asyncio.create_task(exec_(ctx, f"sleep {m} & echo started; sleep {m}"))
    await sink.wait_for("started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sleeping(m) == []


async def test_background_jobs_do_not_outlive_the_command(tmp_path: Path) -> None:
    started = time.monotonic()
    m = sleep_marker()
    result = await exec_(make_ctx(tmp_path, ops=FAST_KILL), f"sleep {m} & echo started")
    assert time.monotonic() - started < 50, "it did not wait for the 100 s sleep"
    assert not result.is_error
    assert sleeping(m) == []


async def test_truncation_keeps_the_tail_and_stores_the_full_output(
    tmp_path: Path, log: EventLog
) -> None:
    artifacts = JetStreamArtifacts(log)
    ctx = make_ctx(tmp_path, artifacts=artifacts, call_id="call-1")
    result = await ExecTool(max_lines=100).run(ExecArgs(command="seq 1 5000"), ctx)
    full = "".join(f"{i}\n" for i in range(1, 5001)).encode()
    text = text_of(result)
    assert not result.is_error
    assert text.startswith("4901\n4902\n") and "\n5000\n" in text
    assert "\n4900\n" not in text
    assert len(result.artifacts) == 1
    ref = result.artifacts[0]
    assert ref.key in text and "showing the last 100 of 5000 lines" in text
    assert await artifacts.get(ref) == full
    assert ref.size == len(full) and ref.key.endswith("exec-call-1.log")
    assert ref.preview.endswith("5000\n")
    assert isinstance(result.details, ExecDetails)
    assert result.details.truncated and result.details.output_bytes == len(full)


async def test_byte_cap_also_truncates(tmp_path: Path, log: EventLog) -> None:
    artifacts = JetStreamArtifacts(log)
    ctx = make_ctx(tmp_path, artifacts=artifacts)
    command = "i=0; while [ $i -lt 50 ]; do printf '%0100d\\n' $i; i=$((i+1)); done"
    result = await ExecTool(max_bytes=1010).run(ExecArgs(command=command), ctx)
    shown = text_of(result).split("\n\n[output truncated")[0].split("\n")
    assert [line[-2:] for line in shown] == [str(i) for i in range(40, 50)]
    assert len(await artifacts.get(result.artifacts[0])) == 50 * 101


async def test_runner_memory_cap_keeps_the_last_bytes(tmp_path: Path) -> None:
    ops = LocalOperations(max_output_bytes=1000)
    outcome = await ops.run_process(
        "seq 1 2000", cwd=tmp_path, timeout_s=5, cancel=asyncio.Event(), on_output=Recorder()
    )
    full = "".join(f"{i}\n" for i in range(1, 2001)).encode()
    assert outcome.exit_code == 0
    assert outcome.output == full[-1000:]
    assert outcome.dropped_bytes == len(full) - 1000


async def test_failing_sink_stops_the_command_and_propagates(tmp_path: Path) -> None:
    async def broken(stream: str, chunk: str) -> None:
        raise RuntimeError("sink is down")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="sink is down"):
        await FAST_KILL.run_process(
            "echo hi; sleep 100", cwd=tmp_path, timeout_s=30, cancel=asyncio.Event(),
            on_output=broken,
        )  # fmt: skip
    assert time.monotonic() - started < 50, "it did not wait for the 100 s sleep"


async def test_missing_cwd_is_a_failed_result(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.workspace = tmp_path / "gone"
    result = await exec_(ctx, "true")
    assert result.error_kind == "failed" and "Could not start" in text_of(result)


@pytest.mark.parametrize("timeout_s", [0, -1, 601])
async def test_timeout_bounds_are_validated(tmp_path: Path, timeout_s: float) -> None:
    result = await exec_(make_ctx(tmp_path), "true", timeout_s=timeout_s)
    assert result.error_kind == "invalid_arguments" and "timeout_s" in text_of(result)
