"""Host-tool connectors: mail (IMAP/SMTP) and calendar (ICS) tools whose credentials the
executor keeps, named in ``connectors.yaml`` and never shown to the model, an event or the audit.

A connector tool is a :class:`~nanocrab.tools.base.Tool` that also derives, from its arguments,
the resource strings the policy matches (``mail:work/INBOX``, ``mail.to:example.org``,
``calendar:team``). See docs/tools.md, "Connectors".
"""

from nanocrab.connectors.base import (
    ConnectorArgs,
    ConnectorConfigError,
    ConnectorError,
    ConnectorResources,
    ConnectorTool,
    resources_of,
)
from nanocrab.connectors.calendar import CalendarAddTool, CalendarListTool, calendar_tools
from nanocrab.connectors.config import ConnectorsConfig, load_connectors
from nanocrab.connectors.credentials import CredentialError, Credentials, Secret
from nanocrab.connectors.mail import MailListTool, MailReadTool, MailSendTool, mail_tools
from nanocrab.connectors.setup import ConnectorsSetup, connectors_file, connectors_setup

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
