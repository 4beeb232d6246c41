"""The basic policy: grant the agent profile's tools inside the run's workspace, deny the rest.

Consumes ``tool.requested``; emits ``grant.issued`` or ``grant.denied``. Until the capability
policy engine lands this is the only minter of grants: a tool the run's profile (narrowed by the
task) does not list is denied, and so is any path argument that resolves outside the workspace
(realpath + commonpath, symlinks followed — never a string prefix). Redelivery is harmless: the
decision is a function of the request and the run's task, and reactions have derived ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from nanocrab.agents import enabled_tools
from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    Capability,
    Event,
    GrantDenied,
    GrantIssued,
    ToolRequested,
    derive_event_id,
    utcnow,
)
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.workspace import workspace_of
from nanocrab.tools.base import ToolError
from nanocrab.tools.paths import resolve_in_workspace

PATH_ARGUMENTS = ("path",)
GRANT_TTL = timedelta(minutes=10)


class BasicPolicy:
    name = "policy"
    consumes: tuple[type[Event], ...] = (ToolRequested,)

    def __init__(self, log: EventLog, *, default_workspace: Path) -> None:
        self.loader = RunLoader(log)
        self.default_workspace = default_workspace

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        assert isinstance(event, ToolRequested) and event.run_id
        state = await self.loader.state(event.run_id)
        if state.task is None:
            return [self._deny(event, "the run has no task")]
        call = state.call(event.call_id)
        if call is not None and (call.grant is not None or call.denied is not None):
            return []
        if state.terminal:
            return [self._deny(event, f"the run is {state.status}")]
        allowed = enabled_tools(state.task.agent, state.task.tools)
        if event.tool not in allowed:
            return [
                self._deny(
                    event,
                    f"tool {event.tool!r} is not enabled for this run "
                    f"(enabled: {', '.join(allowed)})",
                    rule="profile",
                )
            ]
        workspace = workspace_of(state.task, self.default_workspace)
        resource = str(workspace)
        for key in PATH_ARGUMENTS:
            value = event.arguments.get(key)
            if isinstance(value, str):
                try:
                    resource = str(resolve_in_workspace(workspace, value))
                except ToolError as exc:
                    return [self._deny(event, exc.message, rule="workspace")]
        return [
            GrantIssued(
                grant_id=derive_event_id("grant", event.call_id, 0),
                call_id=event.call_id,
                tool=event.tool,
                capabilities=[Capability(tool=event.tool, resource=resource)],
                scope="step",
                tier="safe",
                expires_at=utcnow() + GRANT_TTL,
            )
        ]

    @staticmethod
    def _deny(event: ToolRequested, reason: str, *, rule: str | None = None) -> GrantDenied:
        return GrantDenied(call_id=event.call_id, tool=event.tool, reason=reason, rule=rule)
