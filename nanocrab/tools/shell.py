"""The ``exec`` tool: a shell command in the workspace, confined, streamed, bounded, killable."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from nanocrab.events import ArtifactRef, ExecDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.confine import Confinement, SandboxFailed, SandboxUnavailable
from nanocrab.tools.process import ProcessOutcome
from nanocrab.tools.text import Tail, truncate_tail

MAX_TIMEOUT_S = 600.0
_PREVIEW_CHARS = 1000


class ExecArgs(ToolArgs):
    command: str = Field(min_length=1, description="Shell command (run with /bin/sh -c).")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Seconds before the command is killed (default set by the runtime; max 600).",
    )


class ExecTool:
    """Runs ``command`` with ``/bin/sh -c`` in the workspace.

    Output (stdout and stderr interleaved) streams to ``ctx.emit_output`` as it arrives. The model
    sees the last ``max_lines`` lines / ``max_bytes`` bytes; when that cuts anything, the full
    output is stored with ``ctx.artifacts`` and the result says so. A non-zero exit is ``failed``,
    a timeout ``timeout``, a set ``ctx.cancel`` ``aborted``; the last two kill the whole process
    tree. The output is shown in every case.

    The command runs in the operating-system sandbox (:mod:`nanocrab.tools.confine`) as
    ``ctx.confinement`` asks (``None``: a Safe call without network). When the host cannot
    confine it, a Safe call is refused (``denied``, saying why and how to opt out) and an
    approved (Guarded/Unsafe) one runs unconfined with a note; a policy that turns the sandbox
    off runs everything unconfined. :class:`ExecDetails` records which happened.
    """

    name: ClassVar[str] = "exec"
    group: ClassVar[str] = "shell"
    description: ClassVar[str] = (
        "Run a shell command in the workspace directory and return its combined stdout and "
        "stderr (the last 2000 lines / 30 KB when longer) and exit code. Commands are killed "
        "after `timeout_s`; background processes do not outlive the command. Redirect long "
        "output to a file and inspect it with read or grep."
    )
    args_model: ClassVar[type[ToolArgs]] = ExecArgs
    idempotent: ClassVar[bool] = False  # a command may do anything

    def __init__(self, *, max_lines: int = 2000, max_bytes: int = 30_000) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes

    async def run(self, args: ExecArgs, ctx: ToolContext) -> ToolResult:
        timeout_s = min(args.timeout_s or ctx.timeout_s, MAX_TIMEOUT_S)
        confinement = ctx.confinement or Confinement()
        unconfined: str | None = None if confinement.required else _OPTED_OUT
        try:
            try:
                outcome = await self._start(args, ctx, timeout_s, confinement)
            except SandboxUnavailable as exc:
                if not confinement.approved:
                    return _refusal(args.command, exc.reason)
                unconfined = f"the sandbox is unavailable on this host: {exc.reason}"
                outcome = await self._start(args, ctx, timeout_s, None)
        except SandboxFailed as exc:
            raise ToolError("failed", f"The sandbox could not be set up: {exc}.") from exc
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ToolError(
                "failed", f"Could not start the shell in {ctx.workspace}: {reason}."
            ) from exc
        return await self._result(args, ctx, timeout_s, outcome, unconfined)

    async def _start(
        self, args: ExecArgs, ctx: ToolContext, timeout_s: float, confinement: Confinement | None
    ) -> ProcessOutcome:
        return await ctx.ops.run_process(
            args.command,
            cwd=ctx.workspace,
            timeout_s=timeout_s,
            cancel=ctx.cancel,
            on_output=ctx.emit_output,
            confinement=confinement if confinement and confinement.required else None,
        )

    async def _result(
        self,
        args: ExecArgs,
        ctx: ToolContext,
        timeout_s: float,
        outcome: ProcessOutcome,
        unconfined: str | None,
    ) -> ToolResult:
        text = outcome.output.decode("utf-8", errors="replace")
        tail = truncate_tail(text, max_lines=self.max_lines, max_bytes=self.max_bytes)
        truncated = tail.truncated or outcome.dropped_bytes > 0
        artifacts: list[ArtifactRef] = []
        if truncated:
            name = f"exec-{ctx.call_id or 'output'}.log"
            preview = tail.text[-_PREVIEW_CHARS:]
            artifacts.append(await ctx.artifacts.put(name, outcome.output, preview=preview))
        body = _body(tail, outcome, artifacts, timeout_s)
        if unconfined is not None and unconfined != _OPTED_OUT:
            body += f"\n\n[ran without the sandbox, as a person approved it: {unconfined}]"
        details = ExecDetails(
            command=args.command,
            exit_code=outcome.exit_code,
            duration_ms=outcome.duration_ms,
            timed_out=outcome.timed_out,
            aborted=outcome.aborted,
            truncated=truncated,
            output_bytes=len(outcome.output) + outcome.dropped_bytes,
            confined=unconfined is None,
            unconfined_reason=unconfined,
        )
        if outcome.timed_out:
            return ToolResult.error("timeout", body, details=details, artifacts=artifacts)
        if outcome.aborted:
            return ToolResult.error("aborted", body, details=details, artifacts=artifacts)
        if outcome.exit_code != 0:
            return ToolResult.error("failed", body, details=details, artifacts=artifacts)
        return ToolResult.text(body, details=details, artifacts=artifacts)


_OPTED_OUT = "the policy turns the exec sandbox off (exec.sandbox: off)"


def _refusal(command: str, reason: str) -> ToolResult:
    message = (
        "refused: this command may only run inside the operating-system sandbox, and this host "
        f"cannot provide it: {reason}. A person can approve running it unconfined (a policy "
        "rule that makes it Guarded), or the operator can turn the sandbox off with "
        "`exec: {sandbox: off}` in the policy file."
    )
    details = ExecDetails(
        command=command, exit_code=None, duration_ms=0.0, confined=False, unconfined_reason=reason
    )
    return ToolResult.error("denied", message, details=details)


def _body(
    tail: Tail, outcome: ProcessOutcome, artifacts: list[ArtifactRef], timeout_s: float
) -> str:
    parts = [tail.text.rstrip("\n") if tail.text else "(no output)"]
    if artifacts:
        total = len(outcome.output) + outcome.dropped_bytes
        kept = ""
        if outcome.dropped_bytes:
            kept = f" (only its last {len(outcome.output)} bytes were kept)"
        parts.append(
            f"[output truncated: showing the last {tail.shown_lines} of {tail.total_lines} lines "
            f"of {total} bytes. The full output{kept} is stored as artifact "
            f"{artifacts[0].key}; to search it, re-run with output redirected to a file in the "
            "workspace and use grep or read.]"
        )
    if outcome.timed_out:
        parts.append(
            f"[timed out after {timeout_s:g} s; the command and its child processes were "
            f"killed. Pass a larger timeout_s (max {MAX_TIMEOUT_S:g}) or split the work.]"
        )
    elif outcome.aborted:
        parts.append("[aborted: the run was cancelled; the command and its children were killed]")
    elif outcome.exit_code is not None and outcome.exit_code < 0:
        parts.append(f"[killed by signal {-outcome.exit_code}]")
    elif outcome.exit_code != 0:
        parts.append(f"[exit code {outcome.exit_code}]")
    return "\n\n".join(parts)
