"""``nanocrab guardrails check "text"``: show what the guardrails chain does to a text.

A typer sub-app (``guardrails_app``) for the coordinator to register with
``app.add_typer(guardrails_app, name="guardrails")``. Declaring it imports only typer: the
guardrails package (detectors, phonenumbers metadata, pydantic models) is imported when the
command runs, so ``nanocrab --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nanocrab.cli.common import JsonOpt, console, err

if TYPE_CHECKING:
    from nanocrab.guardrails import Finding, Verdict

guardrails_app = typer.Typer(
    help="Guardrails: check a text against the filter chain (guardrails.yaml).",
    no_args_is_help=True,
)



@guardrails_app.callback()
def _group() -> None:
    """Guardrails: check a text against the filter chain (guardrails.yaml)."""


_ACTION_STYLE = {
    "allow": "bold green", "alert": "yellow", "redact": "cyan",
    "require_approval": "bold yellow", "block": "bold red",
}  # fmt: skip


@guardrails_app.command("check")
def check_command(
    text: Annotated[str, typer.Argument(help="The text to check; '-' reads standard input.")],
    checkpoint: Annotated[
        str,
        typer.Option(help="task_input | tool_output | tool_call | reply"),
    ] = "tool_output",
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="A guardrails.yaml (default: the bundled chain)."),
    ] = None,
    tool: Annotated[str | None, typer.Option(help="The tool, for tool-scoped filters.")] = None,
    agent: Annotated[str | None, typer.Option(help="The agent, for agent-scoped filters.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the chain on TEXT at a checkpoint: the findings, the action, the redacted text.

    Exit status: 0 allow/alert/redact, 3 require_approval, 4 block, 2 bad configuration.
    """
    from nanocrab.guardrails import (
        CHECKPOINTS,
        CheckContext,
        GuardrailsError,
        check,
        load_guardrails,
    )

    if checkpoint not in CHECKPOINTS:
        err.print(f"[bold red]unknown checkpoint[/] {checkpoint!r}: use {', '.join(CHECKPOINTS)}")
        raise typer.Exit(2)
    try:
        chain = load_guardrails(file)
    except GuardrailsError as exc:
        err.print(f"[bold red]guardrails error:[/] {exc}", soft_wrap=True)
        raise typer.Exit(2) from exc
    body = sys.stdin.read() if text == "-" else text
    verdict = check(chain, checkpoint, body, CheckContext(tool=tool, agent=agent))
    if as_json:
        print(json.dumps(_as_dict(verdict), ensure_ascii=False))
    else:
        _show(verdict, body, chain.source)
    if verdict.action == "block":
        raise typer.Exit(4)
    if verdict.action == "require_approval":
        raise typer.Exit(3)


def _as_dict(verdict: Verdict) -> dict[str, object]:
    """The verdict as JSON-ready data. Matched values are not included (they may be secrets);
    the redacted text and the spans say where they were."""
    return {
        "checkpoint": verdict.checkpoint,
        "action": verdict.action,
        "reason": verdict.reason,
        "filters_run": list(verdict.filters_run),
        "fired": list(verdict.fired),
        "alerts": list(verdict.alerts),
        "findings": [_finding(f) for f in verdict.findings],
        "redactions": verdict.redactions,
        "text": verdict.text,
    }


def _finding(f: Finding) -> dict[str, object]:
    return {
        "filter": f.filter_id, "detector": f.detector, "label": f.label, "kind": f.kind,
        "start": f.start, "end": f.end, "score": f.score, "signals": list(f.signals),
    }  # fmt: skip


