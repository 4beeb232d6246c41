"""Capability generation end to end: the scripted model writes modules, the scanner and the real
WASM sandbox judge them, the registry projection (SQLite and PostgreSQL) follows the log."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import yaml
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import Delivery, EventLog, HandlerRuntime, RuntimeOptions, Window, read
from nanocrab.cli.capabilities import refusal
from nanocrab.events import (
    MAX_SOURCE_BYTES,
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityGenerated,
    CapabilityRegistered,
    CapabilityRemoved,
    CapabilityRequested,
    CapabilityTested,
    Event,
)
from nanocrab.handlers.capgen import CapgenHandler, argument_errors, check_module, invoke
from nanocrab.handlers.capgen.sandboxed import SANDBOX_RULES
from nanocrab.llm import CAPGEN_SCRIPT, ScriptedProvider
from nanocrab.projections import (
    CapabilitiesProjection,
    Projector,
    capability,
    capability_stats,
    list_capabilities,
)
from nanocrab.sandbox import Sandbox
from tests.agent_fixtures import Recording
from tests.conftest import eventually

FAST = RuntimeOptions(fetch_timeout_s=0.5, ack_wait_s=10.0, backoff_s=(0.1, 0.2), max_deliver=3)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One sandbox for the session: the interpreter compiles once (~4 s) into a tmp cache."""
    box = Sandbox(tmp_path_factory.getbasetemp() / "sandbox-cache")  # shared with the others
    box.warm()
    yield box


# --- modules the scripted model answers with ------------------------------------------------

WORD_COUNT_V1 = """
import re

CAPABILITY = {
    "name": "word_count",
    "version": "0.1.0",
    "description": "Count the words in a text.",
    "entry": "word_count",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "permissions": [],
}


def word_count(text):
    if text == "boom":
        raise ValueError("boom is not a text")
    return {"words": len(re.findall(r"\\w+", text))}


def test_counts():
    assert word_count(text="a b c") == {"words": 3}


def test_empty():
    assert word_count(text="") == {"words": 0}
"""

WITH_EVAL = WORD_COUNT_V1.replace(
    'return {"words": len(re.findall(r"\\w+", text))}',
    "return eval(\"{'words': %d}\" % len(text.split()))",
)
FAILING_TEST = WORD_COUNT_V1.replace(
    'assert word_count(text="a b c") == {"words": 3}',
    'result = word_count(text="a b c")\n    assert result == {"words": 4}, "expected four words"',
)
ENDLESS = WORD_COUNT_V1.replace(
    'def test_empty():\n    assert word_count(text="") == {"words": 0}',
    "def test_empty():\n    n = 0\n    while True:\n        n += 1",
)
V2_FAILING = FAILING_TEST.replace('"version": "0.1.0"', '"version": "0.2.0"')
V2_PASSING = WORD_COUNT_V1.replace('"version": "0.1.0"', '"version": "0.2.0"').replace(
    '"Count the words in a text."', '"Count the words in a text (v2)."'
)
V1_OTHER_CODE = WORD_COUNT_V1.replace("def test_empty", "def test_empty_text")


def line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)


def block(code: str) -> str:
    return f"Here it is.\n\n```python\n{code.strip()}\n```\n"


def provider(scripts: dict[str, Sequence[str]]) -> ScriptedProvider:
    """A scripted model from YAML text: guidance regex → one answer per attempt."""
    text = yaml.safe_dump(
        {
            "scripts": [
                {"name": f"s{i}", "match": match, "turns": [{"text": t} for t in turns]}
                for i, (match, turns) in enumerate(scripts.items())
            ]
        }
    )
    return ScriptedProvider.from_text(text)



async def generate(
    log: EventLog, handler: CapgenHandler, guidance: str, *, name: str = "", attempts: int = 3
) -> list[Event]:
    """Run the handler on its durable, ask, and return the request's events once decided."""
    runtime = HandlerRuntime(log, handler, options=FAST)
    task = asyncio.create_task(runtime.run())
    request = CapabilityRequested(name=name, guidance=guidance, max_attempts=attempts)
    try:
        appended = await log.append(request)

        async def decided() -> list[Event] | None:
            window = Window(start_seq=appended.seq)
            events = [
                s.event
                async for s in read(log, log.subjects.of_type("capability.*"), window)
                if s.event is not None and s.event.causation_id == request.id
            ]
            if any(isinstance(e, CapabilityRegistered) for e in events) or any(
                isinstance(e, CapabilityTested) and e.final and not e.passed for e in events
            ):
                return events
            return None

        return await eventually(decided, timeout=60)
    finally:
        runtime.stop()
        await task


