"""What a process wiring the agent loop gets from ``connectors.yaml``: the tools, the policy's
view of their resources, and the credentials file to keep every tool away from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nanocrab.connectors.base import ConnectorResources, ConnectorTool, resources_of
from nanocrab.connectors.config import FILE, load_connectors
from nanocrab.connectors.credentials import Credentials


@dataclass(frozen=True)
class ConnectorsSetup:
    """``tools`` for the registry (the executor runs them with its credentials); ``resources``
    for the policy handler; ``protected``: the connectors and credentials files, which no tool
    may read (added to the policy's protected paths)."""

    tools: list[ConnectorTool] = field(default_factory=list)
    resources: ConnectorResources = field(default_factory=lambda: resources_of(()))
    protected: tuple[Path, ...] = ()


def connectors_file(config_dir: Path, environ: Mapping[str, str]) -> Path | None:
    """``NANOCRAB_CONNECTORS`` if set (``none``: no connectors), else
    ``<config_dir>/connectors.yaml`` if it exists, else ``None``."""
    named = environ.get("NANOCRAB_CONNECTORS")
    if named:
        return None if named == "none" else Path(named)
    path = config_dir / FILE
    return path if path.is_file() else None


def connectors_setup(config_dir: Path, environ: Mapping[str, str]) -> ConnectorsSetup:
    """The connectors ``connectors.yaml`` declares (nothing when there is no such file). A bad
    file raises :class:`~nanocrab.connectors.base.ConnectorConfigError` (file:line). Credentials
    are looked up per call, from ``environ`` and the credentials file beside it."""
    path = connectors_file(config_dir, environ)
    if path is None:
        return ConnectorsSetup()
    config = load_connectors(path)
    base = path.parent
    secrets = config.credentials_path(base)
    credentials = Credentials(file=secrets, environ=dict(environ))
    tools: list[ConnectorTool] = []
    # each kind's module (and its parser: html2text, icalendar) only when it is configured
    if config.mail:
        from nanocrab.connectors.mail import mail_tools

        tools.extend(mail_tools(config.mail, credentials))
    if config.calendar:
        from nanocrab.connectors.calendar import calendar_tools

        calendars = {name: cal.file(base) for name, cal in config.calendar.items()}
        tools.extend(calendar_tools(calendars))
    return ConnectorsSetup(tools=tools, resources=resources_of(tools), protected=(path, secrets))
