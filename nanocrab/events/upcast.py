"""Schema evolution: upcasters turn a stored ``data`` object of version N into version N+1.

Old logs must always replay, so a type's version only ever grows and each step has an upcaster.
Upcasters work on plain dicts (the decoded JSON ``data``) and never see the envelope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nanocrab.events.errors import UpcastError

Data = dict[str, Any]
Upcaster = Callable[[Data], Data]


class UpcasterRegistry:
    """Maps (event type, from_version) to the function producing from_version + 1."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Upcaster] = {}

    def register(self, event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        def add(fn: Upcaster) -> Upcaster:
            key = (event_type, from_version)
            if key in self._steps:
                raise UpcastError(f"an upcaster for {event_type} v{from_version} already exists")
            self._steps[key] = fn
            return fn

        return add

    def upcast(self, event_type: str, data: Data, *, from_version: int, to_version: int) -> Data:
        """Apply every step from ``from_version`` to ``to_version``; raise on a gap."""
        for version in range(from_version, to_version):
            step = self._steps.get((event_type, version))
            if step is None:
                raise UpcastError(f"no upcaster for {event_type} v{version} -> v{version + 1}")
            data = step(dict(data))
        return data


default_upcasters = UpcasterRegistry()


@default_upcasters.register("task.submitted", 1)
def _task_submitted_v1_to_v2(data: Data) -> Data:
    """v1 called the task text ``prompt`` and had no agent profile."""
    if "prompt" not in data:
        raise UpcastError('v1 data needs "prompt", the task text, and has none')
    data["text"] = data.pop("prompt")
    data.setdefault("agent", "default")
    return data