def of(events: Sequence[Event], cls: type) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


async def project(log: EventLog, engine: AsyncEngine) -> None:
    projector = Projector(log, engine, CapabilitiesProjection())
    await projector.setup()
    await projector.catch_up()


# --- generation -------------------------------------------------------------------------------


async def test_scan_rejects_the_first_attempt_and_the_second_is_registered(
    log: EventLog, sandbox: Sandbox
) -> None:
    model = Recording(provider({"count words": [block(WITH_EVAL), block(WORD_COUNT_V1)]}))
    handler = CapgenHandler(log, provider=model, sandbox=sandbox)
    events = await generate(log, handler, "count words in a text")

    assert [e.type for e in events] == [
        "capability.generated", "capability.tested",
        "capability.generated", "capability.tested", "capability.registered",
    ]  # fmt: skip
    first, second = of(events, CapabilityTested)
    assert not first.passed and not first.final and first.attempt == 1
    assert first.tests == [], "a module the scanner refuses never runs"
    (finding,) = [f for f in first.findings if f.severity == "error"]
    assert finding.rule == "dynamic_code" and "eval" in finding.message
    assert finding.line == line_of(WITH_EVAL.strip(), "eval(")
    assert second.passed and second.final and second.safety_level == "safe"
    assert [(t.name, t.passed) for t in second.tests] == [
        ("test_counts", True),
        ("test_empty", True),
    ]

    (registered,) = of(events, CapabilityRegistered)
    code = WORD_COUNT_V1.strip() + "\n"
    assert registered.name == "word_count" and registered.version == "0.1.0"
    assert registered.content_hash == hashlib.sha256(code.encode()).hexdigest()
    assert registered.code == code and registered.safety_level == "safe"
    assert registered.attempt == 2 and registered.entry == "word_count"
    assert registered.tests == ["test_counts", "test_empty"]
    assert all(e.source == "capgen" for e in events)
    assert of(events, CapabilityGenerated)[0].code.startswith("import re")

    # the retry was told exactly why: its own code, then the findings verbatim
    retry = model.requests[1]
    assert [m.role for m in retry.messages] == ["user", "assistant", "user"]
    feedback = retry.messages[2].content[0].text  # type: ignore[union-attr]
    assert "[dynamic_code]" in feedback and f"(line {finding.line})" in feedback
    assert "eval" in retry.messages[1].content[0].text  # type: ignore[union-attr]
    assert "```python" in retry.system and retry.task == "count words in a text"


async def test_a_module_whose_test_fails_in_the_sandbox_is_not_registered(
    log: EventLog, sandbox: Sandbox
) -> None:
    handler = CapgenHandler(
        log, provider=provider({"count": [block(FAILING_TEST)]}), sandbox=sandbox
    )
    events = await generate(log, handler, "count words", attempts=1)

    assert not of(events, CapabilityRegistered)
    (tested,) = of(events, CapabilityTested)
    assert not tested.passed and tested.final and "nothing was registered" in tested.report
    failing = {t.name: t.error for t in tested.tests if not t.passed}
    line = line_of(FAILING_TEST.strip(), 'assert result == {"words": 4}')
    assert failing == {"test_counts": f"AssertionError: expected four words (line {line})"}
    assert tested.sandbox_outcome == "ok", "a failing assert is not a sandbox limit"


async def test_an_endless_loop_runs_out_of_fuel_and_is_not_registered(
    log: EventLog, sandbox: Sandbox
) -> None:
    handler = CapgenHandler(log, provider=provider({"count": [block(ENDLESS)]}), sandbox=sandbox)
    events = await generate(log, handler, "count words", attempts=1)

    assert not of(events, CapabilityRegistered)
    (tested,) = of(events, CapabilityTested)
    assert not tested.passed and tested.sandbox_outcome == "out_of_fuel"
    results = {t.name: t for t in tested.tests}
    assert results["test_counts"].passed, "the other test still ran, in its own sandbox"
    assert not results["test_empty"].passed and "fuel" in results["test_empty"].error
    assert [f.rule for f in tested.findings] == ["out_of_fuel"]
    assert "out_of_fuel" in SANDBOX_RULES


