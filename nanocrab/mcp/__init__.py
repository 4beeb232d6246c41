"""MCP client: servers declared in ``mcp.yaml``, their tools as agent tools ``mcp.<server>.<tool>``.

- :mod:`nanocrab.mcp.config` — the file, secrets by reference (``${ENV}``, ``{secret: name}``);
- :mod:`nanocrab.mcp.client` — the sessions the executor owns (stdio and streamable HTTP);
- :mod:`nanocrab.mcp.catalogue` — listing tools, resources and prompts; screening descriptions;
- :mod:`nanocrab.mcp.tool` — a server's tool as a :class:`~nanocrab.tools.base.Tool`;
- :mod:`nanocrab.mcp.setup` — what the wiring takes from ``mcp.yaml``.

Every call goes through the policy (the bundled default asks for approval), the executor and
the audit like any other tool call. docs/mcp.md has the whole story.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanocrab.mcp.catalogue import (
        Flagged,
        McpCatalogue,
        ServerListing,
        list_blocking,
        load_catalogue,
        screen,
    )
    from nanocrab.mcp.client import Connection, McpCallError, McpHub
    from nanocrab.mcp.config import (
        McpConfig,
        McpConfigError,
        McpError,
        SecretRef,
        ServerSpec,
        load_mcp_config,
        mcp_file,
        parse_mcp_config,
    )
    from nanocrab.mcp.setup import McpSetup, mcp_setup
    from nanocrab.mcp.tool import McpResourceTool, McpTool, agent_name

# The MCP SDK takes ~0.5 s to import (it brings its server side along): a process whose
# configuration declares no server, and every command that does not run tools, never loads it.
_WHERE = {
    "Flagged": "catalogue", "McpCatalogue": "catalogue", "ServerListing": "catalogue",
    "list_blocking": "catalogue", "load_catalogue": "catalogue", "screen": "catalogue",
    "Connection": "client", "McpCallError": "client", "McpHub": "client",
    "McpConfig": "config", "McpConfigError": "config", "McpError": "config",
    "SecretRef": "config", "ServerSpec": "config", "load_mcp_config": "config",
    "mcp_file": "config", "parse_mcp_config": "config",
    "McpSetup": "setup", "mcp_setup": "setup",
    "McpResourceTool": "tool", "McpTool": "tool", "agent_name": "tool",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"nanocrab.mcp.{module}"), name)


__all__ = [
    "Connection",
    "Flagged",
    "McpCallError",
    "McpCatalogue",
    "McpConfig",
    "McpConfigError",
    "McpError",
    "McpHub",
    "McpResourceTool",
    "McpSetup",
    "McpTool",
    "SecretRef",
    "ServerListing",
    "ServerSpec",
    "agent_name",
    "list_blocking",
    "load_catalogue",
    "load_mcp_config",
    "mcp_file",
    "mcp_setup",
    "parse_mcp_config",
    "screen",
]
