"""The connectors file (``connectors.yaml`` in the executor's config directory): typed, loaded
safely, rejected with file and line.

Format (every key shown; unknown keys are an error)::

    version: 1
    credentials_file: credentials.yaml  # default: beside this file; relative to this file
    mail:
      work:                         # the account's name: tools take account: work
        address: me@example.org     # the From of mail.send
        username: me@example.org    # default: address
        password: work-mail         # the NAME of a credential (docs/tools.md), never the value
        imap: {host: imap.example.org, port: 993, security: tls}
        smtp: {host: smtp.example.org, port: 465, security: tls}  # tls | starttls | none
    calendar:
      team:                         # the calendar's name: tools take calendar: team
        path: ~/calendars/team.ics  # an ICS file (created by calendar.add if missing)

``security: none`` (plain text) is accepted only for a loopback host. Names are lower-case
letters, digits, ``_`` and ``-``: they become part of resource strings (``mail:work/INBOX``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nanocrab.connectors.base import NAME, ConnectorConfigError
from nanocrab.connectors.credentials import CREDENTIAL_NAME
from nanocrab.yamlfile import parse_model, read_config_text

FILE = "connectors.yaml"
CREDENTIALS_FILE = "credentials.yaml"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server(BaseModel):
    """Where a mail server listens and how the connection is protected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(min_length=1)
    port: int = Field(gt=0, lt=65536)
    security: Literal["tls", "starttls", "none"] = "tls"

    @model_validator(mode="after")
    def _plain_only_on_loopback(self) -> Server:
        if self.security == "none" and not is_loopback(self.host):
            raise ValueError(
                f"security: none sends the password in clear; it is accepted only for a "
                f"loopback host, not {self.host!r} (use tls or starttls)"
            )
        return self


class MailAccount(BaseModel):
    """One mailbox account: IMAP to read, SMTP to send, one credential for both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    username: str | None = None
    password: str = Field(description="the name of a credential, not its value")
    imap: Server | None = None
    smtp: Server | None = None

    @field_validator("password")
    @classmethod
    def _credential_name(cls, value: str) -> str:
        if not CREDENTIAL_NAME.fullmatch(value):
            raise ValueError(
                "password names a credential (letters, digits, '_', '.', '-'; the value goes "
                "in the credentials file or NANOCRAB_CREDENTIAL_<NAME>)"
            )
        return value

    @property
    def login(self) -> str:
        return self.username or self.address


class Calendar(BaseModel):
    """One calendar: an ICS file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)

    def file(self, base: Path) -> Path:
        path = Path(self.path).expanduser()
        return path if path.is_absolute() else base / path


class ConnectorsConfig(BaseModel):
    """A validated ``connectors.yaml``; ``base`` is the directory relative paths start from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    credentials_file: str = CREDENTIALS_FILE
    mail: dict[str, MailAccount] = {}
    calendar: dict[str, Calendar] = {}

    @field_validator("mail", "calendar")
    @classmethod
    def _names(cls, value: dict[str, object]) -> dict[str, object]:
        for name in value:
            if not NAME.fullmatch(name):
                raise ValueError(
                    f"name {name!r} must be lower-case letters, digits, '_' or '-' "
                    "(^[a-z][a-z0-9_-]{0,31}$): it becomes part of resource strings"
                )
        return value

    def credentials_path(self, base: Path) -> Path:
        path = Path(self.credentials_file).expanduser()
        return path if path.is_absolute() else base / path


def load_connectors(path: Path) -> ConnectorsConfig:
    """The connectors of ``path``; :class:`ConnectorConfigError` with ``file:line`` if wrong."""
    text = read_config_text(path, ConnectorConfigError)
    return parse_model(
        text, str(path), ConnectorsConfig, ConnectorConfigError, what="connectors files",
        shape="connectors.yaml is a mapping with 'version: 1', 'mail' and 'calendar'",
    )  # fmt: skip