async def test_failures_that_cannot_be_retried_end_the_request(
    log: EventLog, sandbox: Sandbox
) -> None:
    no_code = CapgenHandler(
        log, provider=provider({"prose": ["I would rather explain it in words."]}), sandbox=sandbox
    )
    events = await generate(log, no_code, "prose only", attempts=2)
    assert [e.type for e in events] == ["capability.tested", "capability.tested"]
    assert all(t.findings[0].rule == "no_code_block" for t in of(events, CapabilityTested))
    assert of(events, CapabilityTested)[-1].final

    unknown = CapgenHandler(log, provider=provider({"prose": ["x"]}), sandbox=sandbox)
    (failed,) = await generate(log, unknown, "something no script knows")
    assert isinstance(failed, CapabilityTested) and failed.final and not failed.passed
    assert failed.findings[0].rule == "model_failed" and "no model script" in failed.report


async def test_a_redelivered_request_that_was_decided_emits_nothing(
    log: EventLog, sandbox: Sandbox
) -> None:
    handler = CapgenHandler(
        log, provider=provider({"count": [block(WORD_COUNT_V1)]}), sandbox=sandbox
    )
    events = await generate(log, handler, "count words")
    request_id = events[0].causation_id
    stored = [
        s async for s in read(log, log.subjects.of_type("capability.requested"))
        if s.event is not None and s.event.id == request_id
    ]  # fmt: skip
    (s,) = stored
    assert await handler.handle(s.event, Delivery(s.seq, s.subject, deliveries=2)) == []  # type: ignore[arg-type]


async def test_a_new_version_replaces_the_old_one_only_once_its_tests_pass(
    log: EventLog, sandbox: Sandbox, sqlite_engine: AsyncEngine
) -> None:
    model = provider(
        {
            "first": [block(WORD_COUNT_V1)],
            "broken v2": [block(V2_FAILING)],
            "same number": [block(V1_OTHER_CODE)],
            "good v2": [block(V2_PASSING)],
        }
    )
    handler = CapgenHandler(log, provider=model, sandbox=sandbox)
    assert of(await generate(log, handler, "first", name="word_count"), CapabilityRegistered)

    broken = await generate(log, handler, "broken v2", name="word_count", attempts=1)
    assert not of(broken, CapabilityRegistered)
    await project(log, sqlite_engine)
    detail = await capability(sqlite_engine, "word_count")
    assert detail is not None and detail.row.version == "0.1.0", "v1 stays current"
    assert [v.version for v in detail.versions] == ["0.1.0"]

    clash = await generate(log, handler, "same number", name="word_count", attempts=1)
    (tested,) = of(clash, CapabilityTested)
    assert [f.rule for f in tested.findings] == ["version_exists"], "versions are immutable"

    good = await generate(log, handler, "good v2", name="word_count")
    (registered,) = of(good, CapabilityRegistered)
    assert registered.version == "0.2.0"
    await project(log, sqlite_engine)
    detail = await capability(sqlite_engine, "word_count")
    assert detail is not None and detail.row.version == "0.2.0"
    assert detail.row.description == "Count the words in a text (v2)."
    assert [v.version for v in detail.versions] == ["0.1.0", "0.2.0"]
    assert detail.code == V2_PASSING.strip() + "\n"


async def test_the_bundled_offline_script_shows_a_retry_then_registers(
    log: EventLog, sandbox: Sandbox
) -> None:
    handler = CapgenHandler(
        log, provider=ScriptedProvider.from_yaml(CAPGEN_SCRIPT), sandbox=sandbox
    )
    events = await generate(log, handler, "count words in a text")
    first, second = of(events, CapabilityTested)
    assert not first.passed and first.findings[0].rule == "dynamic_code"
    assert second.passed and len(second.tests) == 3
    (registered,) = of(events, CapabilityRegistered)
    assert registered.name == "word_count" and registered.safety_level == "safe"


# --- the registry and invocations -------------------------------------------------------------


