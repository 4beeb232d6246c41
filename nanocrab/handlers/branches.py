"""A branched session's history: the parent's up to the fork event, shared, never copied.

A session opened by ``session.branched`` (``nanocrab/branching.py``) has no messages of its own
at first. A task of it sees, oldest first:

1. the parent session's history as a task of the parent stored right after the fork event would
   have seen it (its earlier runs' task texts, messages and replies; recursively, when the parent
   is itself a branch), leaving out the run that holds the fork event;
2. that run's own conversation up to and including the fork event, as its model saw it: the
   task, each turn's response and tool results. When the fork falls after a response that asked
   for tools, that turn's results follow; a call with no result by the fork is answered
   "not run", so the model sees a well-formed conversation;
3. the branch's own earlier messages (the ordinary session history).

The parent's log is read once per branch and process (immutable: nothing stored later changes a
prefix). A session's ``session.branched`` counts only when it is stored before the task asking;
front ends append it before the branch's first task, under a new session id.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec

from nanocrab.branching import origin_of
from nanocrab.bus import EventLog
from nanocrab.bus.direct import DirectReader
from nanocrab.events import (
    EventDecodeError,
    GuardrailChecked,
    SessionBranched,
    TextBlock,
    ToolResultBlock,
)
from nanocrab.handlers import conversation
from nanocrab.handlers.runstate import RunState, fold
from nanocrab.llm.base import Message

ParentHistory = Callable[[str, str, int], Awaitable[list[Message]]]
"""(session_id, run to leave out, before sequence) → that session's messages (the index)."""

NOT_RUN = "not run: the session was branched before this call finished"

_V = TypeVar("_V")

CAPACITY = 256
"""Sessions whose origin (or its absence) and fork prefix a process keeps."""


UNSCREENED = "(withheld: not yet screened by the guardrails)"


def unscreened(state: RunState) -> bool:
    """The run waits for a verdict on its task that is not on the log yet."""
    return state.task is not None and state.waiting_for_verdict("task_input", state.task.id)


def fork_conversation(state: RunState) -> list[Message]:
    """The run's conversation as folded (up to the fork), ending well-formed: a response that
    asked for tools is followed by their results (``NOT_RUN`` for any without one). A task the
    run's guardrails have not judged yet is withheld."""
    if state.task is not None and unscreened(state):
        state = dataclasses.replace(
            state, task=msgspec.structs.replace(state.task, text=UNSCREENED)
        )
    if state.task is None:
        return []
    if not state.turns:  # forked before the first model call: the task alone
        text = state.screened("task_input", state.task.id, state.task.text)
        return [Message(role="user", content=[TextBlock(text or "(withheld by a guardrail)")])]
    out = conversation.messages(state)
    last = state.turns[-1] if state.turns else None
    if last is not None and last.response is not None and last.calls:
        results: list[TextBlock | ToolResultBlock] = [
            conversation.result_block(c, state)
            if c.finished
            else ToolResultBlock(tool_use_id=c.call_id, content=[TextBlock(NOT_RUN)], is_error=True)
            for c in last.calls
        ]
        out.append(Message(role="user", content=list(results)))
    return out


def join(*parts: list[Message]) -> list[Message]:
    """Conversations one after the other, consecutive same-role messages merged."""
    merged: list[Message] = []
    for part in parts:
        for m in part:
            if merged and merged[-1].role == m.role:
                merged[-1] = Message(role=m.role, content=[*merged[-1].content, *m.content])
            else:
                merged.append(m)
    return merged


class Branches:
    """Origins and fork prefixes of the sessions a history index is asked about."""

    def __init__(self, log: EventLog, reader: DirectReader, *, capacity: int = CAPACITY) -> None:
        self.log = log
        self.reader = reader
        self.capacity = capacity
        # keyed (tenant, session id): a session of another tenant with the same id is another
        self._origins: OrderedDict[tuple[str, str], tuple[int, SessionBranched] | None] = (
            OrderedDict()
        )
        self._forks: OrderedDict[tuple[str, str], list[Message]] = OrderedDict()
        self.reads = 0
        """Origin lookups that went to the log (the rest were cached)."""

    async def origin(
        self, session_id: str, before_seq: int, *, tenant: str = "default"
    ) -> SessionBranched | None:
        """What opened ``tenant``'s ``session_id``, when it is a branch opened before
        ``before_seq``."""
        key = (tenant, session_id)
        if key in self._origins:
            self._origins.move_to_end(key)
            found = self._origins[key]
        else:
            self.reads += 1
            found = await origin_of(self.log, session_id, tenant=tenant)
            self._remember(self._origins, key, found)
        if found is None or found[0] >= before_seq:
            return None
        return found[1]

    async def history(
        self, session_id: str, before_seq: int, parent: ParentHistory, *, tenant: str = "default"
    ) -> list[Message]:
        """The shared part of a task's history (points 1 and 2 above); ``[]`` for a session
        that is no branch. ``parent``: the history of a session of the same tenant."""
        origin = await self.origin(session_id, before_seq, tenant=tenant)
        if origin is None:
            return []
        key = (tenant, session_id)
        cached = self._forks.get(key)
        if cached is not None:
            self._forks.move_to_end(key)
            return cached
        earlier: list[Message] = []
        if origin.parent_session_id:
            earlier = await parent(
                origin.parent_session_id, origin.parent_run_id, origin.at_seq + 1
            )
        state = await self.run_until(origin, tenant=tenant)
        prefix = join(earlier, fork_conversation(state))
        if not unscreened(state):  # else asked again: the verdict is on its way
            self._remember(self._forks, key, prefix)
        return prefix

    async def run_until(self, origin: SessionBranched, *, tenant: str = "*") -> RunState:
        """The parent run folded from its events up to and including the fork event, with
        every guardrail verdict of the run, later ones too: a text the guardrails redacted or
        blocked after the fork reaches the branch as they left it, never in the original."""
        raw = await self.reader.after(
            self.log.subjects.run(origin.parent_run_id, tenant=tenant), 0
        )
        events = []
        for m in raw:
            try:
                event = self.log.decode(m.data, subject=m.subject)
            except EventDecodeError:
                continue  # not folded anywhere (see runloader)
            if m.seq <= origin.at_seq or isinstance(event, GuardrailChecked):
                events.append((m.seq, event))
        return fold(origin.parent_run_id, events)

    def _remember(
        self, cache: OrderedDict[tuple[str, str], _V], key: tuple[str, str], value: _V
    ) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self.capacity:
            cache.popitem(last=False)
