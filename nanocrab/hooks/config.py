"""``hooks.yaml``: which extension hooks run, where, on what. Validated and imported at start-up.

Format (unknown keys are an error)::

    hooks:
      - name: trim-context            # unique; the name the log records (hook.applied)
        point: before_model           # before_model | after_tool | run_end
        function: myhooks:trim        # module:function, importable by the runtime
      - name: redact-tokens
        point: after_tool
        function: myhooks:redact
        tools: ["exec", "web_*"]      # after_tool only: fnmatch patterns of tool names
      - name: notify
        point: run_end
        function: myhooks:notify
        agents: ["default"]           # optional: only runs of these agents

Hooks of one point run in file order, each given the previous one's output. The file is
``NANOCRAB_HOOKS``, else ``<home>/hooks.yaml``; without it no hook runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nanocrab.events import HookPoint
from nanocrab.yamlfile import read_yaml


class HookConfigError(ValueError):
    """``hooks.yaml`` is malformed or names a function that cannot be imported."""


class HookSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    point: HookPoint
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    tools: tuple[str, ...] | None = None
    agents: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _tools_for_after_tool(self) -> HookSpec:
        if self.tools is not None and self.point != "after_tool":
            raise ValueError(f"hook {self.name!r}: 'tools' applies to after_tool hooks only")
        return self


class HooksFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hooks: tuple[HookSpec, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> HooksFile:
        names = [h.name for h in self.hooks]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"hook names must be unique: {', '.join(doubled)}")
        return self


def hooks_file(home: Path, env: Mapping[str, str]) -> Path | None:
    """``NANOCRAB_HOOKS`` (must exist), else ``<home>/hooks.yaml`` when it exists."""
    named = env.get("NANOCRAB_HOOKS")
    if named:
        path = Path(named)
        if not path.is_file():
            raise HookConfigError(f"NANOCRAB_HOOKS={named}: no such file")
        return path
    default = home / "hooks.yaml"
    return default if default.is_file() else None


def parse_hooks(data: Any, source: str) -> HooksFile:
    """``data`` (a parsed YAML mapping) as a hooks file; :class:`HookConfigError` says what
    to fix."""
    try:
        return HooksFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors()
        )
        raise HookConfigError(f"{source}: {problems}") from exc


def read_hooks(path: Path) -> HooksFile:
    """The hooks file at ``path``, validated (functions not yet imported)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise HookConfigError(f"{path}: {exc.strerror or exc}") from exc
    data, _ = read_yaml(text, str(path), HookConfigError, what="hooks files")
    return parse_hooks(data, str(path))


def resolve(spec: HookSpec) -> Any:
    """The callable ``spec.function`` names; :class:`HookConfigError` when it is not one."""
    module_name, _, attr = spec.function.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HookConfigError(
            f"hook {spec.name!r}: cannot import {module_name!r} ({exc}); is it on the path "
            f"(PYTHONPATH, {os.getcwd()})?"
        ) from exc
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        raise HookConfigError(f"hook {spec.name!r}: {spec.function} is not a function")
    try:
        inspect.signature(function).bind(None)
    except TypeError as exc:
        raise HookConfigError(
            f"hook {spec.name!r}: {spec.function} must take exactly one argument ({exc})"
        ) from exc
    return function
