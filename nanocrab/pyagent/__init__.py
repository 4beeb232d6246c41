"""Python agents: code answering a run instead of a model (seed 003, docs/agents.md).

* :mod:`.api` — the interface agent code is written against: :class:`Agent`,
  :class:`Request`, :class:`Context`, :class:`Response`, :class:`ToolResult`, :class:`Health`;
* :mod:`.harness` — running an agent with fake tools (smoke tests, unit tests);
* :mod:`.code` — loading a module by path, versioned by content hash;
* :mod:`.smoke` — validating a module in a subprocess with a time limit (hot reload);
* :mod:`.session` — one run of an agent, suspended at each tool call;
* :mod:`.loader` — which Python agent a run has, in the run's configuration version.

The handler hosting agents is ``nanocrab/handlers/pyagent.py``.
"""

from nanocrab.pyagent.api import (
    Agent,
    AgentError,
    Context,
    Health,
    ReplayDiverged,
    Request,
    Response,
    ToolError,
    ToolResult,
    Tools,
)
from nanocrab.pyagent.harness import FakeTools, Harness

__all__ = [
    "Agent",
    "AgentError",
    "Context",
    "FakeTools",
    "Harness",
    "Health",
    "ReplayDiverged",
    "Request",
    "Response",
    "ToolError",
    "ToolResult",
    "Tools",
]
