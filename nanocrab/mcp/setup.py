"""What a process wiring the agent loop gets from ``mcp.yaml``: tools, the hub, the alerts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nanocrab.events import AlertRaised
from nanocrab.mcp.config import load_mcp_config, mcp_file

if TYPE_CHECKING:  # the SDK loads only where mcp.yaml declares a server
    from nanocrab.mcp.catalogue import McpCatalogue
    from nanocrab.mcp.client import McpHub
    from nanocrab.mcp.tool import McpResourceTool, McpTool


@dataclass(frozen=True)
class McpSetup:
    """``tools`` for the registry (over ``hub``, which the executor owns and closes);
    ``alerts`` for the executor to append (withheld tools); ``catalogue`` as listed."""

    tools: list[McpTool | McpResourceTool] = field(default_factory=list)
    hub: McpHub | None = None
    alerts: list[AlertRaised] = field(default_factory=list)
    catalogue: McpCatalogue | None = None


def mcp_setup(
    config_dir: Path, environ: Mapping[str, str], *, log_dir: Path | None = None
) -> McpSetup:
    """The MCP servers of ``NANOCRAB_MCP`` or ``<config_dir>/mcp.yaml`` listed and screened
    (nothing when there is no such file). A bad file raises
    :class:`~nanocrab.mcp.config.McpConfigError` (file:line); a server that cannot be reached
    is left out with a warning. ``environ`` resolves ``${NAME}`` references, at listing and
    again whenever the hub connects. ``log_dir``: where stdio servers' stderr goes."""
    path = mcp_file(config_dir, environ)
    if path is None:
        return McpSetup()
    config = load_mcp_config(path)
    if not config.enabled():
        return McpSetup()
    from nanocrab.mcp.catalogue import list_blocking
    from nanocrab.mcp.client import McpHub

    env = dict(environ)
    catalogue = list_blocking(config, env, log_dir=log_dir)
    hub = McpHub(config, env, log_dir=log_dir)
    return McpSetup(
        tools=catalogue.tools(hub), hub=hub, alerts=catalogue.alerts(), catalogue=catalogue
    )
