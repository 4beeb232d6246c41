"""Extension hooks: operator code run before a model call, after a tool result and at a run's
end, loaded from ``hooks.yaml``; each hook's effect is recorded as ``hook.applied``
(docs/agent.md, "Extension hooks")."""

from nanocrab.hooks.api import (
    AfterTool,
    BeforeModel,
    ModelContext,
    OnRunEnd,
    RunEnd,
    ToolOutcome,
)
from nanocrab.hooks.config import (
    HookConfigError,
    HooksFile,
    HookSpec,
    hooks_file,
    parse_hooks,
    read_hooks,
)
from nanocrab.hooks.runner import Hook, Hooks

__all__ = [
    "AfterTool",
    "BeforeModel",
    "Hook",
    "HookConfigError",
    "HookSpec",
    "Hooks",
    "HooksFile",
    "ModelContext",
    "OnRunEnd",
    "RunEnd",
    "ToolOutcome",
    "hooks_file",
    "parse_hooks",
    "read_hooks",
]
