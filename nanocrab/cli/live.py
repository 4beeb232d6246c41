"""Live rendering of a run: turns, tool calls with durations, tokens; and the usage summary."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from nanocrab.bus import Stored
from nanocrab.cli.render import problem
from nanocrab.cli.shown import cleaned
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ContextCompacted,
    GrantDenied,
    GrantIssued,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    MessageQueued,
    PlanCreated,
    PlanStepCompleted,
    PlanStepFailed,
    PlanStepStarted,
    ReplySent,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SecurityRejected,
    SubagentCompleted,
    SubagentSpawned,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolSkipped,
)


def _clip(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _args(arguments: dict[str, object]) -> str:
    return _clip(", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items()), 80)


def line_for(s: Stored) -> Text | None:
    """One human line for an event of a run, or None for events not worth a line."""
    e = s.event
    t = Text()
    match e:
        case None:
            t.append(f"  ! {problem(s)} event at seq {s.seq}: {s.error}", "bold red")
        case TaskSubmitted(text=text):
            t.append("▶ task ", "bold cyan").append(_clip(text, 120))
        case RunStarted(agent=agent, config=config):
            t.append(f"  run started · agent {agent} · config {config[:12] or 'startup'}", "dim")
        case LlmRequested(turn=turn):
            t.append(f"  turn {turn} · asking the model…", "dim")
        case LlmResponded(turn=turn, usage=u, latency_ms=ms, content=content):
            t.append(f"  turn {turn} · ", "blue")
            t.append(f"{u.input_tokens} in / {u.output_tokens} out tokens · {ms:.0f} ms", "dim")
            said = " ".join(b.text for b in content if isinstance(b, TextBlock))
            if said.strip():
                t.append("\n    " + _clip(said, 140), "italic")
        case LlmFailed(kind=kind, message=msg, will_retry=retry, failover_to=target):
            style = "yellow" if retry else "bold red"
            again = f" (moving to {target})" if target else " (retrying)" if retry else ""
            t.append(f"  ! model {kind} error{again}: {_clip(msg)}", style)
        case ContextCompacted(turns_summarised=n):
            t.append(f"  ⋯ context compacted: {n} earlier turns summarised", "yellow")
        case ToolRequested(tool=tool, arguments=args):
            t.append("    → ", "yellow").append(f"{tool}", "bold yellow").append(f"({_args(args)})")
        case GrantDenied(tool=tool, reason=reason):
            t.append(f"    ✗ {tool} denied: {_clip(reason)}", "bold red")
        case ApprovalRequested(tool=tool, tier=tier, approval_id=aid):
            t.append(f"    ⏸ {tool} needs approval ({tier}) · {aid}", "bold yellow")
        case ApprovalGranted(approver=who, remember=remember):
            scope = " for the session" if remember == "session" else ""
            t.append(f"    ✔ approved by {who}{scope}", "green")
        case ApprovalDenied(approver=who, reason=reason):
            t.append(f"    ✗ refused by {who}: {_clip(reason or '-')}", "bold red")
        case ApprovalExpired():
            t.append("    ⌛ approval expired", "yellow")
        case GrantIssued(tool=tool, remembered=True):
            t.append(f"    ✔ {tool} allowed by this session's approval", "dim green")
        case SecurityRejected(rejected_type=kind, reason=reason):
            t.append(f"    ⚠ refused a forged {kind}: {_clip(reason)}", "bold red")
        case ToolCompleted(tool=tool, is_error=is_error, duration_ms=ms, content=content):
            first = next((b.text for b in content if isinstance(b, TextBlock)), "")
            if is_error:
                t.append(f"    ✗ {tool} {e.error_kind or 'error'} · {ms:.0f} ms: ", "red")
                t.append(_clip(first))
            else:
                t.append(f"    ✓ {tool} · {ms:.0f} ms", "green")
        case ToolSkipped(tool=tool, reason=reason):
            t.append(f"    ↷ {tool} skipped ({reason})", "yellow")
        case MessageQueued(mode=mode, text=text):
            t.append(f"  ✉ {mode.replace('_', '-')}: ", "magenta").append(_clip(text))
        case SubagentSpawned(child_run_id=child, task=task):
            t.append(f"    ⇢ subagent {child}: ", "cyan").append(_clip(task))
        case SubagentCompleted(child_run_id=child, is_error=is_error):
            t.append(f"    ⇠ subagent {child} {'failed' if is_error else 'answered'}", "cyan")
        case PlanCreated(steps=steps, revision=rev):
            t.append(f"  ☰ plan{f' (revision {rev})' if rev else ''}: ", "bold cyan")
            t.append(_clip("; ".join(f"{i + 1}. {st.intent}" for i, st in enumerate(steps)), 160))
        case PlanStepStarted(index=i, step=st):
            t.append(f"  ▸ step {i + 1}: ", "cyan").append(_clip(st.intent))
            t.append(f" [{', '.join(st.tools) or 'no tools'}]", "dim")
        case PlanStepCompleted(index=i):
            t.append(f"  ✓ step {i + 1} done", "cyan")
        case PlanStepFailed(index=i, reason=reason, replan=replan):
            t.append(f"  ✗ step {i + 1} failed: {_clip(reason)}", "red")
            t.append("; re-planning" if replan else "", "yellow")
        case ReplySent(text=text):
            t.append("  ◀ reply ", "bold magenta").append(_clip(text, 140))
        case RunCompleted(steps=steps):
            t.append(f"■ run completed in {steps} steps", "bold green")
        case RunFailed(kind=kind, reason=reason):
            t.append(f"■ run failed ({kind}): {reason}", "bold red")
        case RunCancelled(reason=reason):
            t.append(f"■ run cancelled {reason}", "bold yellow")
        case _:
            return None
    return cleaned(t)  # event content is shown, never obeyed (cli/shown.py)


def usage_table(events: list[Stored]) -> Table:
    """Tokens, cost, model time and tool time of a run."""
    responses = [s.event for s in events if isinstance(s.event, LlmResponded)]
    tools = [s.event for s in events if isinstance(s.event, ToolCompleted)]
    table = Table(title="usage", title_justify="left")
    for col in ("turns", "input tok", "output tok", "cache read", "cache write", "cost $",
                "model ms", "tool calls", "tool ms"):  # fmt: skip
        table.add_column(col, justify="right")
    table.add_row(
        str(len(responses)),
        str(sum(r.usage.input_tokens for r in responses)),
        str(sum(r.usage.output_tokens for r in responses)),
        str(sum(r.usage.cache_read_tokens for r in responses)),
        str(sum(r.usage.cache_write_tokens for r in responses)),
        f"{sum(r.cost_usd for r in responses):.4f}",
        f"{sum(r.latency_ms for r in responses):.0f}",
        str(len(tools)),
        f"{sum(t.duration_ms for t in tools):.0f}",
    )
    return table


def print_line(console: Console, s: Stored) -> None:
    line = line_for(s)
    if line is not None:
        console.print(line)
