"""Host-tool connectors: mail (IMAP/SMTP) and calendar (ICS) tools whose credentials the
executor keeps, named in ``connectors.yaml`` and never shown to the model, an event or the audit.

A connector tool is a :class:`~nanocrab.tools.base.Tool` that also derives, from its arguments,
the resource strings the policy matches (``mail:work/INBOX``, ``mail.to:example.org``,
``calendar:team``). See docs/tools.md, "Connectors".
"""

from typing import TYPE_CHECKING, Any

from nanocrab.connectors.base import (
    ConnectorArgs,
    ConnectorConfigError,
    ConnectorError,
    ConnectorResources,
    ConnectorTool,
    resources_of,
)
from nanocrab.connectors.config import ConnectorsConfig, load_connectors
from nanocrab.connectors.credentials import CredentialError, Credentials, Secret
from nanocrab.connectors.setup import ConnectorsSetup, connectors_file, connectors_setup

if TYPE_CHECKING:
    from nanocrab.connectors.calendar import CalendarAddTool, CalendarListTool, calendar_tools
    from nanocrab.connectors.mail import MailListTool, MailReadTool, MailSendTool, mail_tools

# The tools' modules load their parsers (icalendar ~30 ms, html2text): imported on first use,
# so a command that configures no connector does not pay for them.
_LAZY = {
    "CalendarAddTool": "calendar", "CalendarListTool": "calendar", "calendar_tools": "calendar",
    "MailListTool": "mail", "MailReadTool": "mail", "MailSendTool": "mail", "mail_tools": "mail",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CalendarAddTool",
    "CalendarListTool",
    "ConnectorArgs",
    "ConnectorConfigError",
    "ConnectorError",
    "ConnectorResources",
    "ConnectorTool",
    "ConnectorsConfig",
    "ConnectorsSetup",
    "CredentialError",
    "Credentials",
    "MailListTool",
    "MailReadTool",
    "MailSendTool",
    "Secret",
    "calendar_tools",
    "connectors_file",
    "connectors_setup",
    "load_connectors",
    "mail_tools",
    "resources_of",
]
