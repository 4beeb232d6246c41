"""Example Python agent: recalls what memory holds about a topic and reports it, with metrics.

``recall`` is an ordinary tool call (granted by the policy like any other); the agent measures
what it found (``emit_metric``), logs what it did (``log``), and stores its summary with
``remember`` so later runs find it. Its health check says whether it can work at all.
"""

from __future__ import annotations

import re
import time

from nanocrab.pyagent import Agent, Context, Health, Request, Response

MIN_SCORE = 0.4
"""Memories scoring below this (cosine similarity to the topic) are not about it."""
_SCORE = re.compile(r"^\[\S+ (\d+(?:\.\d+)?)\]")


def _score(line: str) -> float:
    found = _SCORE.match(line)
    return float(found.group(1)) if found else 0.0


class NotesReporter(Agent):
    async def handle(self, request: Request, context: Context) -> Response:
        topic = request.text.removeprefix("report on").strip() or request.text
        started = time.perf_counter()
        memories = [m for m in await context.recall(topic, k=3) if _score(m) >= MIN_SCORE]
        context.emit_metric("memories_found", len(memories), labels={"topic": topic[:40]})
        context.emit_metric("recall_ms", (time.perf_counter() - started) * 1000, unit="ms")
        context.log(f"recalled {len(memories)} memories about {topic!r}")
        if not memories:
            summary = f"Nothing in memory about {topic}."
        else:
            summary = f"{len(memories)} memories about {topic}: " + " | ".join(memories)
        await context.remember(f"reported on {topic}: {len(memories)} memories")
        return Response(summary)

    async def on_health_check(self) -> Health:
        return Health(True, "ready")


async def smoke(harness) -> None:  # type: ignore[no-untyped-def]
    answer = await harness.run(
        "report on parsers",
        tools={
            "recall": lambda a: "[m1 0.91] note: the parser needs a fix\n[m2 0.12] unrelated",
            "remember": lambda a: "Remembered.",
        },
    )
    assert answer.text.startswith("1 memories about parsers"), answer.text
    names = [e.name for e in harness.events if e.type == "agent.metric"]
    assert names == ["memories_found", "recall_ms"], names
