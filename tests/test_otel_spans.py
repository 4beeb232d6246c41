"""The GenAI spans of a run as a pure function of its events: approvals (waiting time), policy
refusals, guardrail checks, budget stops, failed model calls and failed runs."""

from __future__ import annotations

from datetime import timedelta

from nanocrab.events import (
    ApprovalGranted,
    ApprovalRequested,
    BudgetExceeded,
    Event,
    GrantDenied,
    GrantIssued,
    GuardrailChecked,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    RunFailed,
    RunStarted,
    TaskSubmitted,
    ToolRequested,
    ToolUseBlock,
    utcnow,
)
from nanocrab.handlers.runstate import RunState
from nanocrab.observe.spans import agent_span_id, derived_id, run_context, spans_for

RUN = "run-spans"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
T0 = utcnow()


def at(seconds: float) -> dict[str, object]:
    return {"run_id": RUN, "session_id": "s", "time": T0 + timedelta(seconds=seconds)}


def state_of(*events: Event) -> RunState:
    state = RunState(RUN)
    for i, e in enumerate(events, 1):
        state.apply(e, i)
    return state


def base() -> list[Event]:
    return [
        TaskSubmitted(text="go", trace=TRACE, **at(0)),  # type: ignore[arg-type]
        RunStarted(agent="explorer", **at(0.1)),  # type: ignore[arg-type]
        LlmRequested(turn=0, model="claude-sonnet-4-5", **at(0.2)),  # type: ignore[arg-type]
        LlmResponded(
            provider="anthropic", model="claude-sonnet-4-5-20250929", stop_reason="tool_use",
            content=[ToolUseBlock("c1", "exec", {"command": "make"})], latency_ms=500,
            **at(1.0),  # type: ignore[arg-type]
        ),
        ToolRequested(call_id="c1", tool="exec", arguments={"command": "make"}, **at(1.1)),  # type: ignore[arg-type]
    ]  # fmt: skip


def test_the_run_context_is_the_tasks_traceparent() -> None:
    state = state_of(*base())
    assert run_context(state) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    untraced = state_of(TaskSubmitted(text="go", **at(0)))  # type: ignore[arg-type]
    assert run_context(untraced) == (derived_id("trace", RUN, bits=128), None)


def test_an_approval_span_measures_the_wait_and_only_the_first_answer_closes_it() -> None:
    asked = ApprovalRequested(
        approval_id="a1", call_id="c1", tool="exec", arguments={"command": "make"},
        tier="guarded", reason="shell", expires_at=T0 + timedelta(minutes=5), **at(1.2),  # type: ignore[arg-type]
    )  # fmt: skip
    yes = ApprovalGranted(approval_id="a1", approver="alice", **at(31.2))  # type: ignore[arg-type]
    again = ApprovalGranted(approval_id="a1", approver="bob", **at(40))  # type: ignore[arg-type]
    state = state_of(*base(), asked, yes, again)
    (span,) = spans_for(yes, state)
    assert span.name == "approval exec" and span.parent_id == agent_span_id(RUN)
    assert span.attributes["nanocrab.approval.wait_s"] == 30.0
    assert span.attributes["nanocrab.approval.result"] == "granted"
    assert span.attributes["nanocrab.approval.approver"] == "alice"
    assert span.end_ns - span.start_ns == 30_000_000_000
    assert spans_for(again, state) == []


def test_policy_spans_say_what_was_decided() -> None:
    denied = GrantDenied(call_id="c1", tool="exec", reason="no", rule="shell-other", **at(1.3))  # type: ignore[arg-type]
    (span,) = spans_for(denied, state_of(*base(), denied))
    assert span.name == "policy exec"
    assert span.attributes["nanocrab.policy.decision"] == "denied"
    assert span.attributes["nanocrab.policy.rule"] == "shell-other"
    assert span.end_ns - span.start_ns == 200_000_000  # tool.requested → grant.denied
    issued = GrantIssued(
        grant_id="g", call_id="c1", tool="exec", capabilities=[], scope="step", tier="safe",
        expires_at=T0 + timedelta(minutes=5), **at(1.2),  # type: ignore[arg-type]
    )  # fmt: skip
    (span,) = spans_for(issued, state_of(*base(), issued))
    assert span.attributes["nanocrab.policy.decision"] == "granted"


def test_chat_spans_use_the_provider_latency_and_count_cached_input() -> None:
    events = base()
    responded = events[3]
    assert isinstance(responded, LlmResponded)
    (span,) = spans_for(responded, state_of(*events))
    assert span.name == "chat claude-sonnet-4-5-20250929" and span.kind == "client"
    assert span.end_ns - span.start_ns == 500_000_000
    assert span.attributes["gen_ai.request.model"] == "claude-sonnet-4-5"
    assert span.attributes["gen_ai.response.model"] == "claude-sonnet-4-5-20250929"


def test_a_failed_model_call_and_run_are_error_spans() -> None:
    failed = LlmFailed(kind="fatal", message="invalid api key", turn=1, **at(3))  # type: ignore[arg-type]
    retry = LlmFailed(kind="retryable", message="overloaded", turn=1, will_retry=True, **at(2.5))  # type: ignore[arg-type]
    ended = RunFailed(kind="llm", reason="the model call failed", **at(3.1))  # type: ignore[arg-type]
    state = state_of(*base(), LlmRequested(turn=1, **at(2)), retry, failed, ended)  # type: ignore[arg-type]
    assert spans_for(retry, state) == [], "an attempt that is retried closes nothing"
    (chat,) = spans_for(failed, state)
    assert chat.error == "invalid api key" and chat.attributes["error.type"] == "fatal"
    (agent,) = spans_for(ended, state)
    assert agent.name == "invoke_agent explorer" and agent.span_id == agent_span_id(RUN)
    assert agent.parent_id == 0xB7AD6B7169203331 and agent.error == "the model call failed"
    assert agent.attributes["nanocrab.outcome"] == "failed"
    assert agent.attributes["error.type"] == "llm"
    assert agent.attributes["gen_ai.agent.name"] == "explorer"


def test_guardrail_and_budget_spans() -> None:
    checked = GuardrailChecked(
        checkpoint="tool_call", target_id="c1", action="block", tool="exec", fired=["shell"],
        duration_ms=12.5, **at(1.15),  # type: ignore[arg-type]
    )  # fmt: skip
    (span,) = spans_for(checked, state_of(*base(), checked))
    assert span.name == "guardrail tool_call" and span.end_ns - span.start_ns == 12_500_000
    assert span.attributes["nanocrab.guardrail.action"] == "block"
    assert span.attributes["nanocrab.guardrail.fired"] == ["shell"]
    over = BudgetExceeded(scope="tenant", key="acme", limit="usd", spent_usd=1.2,
                          spent_tokens=9, max_usd=1.0, turn=1, **at(5))  # type: ignore[arg-type]  # fmt: skip
    (span,) = spans_for(over, state_of(*base(), over))
    assert span.name == "budget tenant" and span.attributes["nanocrab.budget.key"] == "acme"


def test_span_ids_are_the_same_whoever_derives_them() -> None:
    events = base()
    one = spans_for(events[3], state_of(*events))
    two = spans_for(events[3], state_of(*events))
    assert one == two and one[0].span_id == derived_id("span", events[3].id)
