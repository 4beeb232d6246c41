"""What a connector is: host tools reaching a service with credentials the executor keeps.

A connector tool is a :class:`~nanocrab.tools.base.Tool` that also says, from its arguments
alone, what a call touches: :meth:`ConnectorTool.resources` returns resource strings such as
``mail:work/INBOX``, ``mail.to:example.org`` or ``calendar:team``, and ``access`` whether it reads
or writes. The policy matches rules against those strings (``resources:`` globs), grants carry
them as capabilities, the audit shows them. The credential a call needs is named in the
connector's configuration (``connectors.yaml``), resolved inside ``run`` from the executor's
:class:`~nanocrab.connectors.credentials.Credentials`, and never appears in arguments, resources,
results or errors. Every connector tool takes ``dry_run``: the call reports what it would do and
does nothing (it is decided by the policy like the real call).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field, ValidationError

from nanocrab.policy import CallResources
from nanocrab.tools.base import Tool, ToolArgs

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


class ConnectorError(Exception):
    """Root of ``nanocrab.connectors`` errors."""


class ConnectorConfigError(ConnectorError):
    """``connectors.yaml`` cannot be used as written; the message says where and what to fix."""


class ConnectorArgs(ToolArgs):
    """Arguments every connector tool takes."""

    dry_run: bool = Field(
        default=False, description="Report what the call would do, and do nothing."
    )


class ConnectorTool(Tool, Protocol):
    """A tool of a connector. ``connector`` is its family (``mail``); ``access`` what its calls
    do to the service; :meth:`resources` is pure (no I/O, no credentials) so the policy can call
    it wherever it runs."""

    connector: ClassVar[str]
    access: ClassVar[Literal["read", "write"]]

    def resources(self, args: Any) -> tuple[str, ...]:
        """The resources a call with ``args`` (an ``args_model`` instance) touches."""
        ...


def resources_of(tools: Iterable[ConnectorTool]) -> ConnectorResources:
    """The policy's view of ``tools``: tool name and arguments → :class:`CallResources`."""
    return ConnectorResources({tool.name: tool for tool in tools})


class ConnectorResources:
    """Connector tools by name, as the policy handler asks about them."""

    def __init__(self, tools: Mapping[str, ConnectorTool]) -> None:
        self.tools = dict(tools)

    def __call__(self, tool: str, arguments: Mapping[str, Any]) -> CallResources | None:
        """The resources of a call of ``tool``; ``None`` when it is not a connector tool.
        Raises ``ValueError`` (for the model) when the arguments do not validate."""
        connector = self.tools.get(tool)
        if connector is None:
            return None
        try:
            args = connector.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ValueError(f"invalid arguments for {tool}: {problems}") from None
        return CallResources(names=connector.resources(args), access=connector.access)
