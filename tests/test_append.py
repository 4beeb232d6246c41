"""Appends: idempotency by event id, optimistic concurrency, batches, the ephemeral stream."""

from __future__ import annotations

import pytest

from nanocrab.bus import AppendConflict, EventLog, Expect, Reaction, read, read_run
from nanocrab.bus.log import H_MSG_ID
from nanocrab.bus.reactions import append_chained, append_reaction
from nanocrab.events import (
    GuardrailChecked,
    LlmDelta,
    LlmRequested,
    ReplySent,
    RunStarted,
    TaskSubmitted,
    ToolCompleted,
    new_event_id,
)
from nanocrab.handlers.runstate import passed_untouched


async def stream_messages(log: EventLog, stream: str | None = None) -> int:
    info = await log.js.stream_info(stream or log.cfg.log_stream)
    return int(info.state.messages)


async def test_same_event_twice_is_stored_once_and_reported_as_duplicate(log: EventLog) -> None:
    event = TaskSubmitted(text="hello", run_id="r1")
    first = await log.append(event)
    second = await log.append(event)
    assert not first.duplicate and second.duplicate
    assert second.seq == first.seq
    assert await stream_messages(log) == 1
    raw = await log.get(first.seq)
    assert raw.headers[H_MSG_ID] == event.id
    assert raw.headers["traceparent"].startswith("00-")


async def test_duplicate_inside_a_batch_is_stored_once(log: EventLog) -> None:
    event = ReplySent(text="x", run_id="r1")
    results = await log.append_batch([event, RunStarted(run_id="r1"), event])
    assert [r.duplicate for r in results] == [False, False, True]
    assert await stream_messages(log) == 2


async def test_expected_sequence_conflict_raises_and_stores_nothing(log: EventLog) -> None:
    await log.append(TaskSubmitted(text="a", run_id="r1"))
    with pytest.raises(AppendConflict) as info:
        await log.append(TaskSubmitted(text="b", run_id="r1"), expect=Expect(0))
    assert info.value.expected == 0
    assert await stream_messages(log) == 1


async def test_run_wildcard_expectation_sees_every_subject_of_the_run(log: EventLog) -> None:
    scope = log.subjects.run("r1")
    a = await log.append(TaskSubmitted(text="a", run_id="r1"))
    await log.append(TaskSubmitted(text="other run", run_id="r2"))
    assert await log.last_seq(scope) == a.seq
    # run.started is on a different subject than task.submitted: only the wildcard check sees it
    ok = await log.append(RunStarted(run_id="r1"), expect=Expect(a.seq, scope))
    with pytest.raises(AppendConflict):
        await log.append(ReplySent(text="late", run_id="r1"), expect=Expect(a.seq, scope))
    assert await log.last_seq(scope) == ok.seq
    assert await stream_messages(log) == 3
    assert await log.last_seq(log.subjects.run("nope")) == 0


async def test_a_retried_append_inside_the_window_is_a_duplicate_not_a_conflict(
    log: EventLog,
) -> None:
    scope = log.subjects.run("r1")
    event = RunStarted(run_id="r1")
    first = await log.append(event, expect=Expect(0, scope))
    again = await log.append(event, expect=Expect(0, scope))
    assert again.duplicate and again.seq == first.seq


async def test_batch_append_keeps_order(log: EventLog) -> None:
    events = [ReplySent(text=str(i), run_id="r1") for i in range(200)]
    results = await log.append_batch(events)
    assert [r.seq for r in results] == list(range(1, 201))
    texts = [s.event.text async for s in read(log, log.subjects.run("r1"))]  # type: ignore[union-attr]
    assert texts == [str(i) for i in range(200)]


async def test_ephemeral_events_go_to_the_ttl_stream(log: EventLog) -> None:
    appended = await log.append(LlmDelta(index=0, text="tok", run_id="r1"))
    assert appended.stream == log.cfg.ephemeral_stream
    assert appended.subject.startswith(f"{log.cfg.ephemeral_root}.")
    raw = await log.get(appended.seq, stream=log.cfg.ephemeral_stream)
    assert raw.headers["Nats-TTL"] == "3600s"
    assert await stream_messages(log) == 0