def _show(verdict: Verdict, text: str, source: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"guardrails · {verdict.checkpoint} · {source}", title_justify="left")
    for column in ("filter", "detector", "label", "kind", "span", "score", "evidence"):
        table.add_column(column, overflow="fold")
    for f in verdict.findings:
        evidence = ", ".join(f.signals) if f.signals else _preview(text[f.start : f.end], f.label)
        table.add_row(f.filter_id, f.detector, f.label, f.kind, f"{f.start}-{f.end}",
                      f"{f.score:.2f}", escape(evidence))  # fmt: skip
    if verdict.findings:
        console.print(table)
    else:
        console.print(f"[dim]no findings ({len(verdict.filters_run)} filters ran: "
                      f"{', '.join(verdict.filters_run) or 'none'})[/]")  # fmt: skip
    style = _ACTION_STYLE.get(verdict.action, "bold")
    console.print(f"action: [{style}]{verdict.action}[/]"
                  + (f" — {escape(verdict.reason)}" if verdict.reason else ""))  # fmt: skip
    if verdict.alerts:
        console.print(f"alerts: [yellow]{', '.join(verdict.alerts)}[/]")
    if verdict.redactions:
        console.print(f"redacted text ({verdict.redactions} spans):")
        console.print(escape(verdict.text), highlight=False)


def _preview(value: str, label: str) -> str:
    """A matched value for the table: secrets masked, other values shortened."""
    if label in ("SECRET", "PRIVATE_KEY"):
        return value[:4] + "…" if len(value) > 8 else "…"
    value = " ".join(value.split())
    return value if len(value) <= 60 else value[:59] + "…"



@guardrails_app.command("verdicts")
def verdicts_command(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run.")] = None,
    alerts: Annotated[bool, typer.Option("--alerts", help="List alerts instead.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many (the newest).")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """The guardrails' verdicts (``guardrail.checked``) or alerts (``alert.raised``) from the
    guardrails projection: checkpoint, what was checked, the action, the filters that fired."""
    import dataclasses

    from rich.table import Table

    from nanocrab.cli.common import run_async, settings_or_exit
    from nanocrab.cli.host import RuntimeMarker, bus_session, engine_for
    from nanocrab.projections import (
        GuardrailsProjection,
        catch_up_projection,
        guardrail_alert_rows,
        guardrail_verdict_rows,
    )
    from nanocrab.projections.guardrails import AlertRow, VerdictRow

    settings = settings_or_exit()

    async def main() -> tuple[list[VerdictRow], list[AlertRow]]:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                if not RuntimeMarker(settings.home).alive():  # else `nanocrab up` keeps it
                    await catch_up_projection(log, engine, GuardrailsProjection.name)
                if alerts:
                    return [], await guardrail_alert_rows(engine, run_id=run_id, limit=limit)
                return await guardrail_verdict_rows(engine, run_id=run_id, limit=limit), []
            finally:
                await engine.dispose()

    verdict_rows, alert_rows = run_async(main())
    found: list[VerdictRow] | list[AlertRow] = alert_rows if alerts else verdict_rows
    if as_json:
        for row in found:
            print(json.dumps(dataclasses.asdict(row), default=str, ensure_ascii=False))
        return
    if not found:
        where = f" in run {run_id}" if run_id else ""
        err.print(f"no {'alerts' if alerts else 'verdicts'}{where}")
        return
    if alerts:
        table = Table("seq", "time", "run", "severity", "filter", "checkpoint", "summary")
        for a in alert_rows:
            table.add_row(str(a.seq), f"{a.time:%H:%M:%S}", a.run_id[-8:], a.severity,
                          a.filter_id, a.checkpoint or "", a.summary)  # fmt: skip
    else:
        table = Table("seq", "time", "run", "checkpoint", "target", "action", "fired", "reason")
        for v in verdict_rows:
            style = _ACTION_STYLE.get(v.action, "")
            table.add_row(
                str(v.seq), f"{v.time:%H:%M:%S}", v.run_id[-8:], v.checkpoint,
                (f"{v.tool} " if v.tool else "") + v.target_id[-10:],
                f"[{style}]{v.action}[/]", v.fired, v.error or v.reason,
            )  # fmt: skip
    console.print(table)
