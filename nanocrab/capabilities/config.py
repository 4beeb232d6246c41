"""Capability settings (seed 001's ``capability_config``): ``capabilities.yaml`` in the config
directory, typed, loaded safely, rejected with file and line.

Format (every key shown with its default; unknown keys are an error)::

    version: 1
    capability_config:
      model: ""                  # the generator's model ("": NANOCRAB_MODEL / the provider's)
      max_tokens: 4096           # per generation answer
      auto_enable: false         # enable a capability new to the registry as soon as it registers
      enable_dependencies: false # `capabilities enable X` also enables what X requires
      max_attempts: 10           # a request's attempts are capped here
      limits:
        max_source_bytes: 65536  # a generated module's size (at most 64 KiB: carried inline)
        max_tests: 20            # test_* functions per module
        max_capabilities: null   # capabilities in the registry (removed ones not counted)
        test_timeout_s: 5.0      # per test, in the sandbox (seed 001: CPU 5 s)
        test_memory_mb: 100      # per test (seed 001: 100 MB)
        test_fuel: 1000000000    # per test, WebAssembly fuel
        invoke_timeout_s: 10.0   # per invocation (the CLI's and the agent's `capability` tool)
        invoke_memory_mb: 128
        invoke_fuel: 20000000000
      allowed_operations: [fs.read, fs.write]  # permissions a generated module may declare
      forbidden_operations: []                 # refused (overrides the default allow-list;
                                               # listed in both explicitly is an error)

Operations are the permission vocabulary of :data:`nanocrab.capabilities.PERMISSIONS`
(``fs.read``, ``fs.write``, ``net``); seed 001's names (``file_read``, ``file_write``,
``network``) are refused with the name to use instead. A permission is *permitted* when it is
allowed and not forbidden. A module declaring one that is not is refused by the generator
(finding ``permission_forbidden``, back to the model); a registered capability that declares one
(the file changed since) cannot be enabled or invoked. ``net`` is never usable: the sandbox has
no network, whatever this file says.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nanocrab.capabilities.rules import PERMISSIONS
from nanocrab.events import MAX_SOURCE_BYTES
from nanocrab.sandbox import Limits
from nanocrab.yamlfile import parse_model, read_config_text

FILE = "capabilities.yaml"
ENV = "NANOCRAB_CAPABILITIES"

SEED_NAMES = {
    "file_read": "fs.read",
    "file_write": "fs.write",
    "network": "net",
    "net_access": "net",
}
"""Seed 001's operation names, for the error that says what to write instead."""

SEED_KEYS = {
    "sandbox_timeout_seconds": "write limits.test_timeout_s",
    "sandbox_memory_limit_mb": "write limits.test_memory_mb",
    "sandbox_enabled": "drop it: generated code always runs in the sandbox",
    "ai_provider": "drop it: the provider is NANOCRAB_PROVIDER (Claude with ANTHROPIC_API_KEY)",
    "api_key": "drop it: keys come from the environment (ANTHROPIC_API_KEY), never from files",
    "temperature": "drop it: the generator uses the provider's default",
}
"""Seed 001's ``capability_config`` keys that mean something else here, and what to do."""


class CapabilityConfigError(ValueError):
    """``capabilities.yaml`` is unusable; the message starts with ``file:line``."""


def _operations(value: object) -> object:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a list of operation names, e.g. [fs.read]")
    for name in value:
        if name in SEED_NAMES:
            raise ValueError(f"{name!r} is seed 001's name: write {SEED_NAMES[name]!r}")
        if name not in PERMISSIONS:
            raise ValueError(f"unknown operation {name!r}: use {', '.join(sorted(PERMISSIONS))}")
    return tuple(sorted(set(value)))


class CapabilityLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_source_bytes: int = Field(default=MAX_SOURCE_BYTES, gt=0, le=MAX_SOURCE_BYTES)
    max_tests: int = Field(default=20, gt=0, le=100)
    max_capabilities: int | None = Field(default=None, gt=0)
    test_timeout_s: float = Field(default=5.0, gt=0, le=600)
    test_memory_mb: int = Field(default=100, ge=16, le=4096)
    test_fuel: int = Field(default=1_000_000_000, gt=0)
    invoke_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    invoke_memory_mb: int = Field(default=128, ge=16, le=4096)
    invoke_fuel: int = Field(default=20_000_000_000, gt=0)

    def tests(self) -> Limits:
        """The sandbox limits of one ``test_*`` function."""
        return Limits(
            fuel=self.test_fuel,
            timeout_s=self.test_timeout_s,
            memory_bytes=self.test_memory_mb * 2**20,
        )

    def invocations(self, *, output_bytes: int = 32 * 1024) -> Limits:
        """The sandbox limits of one invocation."""
        return Limits(
            fuel=self.invoke_fuel,
            timeout_s=self.invoke_timeout_s,
            memory_bytes=self.invoke_memory_mb * 2**20,
            output_bytes=output_bytes,
        )


class CapabilityConfig(BaseModel):
    """The ``capability_config`` section; the defaults are what runs without a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = ""
    max_tokens: int = Field(default=4096, gt=0, le=64_000)
    auto_enable: bool = False
    enable_dependencies: bool = False
    max_attempts: int = Field(default=10, ge=1, le=10)
    limits: CapabilityLimits = CapabilityLimits()
    allowed_operations: tuple[str, ...] = ("fs.read", "fs.write")
    forbidden_operations: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _seed_keys(cls, data: object) -> object:
        if isinstance(data, dict):
            for key, hint in SEED_KEYS.items():
                if key in data:
                    raise ValueError(f"{key} is seed 001's setting: {hint}")
        return data

    _check_operations = field_validator(
        "allowed_operations", "forbidden_operations", mode="before"
    )(_operations)

    @model_validator(mode="after")
    def _no_contradiction(self) -> CapabilityConfig:
        both = sorted(set(self.allowed_operations) & set(self.forbidden_operations))
        if both and "allowed_operations" in self.model_fields_set:  # the default yields
            raise ValueError(
                f"{', '.join(both)} is both allowed and forbidden: list it in one of "
                "allowed_operations and forbidden_operations"
            )
        return self

    @property
    def permitted(self) -> frozenset[str]:
        """The permissions a capability may declare: allowed and not forbidden."""
        return frozenset(self.allowed_operations) - set(self.forbidden_operations)

    def refused_permissions(self, permissions: Collection[str]) -> list[str]:
        """The declared ``permissions`` this configuration does not permit, sorted."""
        return sorted(set(permissions) - self.permitted)

    def why_refused(self, permissions: Collection[str]) -> str | None:
        """Why a capability declaring ``permissions`` may not be used, or ``None``."""
        refused = self.refused_permissions(permissions)
        if not refused:
            return None
        forbidden = [p for p in refused if p in self.forbidden_operations]
        how = "forbidden_operations lists" if forbidden else "allowed_operations omits"
        return (
            f"it declares {', '.join(map(repr, refused))}, which capability_config "
            f"({FILE}) does not permit ({how} it)"
        )


class CapabilitiesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    capability_config: CapabilityConfig = CapabilityConfig()


def capabilities_file(config_dir: Path, environ: Mapping[str, str] = os.environ) -> Path | None:
    """``NANOCRAB_CAPABILITIES`` (must exist), else ``<config dir>/capabilities.yaml`` when it
    exists, else ``None`` (the defaults)."""
    named = environ.get(ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise CapabilityConfigError(f"{ENV}={named}: no such file")
        return path
    default = config_dir / FILE
    return default if default.is_file() else None


def parse_capability_config(text: str, source: str = FILE) -> CapabilityConfig:
    """The ``capability_config`` of a ``capabilities.yaml`` text; :class:`CapabilityConfigError`
    (``source:line: key: problem``) if anything is wrong, unknown keys included."""
    return parse_model(
        text, source, CapabilitiesFile, CapabilityConfigError, what="capabilities files",
        shape="capabilities.yaml is a mapping with 'version: 1' and 'capability_config'",
    ).capability_config  # fmt: skip


def load_capability_config(path: Path | None) -> CapabilityConfig:
    """The settings in ``path``, or the defaults without one."""
    if path is None:
        return CapabilityConfig()
    text = read_config_text(path, CapabilityConfigError)
    return parse_capability_config(text, str(path))
