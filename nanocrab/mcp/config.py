"""The MCP servers file (``mcp.yaml``): typed, loaded safely, rejected with file and line.

Format (every key shown; unknown keys are an error)::

    version: 1
    secrets_file: ~/.nanocrab/secrets.yaml  # optional: a YAML mapping name -> value
    call_timeout: 60          # seconds a tool call may take (then error_kind "timeout")
    connect_timeout: 15       # seconds to start a server and finish the MCP handshake
    ping_interval: 2          # seconds between liveness pings while an HTTP call runs
    screen_threshold: 0.5     # injection score from which a tool description is withheld
    servers:
      files:                  # the server's name: tools become mcp.files.<tool>
        command: python3      # stdio: a process the executor starts
        args: [-m, my_files_server]
        env:                  # added to a minimal environment (PATH, HOME, ...): never the
          ROOT: /srv/files    # runtime's own variables
          TOKEN: ${FILES_TOKEN}           # from the executor's environment
          API_KEY: {secret: files-key}    # from secrets_file
        cwd: /srv
      search:
        url: https://mcp.example.com/mcp  # streamable HTTP
        headers:
          Authorization: Bearer ${SEARCH_TOKEN}
        enabled: true          # false: declared but not connected

Secrets are *references* here and stay references in every value object, event and listing:
they are resolved (:meth:`McpConfig.resolve`) only when the executor starts a server or opens
its HTTP session, from the environment and the secrets file handed to it. A ``${NAME}`` that is
not set, or a ``secret:`` missing from the file, is an error naming the server and the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator, model_validator

from nanocrab.yamlfile import parse_model, read_config_text, read_yaml

SERVER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpError(Exception):
    """Root of ``nanocrab.mcp`` errors."""


class McpConfigError(McpError):
    """``mcp.yaml`` (or a secret it names) cannot be used as written; the message says where."""


class SecretRef(BaseModel):
    """``{secret: name}``: the value of ``name`` in the secrets file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: str = Field(min_length=1)


Value = str | SecretRef


class ServerSpec(BaseModel):
    """One server: ``command`` (stdio) or ``url`` (streamable HTTP), never both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, Value] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, Value] = {}
    enabled: bool = True

    @model_validator(mode="after")
    def _one_transport(self) -> ServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("a server has either 'command' (stdio) or 'url' (HTTP), not both")
        if self.url is not None:
            if self.args or self.env or self.cwd:
                raise ValueError("'args', 'env' and 'cwd' are for stdio servers ('command')")
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"url {self.url!r} must start with http:// or https://")
        elif self.headers:
            raise ValueError("'headers' are for HTTP servers ('url')")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def where(self) -> str:
        """What the server is, without any secret: the command line or the URL."""
        if self.url is not None:
            return self.url
        return " ".join([self.command or "", *self.args])


class McpConfig(BaseModel):
    """A validated ``mcp.yaml``. Build with :func:`load_mcp_config` or :func:`parse_mcp_config`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    secrets_file: str | None = None
    call_timeout: PositiveFloat = 60.0
    connect_timeout: PositiveFloat = 15.0
    ping_interval: PositiveFloat = 2.0
    screen_threshold: float = Field(default=0.5, gt=0.0, le=1.0)
    servers: dict[str, ServerSpec] = {}

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, ServerSpec]) -> dict[str, ServerSpec]:
        for name in value:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(
                    f"server name {name!r} must be lower-case letters, digits, '_' or '-' "
                    "(^[a-z][a-z0-9_-]{0,31}$): it becomes part of tool names mcp.<server>.<tool>"
                )
        return value

    def enabled(self) -> dict[str, ServerSpec]:
        return {name: spec for name, spec in self.servers.items() if spec.enabled}

    def resolve(
        self, server: str, values: Mapping[str, Value], environ: Mapping[str, str]
    ) -> dict[str, str]:
        """``values`` (a server's ``env`` or ``headers``) with every reference replaced by its
        secret. Raises :class:`McpConfigError` naming the server and key of a missing one."""
        secrets: dict[str, str] | None = None
        out: dict[str, str] = {}
        for key, value in values.items():
            if isinstance(value, SecretRef):
                if secrets is None:
                    secrets = self._secrets(environ)
                if value.secret not in secrets:
                    raise McpConfigError(
                        f"server {server!r}: {key}: secret {value.secret!r} is not in "
                        f"{self.secrets_file or 'a secrets file (set secrets_file)'}"
                    )
                out[key] = secrets[value.secret]
                continue

            def sub(match: re.Match[str], key: str = key) -> str:
                name = match.group(1)
                if name not in environ:
                    raise McpConfigError(
                        f"server {server!r}: {key}: the environment variable {name} is not set"
                    )
                return environ[name]

            out[key] = _REF.sub(sub, value)
        return out

    def _secrets(self, environ: Mapping[str, str]) -> dict[str, str]:
        if self.secrets_file is None:
            return {}
        path = Path(self.secrets_file).expanduser()
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            raise McpConfigError(f"{path}: cannot read the secrets file: {exc}") from exc
        data, _ = read_yaml(text, str(path), McpConfigError, what="secrets files")
        if data is None:
            return {}
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) for k, v in data.items()
        ):
            raise McpConfigError(f"{path}: a secrets file is a mapping of names to strings")
        return {k: str(v) for k, v in data.items()}


def mcp_file(config_dir: Path, environ: Mapping[str, str]) -> Path | None:
    """``NANOCRAB_MCP`` if set (``none``: no MCP servers), else ``<config_dir>/mcp.yaml`` if it
    exists, else ``None``."""
    named = environ.get("NANOCRAB_MCP")
    if named:
        return None if named == "none" else Path(named)
    path = config_dir / "mcp.yaml"
    return path if path.is_file() else None


def load_mcp_config(path: Path) -> McpConfig:
    """The servers of ``path``; :class:`McpConfigError` with ``file:line`` when it is wrong."""
    text = read_config_text(path, McpConfigError)
    return parse_mcp_config(text, str(path))


def parse_mcp_config(text: str, source: str = "<mcp.yaml>") -> McpConfig:
    """``text`` as an ``mcp.yaml``; :class:`McpConfigError` (``source:line: ...``) if wrong."""
    return parse_model(
        text, source, McpConfig, McpConfigError, what="mcp files",
        shape="mcp.yaml is a mapping with 'version: 1' and 'servers'",
    )  # fmt: skip
