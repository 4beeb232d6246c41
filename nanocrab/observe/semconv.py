"""Attribute and metric names: the OpenTelemetry GenAI semantic conventions (``gen_ai.*``,
``error.type``) and nanocrab's own (``nanocrab.*``), in one place so docs/observability.md,
the spans, the metrics and the Grafana dashboard agree."""

from __future__ import annotations

from typing import Final

# GenAI semantic conventions (spans)
OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_ID: Final = "gen_ai.response.id"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
CONVERSATION: Final = "gen_ai.conversation.id"
AGENT_NAME: Final = "gen_ai.agent.name"
AGENT_ID: Final = "gen_ai.agent.id"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"  # content: opt-in
TOOL_RESULT: Final = "gen_ai.tool.call.result"  # content: opt-in
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"  # content: opt-in
TOKEN_TYPE: Final = "gen_ai.token.type"
ERROR_TYPE: Final = "error.type"

# nanocrab's own
RUN_ID: Final = "nanocrab.run_id"
TENANT: Final = "nanocrab.tenant"
TURN: Final = "nanocrab.turn"
COST_USD: Final = "nanocrab.cost_usd"
OUTCOME: Final = "nanocrab.outcome"
STEPS: Final = "nanocrab.run.steps"
PARENT_RUN: Final = "nanocrab.run.parent_id"
POLICY_DECISION: Final = "nanocrab.policy.decision"
POLICY_TIER: Final = "nanocrab.policy.tier"
POLICY_RULE: Final = "nanocrab.policy.rule"
APPROVAL_ID: Final = "nanocrab.approval.id"
APPROVAL_RESULT: Final = "nanocrab.approval.result"
APPROVAL_WAIT_S: Final = "nanocrab.approval.wait_s"
APPROVER: Final = "nanocrab.approval.approver"
GUARDRAIL_CHECKPOINT: Final = "nanocrab.guardrail.checkpoint"
GUARDRAIL_ACTION: Final = "nanocrab.guardrail.action"
GUARDRAIL_FIRED: Final = "nanocrab.guardrail.fired"
BUDGET_SCOPE: Final = "nanocrab.budget.scope"
BUDGET_KEY: Final = "nanocrab.budget.key"
BUDGET_LIMIT: Final = "nanocrab.budget.limit"
BUDGET_ON_EXCEED: Final = "nanocrab.budget.on_exceed"
BUDGET_EXCEEDED_ID: Final = "nanocrab.budget.exceeded_id"
HANDLER: Final = "nanocrab.handler"
REASON: Final = "nanocrab.reason"
SANDBOX_OUTCOME: Final = "nanocrab.sandbox.outcome"
CAPABILITY: Final = "nanocrab.capability"

# metrics
M_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
M_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
M_TOOL_DURATION: Final = "nanocrab.tool.duration"
M_RUNS: Final = "nanocrab.runs"
M_RUN_COST: Final = "nanocrab.cost.usd"
M_APPROVALS_WAITING: Final = "nanocrab.approvals.waiting"
M_APPROVAL_WAIT: Final = "nanocrab.approval.wait"
M_BUDGET_EXCEEDED: Final = "nanocrab.budget.exceeded"
M_DEAD_LETTERS: Final = "nanocrab.dead_letters"
M_HANDLER_PENDING: Final = "nanocrab.handler.pending"
M_HANDLER_REDELIVERED: Final = "nanocrab.handler.redelivered"
M_HANDLER_LAG: Final = "nanocrab.handler.lag"
M_SANDBOX: Final = "nanocrab.sandbox.runs"
M_GUARDRAIL: Final = "nanocrab.guardrail.checks"
M_AGENT_METRIC: Final = "nanocrab.agent.metric"
AGENT_METRIC_NAME: Final = "nanocrab.agent.metric.name"
AGENT_METRIC_UNIT: Final = "nanocrab.agent.metric.unit"
AGENT_METRIC_LABEL: Final = "nanocrab.agent.label."
"""Prefix of the attributes carrying a Python agent's own metric labels."""