async def test_log_stream_denies_delete_and_purge(log: EventLog) -> None:
    await log.append(TaskSubmitted(text="keep me", run_id="r1"))
    info = await log.js.stream_info(log.cfg.log_stream)
    assert info.config.deny_delete and info.config.deny_purge
    assert info.config.duplicate_window >= 120
    with pytest.raises(Exception, match=r"(?i)purge|delete|denied|not permitted"):
        await log.js.purge_stream(log.cfg.log_stream)
    assert await stream_messages(log) == 1


async def test_appending_where_no_stream_listens_is_a_clear_error(log: EventLog) -> None:
    from nanocrab.bus import AppendRejected, BusConfig

    orphan = EventLog(log.nc, BusConfig(url=log.cfg.url, root="nostream"))
    with pytest.raises(AppendRejected, match="no responders"):
        await orphan.append_batch([ReplySent(text="lost?", run_id="r")])
    with pytest.raises(AppendRejected):
        await orphan.append(ReplySent(text="lost?", run_id="r"))


async def test_a_publish_no_stream_heard_is_sent_again_once_one_listens(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster's node learns of a new stream's subjects a moment after the stream exists
    (and a stream electing a leader has none): an append nobody heard is published again."""
    from nanocrab.bus import BusConfig
    from nanocrab.bus.connection import ensure_streams, stream_configs

    late = EventLog(log.nc, BusConfig(url=log.cfg.url, root=f"late{new_event_id()[-8:].lower()}"))
    publish_once = late._publish_once
    tries: list[bool] = []

    async def stream_appears_after_the_first_try(
        messages: list[tuple[str, bytes, dict[str, str]]], *, what: str
    ) -> list[object]:
        acks = await publish_once(messages, what=what)
        tries.append(all(a.error is not None for a in acks))
        if len(tries) == 1:
            await ensure_streams(late.js, late.cfg)
        return list(acks)

    monkeypatch.setattr(late, "_publish_once", stream_appears_after_the_first_try)
    try:
        event = ReplySent(text="heard at last", run_id="r")
        (stored,) = await late.append_batch([event])
        assert tries == [True, False], "unheard once, then stored"
        assert not stored.duplicate
        assert (await late.read(stored.seq)).id == event.id
    finally:
        for sc in stream_configs(late.cfg):
            assert sc.name is not None
            await log.js.delete_stream(sc.name)


def _verdict(run: str, action: str) -> GuardrailChecked:
    return GuardrailChecked(checkpoint="tool_output", target_id="call-1", action=action,  # type: ignore[arg-type]
                            run_id=run, source="guardrails")  # fmt: skip


async def _types(log: EventLog, run: str) -> list[str]:
    return [s.event.type for s in await read_run(log, run) if s.event is not None]


async def test_a_decision_lands_on_top_of_a_verdict_that_changes_nothing(log: EventLog) -> None:
    """The orchestrator decides on a run, a clean guardrails verdict lands before its append: the
    decision stands (it went on after a clean pre-screen), so it is appended on top of the
    verdict instead of being dropped and made again on the verdict's delivery."""
    run = new_event_id()
    scope = log.subjects.run(run)
    at = (await log.append(ToolCompleted(tool="read", call_id="call-1", run_id=run))).seq
    await log.append(_verdict(run, "allow"))
    guard = Expect(at, scope, passed_untouched)
    await log.append(LlmRequested(turn=1, run_id=run), expect=guard)
    assert await _types(log, run) == ["tool.completed", "guardrail.checked", "llm.requested"]

    with pytest.raises(AppendConflict):  # the same without saying what is neutral
        await log.append(LlmRequested(turn=2, run_id=run), expect=Expect(at, scope))
    blocked = await log.append(_verdict(run, "block"))
    with pytest.raises(AppendConflict):  # a verdict that blocks changes the decision
        await log.append(LlmRequested(turn=2, run_id=run), expect=Expect(blocked.seq - 1, scope,
                                                                        passed_untouched))  # fmt: skip
    assert (await _types(log, run))[-1] == "guardrail.checked", "nothing stored on a conflict"


async def test_a_chained_decision_goes_on_past_a_neutral_event(log: EventLog) -> None:
    run = new_event_id()
    scope = log.subjects.run(run)
    at = (await log.append(TaskSubmitted(text="t", run_id=run, task_id=run))).seq
    started = await log.append(RunStarted(run_id=run), expect=Expect(at, scope, passed_untouched))
    await log.append(_verdict(run, "allow"))  # the task's verdict, after the fact
    await append_chained(log, started, [LlmRequested(turn=0, run_id=run)], scope,
                         neutral=passed_untouched)  # fmt: skip
    assert await _types(log, run) == [
        "task.submitted", "run.started", "guardrail.checked", "llm.requested"
    ]


def _counting_publishes(log: EventLog, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each publish round trip of ``log`` carried, in order."""
    publish_once = log._publish_once
    rounds: list[int] = []

    async def counted(messages: list[tuple[str, bytes, dict[str, str]]], *, what: str) -> object:
        rounds.append(len(messages))
        return await publish_once(messages, what=what)

    monkeypatch.setattr(log, "_publish_once", counted)
    return rounds


async def test_a_decision_goes_out_in_one_round_trip_when_nothing_comes_between(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision of several events (the run's start and its first model call, the reply and
    the run's end) costs one round trip, not one per event: each event after the first lands
    only right behind the one before it."""
    run = new_event_id()
    scope = log.subjects.run(run)
    at = (await log.append(TaskSubmitted(text="t", run_id=run, task_id=run))).seq
    rounds = _counting_publishes(log, monkeypatch)
    decision = [RunStarted(run_id=run), LlmRequested(turn=0, run_id=run)]
    assert await append_reaction(log, "orchestrator", decision[0], Reaction(
        decision, expect=Expect(at, scope), chained=True))  # fmt: skip
    assert rounds == [2]
    stored = await read_run(log, run)
    assert [s.event.type for s in stored if s.event] == ["task.submitted", "run.started",
                                                         "llm.requested"]  # fmt: skip
    assert [s.seq for s in stored] == [at, at + 1, at + 2]


async def test_a_pipelined_decision_stores_nothing_when_its_guard_fails(log: EventLog) -> None:
    """The first event's expectation fails: nothing of the decision is stored (the next events
    expect the first as the stream's last message); a first event already stored is reported as
    no progress too, and what follows it is not stored behind another event."""
    run = new_event_id()
    scope = log.subjects.run(run)
    at = (await log.append(TaskSubmitted(text="t", run_id=run, task_id=run))).seq
    await log.append(ReplySent(text="slipped in", run_id=run))
    stale = [RunStarted(run_id=run), LlmRequested(turn=0, run_id=run)]
    assert await log.append_pipelined(stale, Expect(at, scope)) == []
    assert await _types(log, run) == ["task.submitted", "reply.sent"]

    first = await log.append(RunStarted(run_id=run))
    await log.append(ReplySent(text="after the start", run_id=run))
    again = [RunStarted(id=first.event_id, run_id=run), LlmRequested(turn=0, run_id=run)]
    assert await log.append_pipelined(again, Expect(first.seq, scope)) == []
    assert await _types(log, run) == ["task.submitted", "reply.sent", "run.started", "reply.sent"]


async def test_a_refused_pipelined_decision_goes_the_careful_way(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean verdict slipped in after the orchestrator read the run: the one-round-trip
    attempt is refused, and the careful way appends the decision on top of the verdict."""
    run = new_event_id()
    scope = log.subjects.run(run)
    at = (await log.append(TaskSubmitted(text="t", run_id=run, task_id=run))).seq
    await log.append(_verdict(run, "allow"))
    rounds = _counting_publishes(log, monkeypatch)
    decision = [RunStarted(run_id=run), LlmRequested(turn=0, run_id=run)]
    assert await append_reaction(log, "orchestrator", decision[0], Reaction(
        decision, expect=Expect(at, scope, passed_untouched), chained=True))  # fmt: skip
    assert rounds[0] == 2 and len(rounds) > 1, rounds
    assert await _types(log, run) == [
        "task.submitted", "guardrail.checked", "run.started", "llm.requested"
    ]
