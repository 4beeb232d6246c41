"""The hooks handler: runs the ``run_end`` extension hooks when a run ends.

Consumes ``run.completed``, ``run.failed`` and ``run.cancelled``; emits one ``hook.applied`` per
hook that returned a note (or failed), on the run's subject, so the run's replay ends with
them. The ``before_model`` and ``after_tool`` hooks run inside the LLM handler and the
executor, whose steps they extend.

Redelivery: the events' ids derive from the run's end event, so a redelivered end appends
nothing new; the hook itself may run again (at least once), so a hook with an outside effect
(a notification) should tolerate a repeat.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanocrab.bus import Delivery, EventLog
from nanocrab.events import Event, RunCancelled, RunCompleted, RunFailed
from nanocrab.handlers.runloader import RunLoader
from nanocrab.hooks import Hooks, RunEnd


class HooksHandler:
    name = "hooks"
    consumes: tuple[type[Event], ...] = (RunCompleted, RunFailed, RunCancelled)

    def __init__(self, log: EventLog, *, hooks: Hooks) -> None:
        self.log = log
        self.hooks = hooks
        self.loader = RunLoader(log)
        # the run's agent is read only when a hook is limited to some agents
        self._by_agent = any(h.spec.agents is not None for h in hooks.at("run_end"))

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if not event.run_id or not self.hooks.at("run_end"):
            return []
        match event:
            case RunCompleted():
                end = RunEnd(run_id=event.run_id, status="completed", reply=event.reply)
            case RunFailed():
                end = RunEnd(run_id=event.run_id, status="failed", reason=event.reason)
            case RunCancelled():
                end = RunEnd(run_id=event.run_id, status="cancelled", reason=event.reason)
            case _:
                return []
        agent = None
        if self._by_agent:
            state = await self.loader.state(event.run_id)
            agent = state.started.agent if state.started is not None else None
        return await self.hooks.run_end(end, agent=agent)
