"""What the configured MCP servers offer: their tools (screened), resources and prompts.

:func:`load_catalogue` connects to every enabled server once, lists what it offers and screens
each tool's description — with the descriptions inside its input schema — through the
guardrails' prompt-injection detector (the ``tool_output`` checkpoint: text from outside the
runtime). A tool whose text scores at or above ``screen_threshold`` is **withheld**: it does not
become an agent tool, and a :class:`Flagged` record says why (the executor appends it as an
``alert.raised``). A server that cannot be reached is recorded in :attr:`McpCatalogue.failed`
and contributes nothing; the others are unaffected.

The listing uses its own short-lived sessions (:func:`list_blocking` runs it in a thread, for
synchronous wiring); calls use the executor's :class:`~nanocrab.mcp.client.McpHub`, which
connects on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp import types as mt

from nanocrab.events import AlertRaised
from nanocrab.guardrails.injection import detect_injection
from nanocrab.mcp.client import Connection, McpCallError, McpHub
from nanocrab.mcp.config import McpConfig
from nanocrab.mcp.tool import PREFIX, RESOURCE_TOOL, McpResourceTool, McpTool, agent_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Flagged:
    """A tool withheld because its description reads as a prompt injection."""

    server: str
    tool: str  # the agent-facing name it would have had
    score: float
    signals: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServerListing:
    """One server's offer, with the text a person needs (descriptions stay untrusted)."""

    name: str
    transport: str
    where: str
    tools: list[mt.Tool] = field(default_factory=list)
    resources: list[mt.Resource] = field(default_factory=list)
    templates: list[mt.ResourceTemplate] = field(default_factory=list)
    prompts: list[mt.Prompt] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class McpCatalogue:
    """The servers' offers; :meth:`tools` builds the agent tools over a hub."""

    servers: list[ServerListing]
    flagged: list[Flagged]
    failed: dict[str, str]  # server -> why it could not be listed

    def tools(self, hub: McpHub) -> list[McpTool | McpResourceTool]:
        """The agent tools (flagged ones left out; a second tool whose folded name collides
        with an earlier one of its server is left out too, with a warning), and per server with
        resources its ``mcp.<server>.resources.read``."""
        withheld = {(f.server, f.tool) for f in self.flagged}
        seen: set[str] = set()
        out: list[McpTool | McpResourceTool] = []
        for server in self.servers:
            reader = resource_tool_name(server.name)
            if (server.resources or server.templates) and (server.name, reader) not in withheld:
                text = McpResourceTool.describe(server.name, server.resources, server.templates)
                out.append(McpResourceTool.of(hub, server.name, text))
            for tool in server.tools:
                name = agent_name(server.name, tool.name)
                if (server.name, name) in withheld:
                    continue
                if name in seen:
                    log.warning("MCP server %s: tool %r folds to %s twice; second one left out",
                                server.name, tool.name, name)  # fmt: skip
                    continue
                seen.add(name)
                out.append(McpTool.of(hub, server.name, tool))
        return out

    def alerts(self) -> list[AlertRaised]:
        """One ``alert.raised`` per withheld tool (``origin: mcp``, the detector's signals as
        labels); the description itself is not repeated in the alert."""
        out = []
        for f in self.flagged:
            out.append(
                AlertRaised(
                    severity="critical",
                    origin="mcp",
                    summary=(
                        f"MCP tool {f.tool} withheld: its description reads as a prompt "
                        f"injection (score {f.score:.2f}; {', '.join(f.signals[:4])})"
                    ),
                    labels=["INJECTION", *f.signals[:8]],
                    score=f.score,
                    tool=f.tool,
                )
            )
        return out


def screened_text(tool: mt.Tool) -> str:
    """Everything of ``tool`` the model would read: its description, title and every string of
    its input schema — values anywhere (``description``, ``enum``, ``default``, ``examples``,
    ``$comment``, ``const``…) and the names of its properties. The schema goes to the model as
    it is, so text hidden in any of them is read (an adversarial pass put an injection in each
    of those the screen did not read, and all six tools were admitted)."""
    parts = [tool.title or "", tool.description or ""]
    parts.extend(_schema_text(tool.inputSchema))
    return "\n".join(p for p in parts if p)


_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""Schema keywords whose keys are names a schema's author chose (a property's name is text the
model reads)."""


def _schema_text(node: Any, names: bool = False) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            if names and isinstance(key, str):
                yield key
            yield from _schema_text(value, names=not names and key in _NAMED)
    elif isinstance(node, list):
        for item in node:
            yield from _schema_text(item)


def screen(server: str, tools: list[mt.Tool], threshold: float) -> list[Flagged]:
    """The tools of ``server`` whose text scores at least ``threshold`` as an injection."""
    flagged = []
    for tool in tools:
        flagged.extend(_flag(server, agent_name(server, tool.name), screened_text(tool), threshold))
    return flagged


def _flag(server: str, tool: str, text: str, threshold: float) -> list[Flagged]:
    return [
        Flagged(server, tool, f.score, tuple(f.signals))
        for f in detect_injection(text, "tool_output")
        if f.score >= threshold
    ]


def resource_tool_name(server: str) -> str:
    return f"{PREFIX}.{server}.{RESOURCE_TOOL}"


async def load_catalogue(
    config: McpConfig, environ: Mapping[str, str], *, log_dir: Path | None = None
) -> McpCatalogue:
    """List every enabled server (concurrently) and screen its tools; see the module docstring.
    ``log_dir``: where stdio servers' stderr goes (:class:`~nanocrab.mcp.client.Connection`)."""
    names = list(config.enabled())

    async def one(name: str) -> ServerListing | str:
        spec = config.servers[name]
        conn = Connection(name, spec, config, environ, log_dir=log_dir)
        try:
            listing = await asyncio.wait_for(conn.list(), 2 * config.connect_timeout)
        except McpCallError as exc:
            return exc.message
        except TimeoutError:
            return f"listing took longer than {2 * config.connect_timeout:g} s"
        finally:
            await conn.close()
        return ServerListing(
            name=name, transport=spec.transport, where=spec.where(), tools=listing.tools,
            resources=listing.resources, templates=listing.templates, prompts=listing.prompts,
        )  # fmt: skip

    results = await asyncio.gather(*(one(n) for n in names))
    threshold = config.screen_threshold
    servers: list[ServerListing] = []
    failed: dict[str, str] = {}
    flagged: list[Flagged] = []
    for name, result in zip(names, results, strict=True):
        if isinstance(result, str):
            log.warning("MCP server %s left out: %s", name, result)
            failed[name] = result
            continue
        servers.append(result)
        flagged.extend(screen(name, result.tools, threshold))
        if result.resources or result.templates:
            listed = McpResourceTool.describe(name, result.resources, result.templates)
            flagged.extend(_flag(name, resource_tool_name(name), listed, threshold))
    for f in flagged:
        log.warning("MCP tool %s withheld: description scores %.2f as an injection", f.tool,
                    f.score)  # fmt: skip
    return McpCatalogue(servers=servers, flagged=flagged, failed=failed)


def list_blocking(
    config: McpConfig, environ: Mapping[str, str], *, log_dir: Path | None = None
) -> McpCatalogue:
    """:func:`load_catalogue` from synchronous code (in a thread with its own event loop, so it
    also works under a running loop). Bounded by the connect and listing timeouts."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-list") as pool:
        listing = load_catalogue(config, environ, log_dir=log_dir)
        return pool.submit(asyncio.run, listing).result()
