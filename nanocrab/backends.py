"""Where an agent's tools run: the operations backends of ``backends.yaml``.

The executor runs file tools and ``exec`` through an operations backend
(:class:`~nanocrab.tools.ops.Operations`): this host's by default, a remote host's over SSH for
the agents ``backends.yaml`` assigns one to. The file lives in the executor's configuration
directory (``NANOCRAB_BACKENDS`` names another; ``none``: no file) and only the executor reads
it: hosts and key locations never reach an event, keys never leave this process.

Format (unknown keys are an error)::

    version: 1
    credentials_file: credentials.yaml  # default: beside this file; relative to this file
    backends:
      buildbox:                         # the backend's name: tool.started says ssh:buildbox
        type: ssh
        host: build.example.org
        port: 22                        # default 22
        user: agent
        key: buildbox-key               # a credential's NAME (its value: the private key in
                                        # OpenSSH or PEM form), or a key file's path (/ or ~)
        known_hosts: ~/.ssh/known_hosts # default; the server's host key must be in it
        workspace: /home/agent/work     # the remote workspace (absolute, must exist)
    agents:
      coder: buildbox                   # runs of agent coder use it; other agents run here

Errors name the file and line (:class:`BackendsError`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nanocrab.connectors.credentials import CREDENTIAL_NAME, Credentials
from nanocrab.yamlfile import parse_model, read_config_text

if TYPE_CHECKING:
    import asyncssh

    from nanocrab.tools.ops import Operations

FILE = "backends.yaml"
CREDENTIALS_FILE = "credentials.yaml"
NAME = r"^[a-z][a-z0-9_-]{0,31}$"


class BackendsError(Exception):
    """``backends.yaml`` is unreadable or invalid (the message names the file and line), or a
    backend's key cannot be had (it names the credential or file, never the key)."""


class SshBackend(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["ssh"]
    host: str = Field(min_length=1)
    port: int = Field(default=22, gt=0, lt=65536)
    user: str = Field(min_length=1)
    key: str = Field(min_length=1, description="a credential's name or a key file's path")
    known_hosts: str | None = None
    workspace: str = Field(min_length=1)

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workspace {value!r} must be an absolute path on the remote host")
        return posixpath.normpath(value)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not _is_path(value) and not CREDENTIAL_NAME.fullmatch(value):
            raise ValueError(
                "key is a credential's name (letters, digits, '_', '.', '-') or a key file's "
                "path (with '/' or starting with '~')"
            )
        return value


def _is_path(value: str) -> bool:
    return "/" in value or value.startswith("~")


class BackendsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    credentials_file: str = CREDENTIALS_FILE
    backends: dict[str, SshBackend] = {}
    agents: dict[str, str] = {}

    @model_validator(mode="after")
    def _names(self) -> BackendsConfig:
        for name in self.backends:
            if not re.fullmatch(NAME, name):
                raise ValueError(f"backend name {name!r} must match {NAME}")
        for agent, backend in self.agents.items():
            if backend not in self.backends:
                raise ValueError(
                    f"agent {agent!r} names backend {backend!r}, which is not one of "
                    f"{sorted(self.backends)}"
                )
        return self

    def credentials_path(self, base: Path) -> Path:
        path = Path(self.credentials_file).expanduser()
        return path if path.is_absolute() else base / path


def load_backends(path: Path) -> BackendsConfig:
    """The backends of ``path``; :class:`BackendsError` with ``file:line`` when it is wrong."""
    text = read_config_text(path, BackendsError)
    return parse_model(
        text, str(path), BackendsConfig, BackendsError, what="backends files",
        shape="backends.yaml is a mapping with 'version: 1', 'backends' and 'agents'",
    )  # fmt: skip


@dataclass(frozen=True)
class Backend:
    """An operations backend an agent's calls run on. ``name`` is what ``tool.started``
    records (``ssh:buildbox``); ``close`` ends its connections."""

    name: str
    ops: Operations
    close: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class BackendsSetup:
    """What the executor gets: the backend of each agent that has one (the others use the
    local backend), and the files no tool may read (this file, its credentials, key files)."""

    by_agent: dict[str, Backend] = field(default_factory=dict)
    protected: tuple[Path, ...] = ()


def backends_file(config_dir: Path, environ: Mapping[str, str]) -> Path | None:
    """``NANOCRAB_BACKENDS`` if set (``none``: no backends), else ``<config_dir>/backends.yaml``
    if it exists, else ``None``."""
    named = environ.get("NANOCRAB_BACKENDS")
    if named:
        return None if named == "none" else Path(named)
    path = config_dir / FILE
    return path if path.is_file() else None


def _key_loader(
    spec: SshBackend, base: Path, credentials: Credentials
) -> tuple[Callable[[], asyncssh.SSHKey], Path | None]:
    """How to load the backend's private key at each connect, and its file if it is one."""
    import asyncssh

    if _is_path(spec.key):
        path = Path(spec.key).expanduser()
        path = path if path.is_absolute() else base / path

        def from_file() -> asyncssh.SSHKey:
            try:
                return asyncssh.read_private_key(path)
            except (OSError, asyncssh.KeyImportError) as exc:
                raise BackendsError(f"cannot read the ssh key file {path}: {exc}") from None

        return from_file, path

    def from_credential() -> asyncssh.SSHKey:
        try:
            secret = credentials.get(spec.key)
            return asyncssh.import_private_key(secret.reveal())
        except asyncssh.KeyImportError:  # its message never quotes the key
            raise BackendsError(f"credential {spec.key!r} is not a private key") from None

    return from_credential, None


def backends_setup(config_dir: Path, environ: Mapping[str, str]) -> BackendsSetup:
    """The backends ``backends.yaml`` declares (none without the file). A bad file raises
    :class:`BackendsError`. Nothing connects here: a backend connects at its first call."""
    path = backends_file(config_dir, environ)
    if path is None:
        return BackendsSetup()
    config = load_backends(path)
    if not config.agents:
        return BackendsSetup(protected=(path,))
    from nanocrab.tools.ssh import SshOperations, SshTarget  # asyncssh: only when used

    base = path.parent
    secrets = config.credentials_path(base)
    credentials = Credentials(file=secrets, environ=dict(environ))
    protected: list[Path] = [path, secrets]
    built: dict[str, Backend] = {}
    for name in sorted(set(config.agents.values())):
        spec = config.backends[name]
        key, key_file = _key_loader(spec, base, credentials)
        if key_file is not None:
            protected.append(key_file)
        known = Path(spec.known_hosts).expanduser() if spec.known_hosts else None
        target = SshTarget(
            host=spec.host, port=spec.port, user=spec.user, root=spec.workspace, key=key,
            known_hosts=known,
        )  # fmt: skip
        ops = SshOperations(target)
        built[name] = Backend(name=f"ssh:{name}", ops=ops, close=ops.close)
    by_agent = {agent: built[name] for agent, name in config.agents.items()}
    return BackendsSetup(by_agent=by_agent, protected=tuple(protected))
