"""The ``spawn`` tool: a child run with a restricted tool set and chosen skills.

It is executed by the orchestrator itself (a child run is more agent loop, not a host action):
the executor never runs it. The class exists so the tool has a schema, a catalogue line and a
grant like every other tool.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from nanocrab.events import ORCHESTRATOR_TOOLS
from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult


class SpawnArgs(ToolArgs):
    task: str = Field(description="What the subagent should do and report back, self-contained.")
    agent: str = Field(default="explorer", description="Agent profile of the subagent.")
    tools: list[str] | None = Field(
        default=None, description="Restrict the subagent to these tools (never more than yours)."
    )
    skills: list[str] = Field(default_factory=list, description="Skills to preload for it.")


class SpawnTool:
    name: ClassVar[str] = "spawn"
    group: ClassVar[str] = "agents"
    description: ClassVar[str] = (
        "Start a subagent on a focused sub-task and get its final answer back as this tool's "
        "result. Use it for self-contained investigations; give it everything it needs to know."
    )
    args_model: ClassVar[type[ToolArgs]] = SpawnArgs
    idempotent: ClassVar[bool] = False  # starts a child run

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult.error("internal", "spawn is run by the orchestrator, not the executor")


NATIVE_TOOLS = ORCHESTRATOR_TOOLS  # run by the orchestrator (plan.py: the plan tool)
