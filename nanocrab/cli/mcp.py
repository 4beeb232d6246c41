"""``nanocrab mcp list``: the MCP servers of ``mcp.yaml`` and what they offer (docs/mcp.md).

Registers the ``mcp`` sub-app on import. Imports only typer and the CLI's console at module
level; the MCP client loads when the command runs. Secrets are never shown: a server is its
command line or URL, its ``env`` and ``headers`` are not printed.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import typer

from nanocrab.cli.common import JsonOpt, app, console, err

if TYPE_CHECKING:
    from nanocrab.mcp import McpCatalogue

mcp_app = typer.Typer(
    help="MCP servers (mcp.yaml): list their tools, resources and prompts.",
    no_args_is_help=True,
)
app.add_typer(mcp_app, name="mcp")


def rows(catalogue: McpCatalogue) -> list[dict[str, Any]]:
    """One JSON-ready row per server: its tools (agent name, remote name, description,
    ``withheld`` and why), resources, resource templates and prompts; failed servers last."""
    from nanocrab.mcp import agent_name

    flagged = {f.tool: f for f in catalogue.flagged}
    out: list[dict[str, Any]] = []
    for server in catalogue.servers:
        tools = []
        for tool in server.tools:
            name = agent_name(server.name, tool.name)
            f = flagged.get(name)
            tools.append({
                "name": name, "remote": tool.name, "description": tool.description or "",
                "withheld": f is not None,
                "why": f"injection score {f.score:.2f}: {', '.join(f.signals)}" if f else "",
            })  # fmt: skip
        out.append({
            "server": server.name, "transport": server.transport, "where": server.where,
            "tools": tools,
            "resources": [
                {"uri": str(r.uri), "name": r.name, "description": r.description or "",
                 "mime_type": r.mimeType or ""}
                for r in server.resources
            ],
            "templates": [
                {"uri_template": t.uriTemplate, "name": t.name, "description": t.description or ""}
                for t in server.templates
            ],
            "prompts": [
                {"name": p.name, "description": p.description or "",
                 "arguments": [a.name for a in p.arguments or []]}
                for p in server.prompts
            ],
            # the resources tool (mcp.<server>.resources.read) withheld for what they say
            "resources_withheld": any(
                f.server == server.name and f.tool.endswith(".resources.read")
                for f in catalogue.flagged
            ),
            "error": None,
        })  # fmt: skip
    for name, why in catalogue.failed.items():
        out.append({"server": name, "tools": [], "resources": [], "templates": [],
                    "prompts": [], "error": why})  # fmt: skip
    return out


@mcp_app.command("list")
def list_servers(as_json: JsonOpt = False) -> None:
    """Connect to every enabled server of mcp.yaml and list what it offers. Tools withheld
    because their description reads as a prompt injection are marked."""
    from nanocrab.cli.common import settings_or_exit
    from nanocrab.cli.wiring import config_dir
    from nanocrab.mcp import McpConfigError, list_blocking, load_mcp_config, mcp_file

    settings = settings_or_exit()
    path = mcp_file(config_dir(settings), os.environ)
    if path is None:
        err.print(
            f"no MCP servers: no {config_dir(settings) / 'mcp.yaml'} (or NANOCRAB_MCP); "
            "see docs/mcp.md"
        )
        raise typer.Exit(1)
    try:
        config = load_mcp_config(path)
    except McpConfigError as exc:
        err.print(f"[bold red]mcp.yaml error:[/] {exc}")
        raise typer.Exit(2) from exc
    from rich.markup import escape

    listed = rows(list_blocking(config, os.environ, log_dir=settings.home / "mcp-logs"))
    if as_json:
        for row in listed:
            print(json.dumps(row))
        return
    for row in listed:
        if row["error"]:
            console.print(f"[bold]{row['server']}[/]  [red]unavailable:[/] {escape(row['error'])}")
            continue
        console.print(f"[bold]{row['server']}[/]  {row['transport']}  {escape(row['where'])}")
        for t in row["tools"]:
            # text from the server: markup escaped, control characters folded to spaces
            mark = f"  [red]withheld ({escape(t['why'])})[/]" if t["withheld"] else ""
            first = escape(_plain(t["description"])[:80])
            console.print(f"  tool      {escape(t['name'])}  {first}{mark}", highlight=False)
        if row["resources_withheld"]:
            console.print("  [red]resources withheld: their descriptions read as an injection[/]")
        for r in row["resources"]:
            line = f"  resource  {r['uri']}  {r['name']}"
            console.print(escape(_plain(line)), highlight=False)
        for r in row["templates"]:
            line = f"  template  {r['uri_template']}  {r['name']}"
            console.print(escape(_plain(line)), highlight=False)
        for p in row["prompts"]:
            args = f"({', '.join(p['arguments'])})" if p["arguments"] else ""
            line = f"  prompt    {p['name']}{args}  {p['description']}"
            console.print(escape(_plain(line)), highlight=False)


def _plain(text: str) -> str:
    """``text`` on one line, without control characters (terminal escapes)."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())