async def test_registry_projection_shows_versions_stats_and_status(
    log: EventLog, sandbox: Sandbox, engine: AsyncEngine
) -> None:
    handler = CapgenHandler(
        log, provider=provider({"count": [block(WORD_COUNT_V1)]}), sandbox=sandbox
    )
    (registered,) = of(await generate(log, handler, "count words"), CapabilityRegistered)
    await project(log, engine)
    (row,) = await list_capabilities(engine)
    assert (row.name, row.version, row.status, row.safety_level) == (
        "word_count", "0.1.0", "disabled", "safe",
    )  # fmt: skip
    assert row.parameters["required"] == ["text"] and row.permissions == []
    assert row.content_hash == registered.content_hash
    assert await capability_stats(engine, "word_count") == (0, None, None, None, None)

    detail = await capability(engine, "word_count")
    assert detail is not None
    results = []
    for text in ("one two", "three", "boom"):
        call, invoked = await invoke(
            sandbox, name="word_count", version=row.version, code=detail.code,
            entry=row.entry, arguments={"text": text},
        )  # fmt: skip
        await log.append(invoked)
        results.append((call.ok, call.value, invoked.error))
    assert results[:2] == [(True, {"words": 2}, None), (True, {"words": 1}, None)]
    assert results[2][0] is False and results[2][2] == "ValueError: boom is not a text"
    assert argument_errors(row.parameters, {"txt": "a"}) == [
        "'text' is a required property",
        "Additional properties are not allowed ('txt' was unexpected)",
    ]

    await project(log, engine)
    stats = await capability_stats(engine, "word_count")
    assert stats.count == 3 and stats.success_rate == pytest.approx(2 / 3)
    assert stats.avg_ms is not None and stats.avg_ms > 0
    assert stats.p95_ms is not None and stats.p95_ms >= stats.avg_ms
    assert stats.peak_memory_bytes is not None and stats.peak_memory_bytes >= 10 * 2**20
    assert (await capability_stats(engine, "word_count", version="9.9.9")).count == 0

    # enable / disable / remove decide what may be invoked
    async def status() -> tuple[str, str | None]:
        await project(log, engine)
        detail = await capability(engine, "word_count")
        assert detail is not None
        return detail.row.status, refusal(detail.row)

    # registered means tested, not allowed: the user decides (seed 001)
    state, why = await status()
    assert state == "disabled" and why is not None and "not enabled yet" in why
    assert "capabilities enable word_count" in why
    await log.append(CapabilityEnabled(name="word_count", version="0.1.0", source="cli"))
    assert await status() == ("enabled", None)
    await log.append(CapabilityDisabled(name="word_count", version="0.1.0", reason="flaky"))
    state, why = await status()
    assert state == "disabled" and why is not None and "disabled (flaky)" in why
    assert "capabilities enable word_count" in why
    await log.append(CapabilityEnabled(name="word_count", version="0.1.0"))
    assert await status() == ("enabled", None)
    await log.append(CapabilityRemoved(name="word_count", reason="obsolete"))
    state, why = await status()
    assert state == "removed" and why is not None and "generate it again" in why
    assert await list_capabilities(engine) == []
    assert [r.name for r in await list_capabilities(engine, include_removed=True)] == ["word_count"]
    await log.append(CapabilityEnabled(name="word_count", version="0.1.0"))
    assert (await status())[0] == "removed", "a removed capability cannot be enabled"

    # generated again: back in the registry, waiting for the user again
    await generate(log, handler, "count words")
    state, why = await status()
    assert state == "disabled" and why is not None and "not enabled yet" in why
    (row,) = await list_capabilities(engine)
    assert json.dumps(row.parameters)  # JSON round trip of the schema


def test_static_checks_name_version_network_tests_and_size() -> None:
    def rules(source: str, **kwargs: Any) -> list[str]:
        return [f.rule for f in check_module(source, **kwargs).findings if f.severity == "error"]

    assert rules(WORD_COUNT_V1) == []
    assert rules(WORD_COUNT_V1, name="counter") == ["wrong_name"]
    assert rules(WORD_COUNT_V1, registered={"0.2.0": "x"}, current="0.2.0") == ["version_not_newer"]
    same = hashlib.sha256(WORD_COUNT_V1.encode()).hexdigest()
    assert rules(WORD_COUNT_V1, registered={"0.1.0": same}, current="0.1.0") == []
    networked = WORD_COUNT_V1.replace('"permissions": []', '"permissions": ["net"]')
    assert "no_network" in rules(networked)
    untested = WORD_COUNT_V1.split("def test_counts")[0]
    assert rules(untested) == ["no_tests"]
    assert rules(WORD_COUNT_V1 + "#" * MAX_SOURCE_BYTES) == ["too_large"]
    assert rules("CAPABILITY = {") == ["syntax"]
    verdict = check_module(WITH_EVAL)
    assert not verdict.ok and verdict.safety_level == "dangerous" and verdict.name == "word_count"
