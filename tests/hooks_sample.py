"""Extension hooks used by tests/test_hooks.py (named in hooks.yaml as ``tests.hooks_sample:…``)."""

from __future__ import annotations

import msgspec

from nanocrab.events import TextBlock
from nanocrab.hooks import ModelContext, RunEnd, ToolOutcome


def house_rules(ctx: ModelContext) -> ModelContext:
    """Adds a line to the system prompt."""
    return msgspec.structs.replace(ctx, system=ctx.system + "\nHouse rule: answer in haiku.")


def unchanged(ctx: ModelContext) -> None:
    return None


def broken(ctx: ModelContext) -> ModelContext:
    raise RuntimeError("the hook fell over")


async def redact(result: ToolOutcome) -> ToolOutcome:
    """Replaces the word SECRET in text results and notes how many it replaced."""
    count = sum(b.text.count("SECRET") for b in result.content if isinstance(b, TextBlock))
    if not count:
        return result
    content = [
        TextBlock(b.text.replace("SECRET", "[redacted]")) if isinstance(b, TextBlock) else b
        for b in result.content
    ]
    return msgspec.structs.replace(result, content=content, note=f"{count} redacted")


def tag(result: ToolOutcome) -> ToolOutcome:
    """Annotates without changing the content."""
    return msgspec.structs.replace(result, note=f"{result.tool} ran")


def summary(end: RunEnd) -> str:
    return f"{end.status}: {end.reply or end.reason}"


def two_args(a: object, b: object) -> None:
    return None
