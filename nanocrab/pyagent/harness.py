"""Running an agent without a bus: its smoke tests (``async def smoke(harness)`` in the agent's
module, run when a new version is validated) and unit tests.

Tools are fakes given per run: a mapping of tool name → function of the arguments returning
the result's text (or a :class:`ToolResult`). A tool not given is denied, as the policy would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nanocrab.events import Event
from nanocrab.pyagent.api import Agent, Context, Request, Response, ToolResult

FakeTool = Callable[[dict[str, Any]], "str | ToolResult"]


class FakeTools:
    """:class:`~nanocrab.pyagent.api.Tools` answered by functions; records every call."""

    def __init__(self, tools: Mapping[str, FakeTool]) -> None:
        self._tools = dict(tools)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        args = dict(arguments or {})
        call_id = f"smoke-{len(self.calls)}"
        self.calls.append((name, args))
        fn = self._tools.get(name)
        if fn is None:
            return ToolResult(tool=name, call_id=call_id, text=f"denied by policy: {name} is "
                              "not available here", is_error=True, denied=True,
                              error_kind="denied")  # fmt: skip
        out = fn(args)
        if isinstance(out, ToolResult):
            return out
        return ToolResult(tool=name, call_id=call_id, text=str(out))


class Harness:
    """Runs ``agent`` on a request with fake tools; keeps what it logged and emitted."""

    def __init__(self, agent: Agent, *, name: str = "agent") -> None:
        self.agent = agent
        self.name = name
        self.events: list[Event] = []
        self.tools = FakeTools({})

    async def run(
        self, text: str, *, tools: Mapping[str, FakeTool] | None = None, run_id: str = "smoke"
    ) -> Response:
        """The agent's answer to ``text``; raises what the agent raises. :attr:`tools` then
        holds the calls it made."""
        self.tools = FakeTools(tools or {})
        request = Request(text=text, run_id=run_id, agent=self.name, tools=self.tools.names)
        context = Context(request, self.tools, self.events.append)
        response = await self.agent.handle(request, context)
        if not isinstance(response, Response):
            raise TypeError(f"handle returned {type(response).__name__}, not a Response")
        return response
