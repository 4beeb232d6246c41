"""Broker-level permissions: who may publish which events (DESIGN §8).

Each process part connects to NATS as its own identity (an nkey user) and the server refuses any
publish outside that identity's event families, so a compromised or buggy LLM handler cannot
forge a ``grant.issued`` and a CLI cannot answer its own ``approval.requested``. The table below
is the single source of truth: the embedded server's config, ``nanocrab security nats-config``
and docs/security.md are all rendered from it.

Everyone may read (subscribe, create and use consumers, direct and message gets); only ``admin``
may create, update, purge or delete streams, which it does once at set-up. Observers — named
read-only identities for outside consumers (``nanocrab security observer NAME``) — publish no
event and may only create, pull from and delete server-named consumers and a durable named after
themselves, so they cannot reconfigure or drain a handler's durable consumer.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from typing import Final

from nanocrab.bus.config import BusConfig
from nanocrab.bus.subjects import sanitize_token

ADMIN: Final = "admin"
ORCHESTRATOR: Final = "orchestrator"
POLICY: Final = "policy"
EXECUTOR: Final = "executor"
LLM: Final = "llm"
PROJECTOR: Final = "projector"
CLI: Final = "cli"
APPROVER: Final = "approver"
GATEWAY: Final = "gateway"
CAPGEN: Final = "capgen"
GUARDRAILS: Final = "guardrails"
ROUTER: Final = "router"
RELOADER: Final = "reloader"
TELEMETRY: Final = "telemetry"
PYAGENT: Final = "pyagent"
HOOKS: Final = "hooks"
OBSERVER: Final = "observer"
"""The role of every named observer; not itself an identity (see :func:`observer_allow`)."""

HANDLER_IDENTITIES: Final = (
    ORCHESTRATOR, POLICY, EXECUTOR, LLM, CAPGEN, GUARDRAILS, ROUTER, RELOADER, TELEMETRY,
    PYAGENT, HOOKS,
)  # fmt: skip
"""One per reactor of the agent loop; a reactor's ``name`` is its identity."""
RUNTIME_IDENTITIES: Final = (*HANDLER_IDENTITIES, PROJECTOR)
"""What a process running the agent loop (``nanocrab up``, ``run`` in-process) connects as."""
IDENTITIES: Final = (ADMIN, *RUNTIME_IDENTITIES, CLI, APPROVER, GATEWAY)

_DEAD_LETTERS = ("bus.dead_lettered", "bus.malformed")

MAY_PUBLISH: Final[Mapping[str, tuple[str, ...]]] = {
    ORCHESTRATOR: (
        "task.submitted", "run.*", "llm.requested", "tool.requested", "tool.skipped",
        # the results of the calls it settles itself (``spawn``, ``plan``, a call the guardrails
        # blocked); ``tool.completed`` is the executor's alone (events/tools.py: ToolResolved)
        "tool.resolved",
        "subagent.*", "reply.sent", "session.archived", "plan.*",
        "message.queued", "budget.exceeded", *_DEAD_LETTERS,
    ),
    # memory.recalled: similar earlier tasks put into a run's first prompt (handlers/llm.py)
    # hook.applied: what a before_model extension hook did to the context (nanocrab/hooks)
    LLM: ("llm.*", "context.compacted", "memory.recalled", "hook.applied", *_DEAD_LETTERS),
    POLICY: (
        "grant.*", "approval.requested", "approval.expired", "security.rejected",
        # a person's answer to a run over a budget that asks (handlers/budget_approval.py)
        "budget.raised", "budget.refused", *_DEAD_LETTERS,
    ),
    EXECUTOR: (
        "tool.started", "tool.output", "tool.completed", "security.rejected",
        # the ``capability`` tool's runs, for the registry's statistics (handlers/executor.py);
        # the alert of an MCP tool withheld for an injection in its description (docs/mcp.md)
        "capability.invoked", "alert.raised",
        "hook.applied",  # what an after_tool extension hook did to a result (nanocrab/hooks)
        *_DEAD_LETTERS,
    ),
    CAPGEN: (
        "capability.generated", "capability.tested", "capability.registered",
        # capability_config.auto_enable: a new capability enabled as it registers (capgen);
        # ``capability.enabled`` is a person's (cli) alone
        "capability.auto_enabled", *_DEAD_LETTERS,
    ),
    # verdicts and alerts only: what the run does with a verdict is the orchestrator's decision
    GUARDRAILS: ("guardrail.*", "alert.*", *_DEAD_LETTERS),
    # the agent of a task that names none, the memories it recalls, /new's consolidation
    ROUTER: ("route.*", "memory.*", *_DEAD_LETTERS),
    # configuration versions: proposals, verdicts, switches, and the alert of a rollback
    RELOADER: (
        "reload.proposed", "reload.rejected", "reload.activated", "reload.rolled_back",
        "alert.raised", *_DEAD_LETTERS,
    ),
    # GenAI spans and metrics from the log; alerts on budget stops, dead letters, handler lag
    TELEMETRY: ("alert.raised", *_DEAD_LETTERS),
    # Python agents answer their runs' turns as a model would (agent.responded, believed only
    # in runs a Python agent drives; their tool calls still go through the orchestrator, the
    # policy and the executor), and record logs, metrics, health
    PYAGENT: ("llm.failed", "agent.*", *_DEAD_LETTERS),
    # the run_end extension hooks' notes (handlers/hooks.py)
    HOOKS: ("hook.applied", *_DEAD_LETTERS),
    PROJECTOR: (),
    CLI: (
        "task.submitted", "message.queued", "run.cancelled", "capability.requested",
        "capability.enabled", "capability.disabled", "capability.removed", "capability.invoked",
        "reload.requested",  # `nanocrab config activate|rollback`: the reloader decides
        "session.branched",  # `nanocrab branch`: a new session forked from a past event
    ),
    APPROVER: ("approval.granted", "approval.denied"),
    # the HTTP gateway and its channels, for authenticated people: submit, steer, cancel (their
    # approval answers go out as ``approver``, signed with the approver key: nanocrab/gateway)
    GATEWAY: ("task.submitted", "message.queued", "run.cancelled", "session.branched"),
}  # fmt: skip
"""Event type patterns (``family.name`` or ``family.*``) each identity may append, on the log
and on the ephemeral stream. ``admin`` may publish anything and is not listed."""

WHY: Final[Mapping[str, str]] = {
    ADMIN: "creates and updates the streams and the artifact bucket; set-up only",
    ORCHESTRATOR: "drives runs: starts them, asks the model, requests tools, answers",
    LLM: "calls the model and reports its answers, deltas and failures",
    POLICY: "the only one that issues grants and asks for approvals",
    EXECUTOR: "runs granted tools and stores their large outputs as artifacts",
    CAPGEN: "generates capabilities, tests them in the sandbox and registers passing versions",
    GUARDRAILS: "checks tasks, tool output, tool calls and replies; records verdicts and alerts",
    ROUTER: "routes tasks to agents, recalls similar earlier work, consolidates sessions",
    RELOADER: "snapshots, validates, activates and rolls back configuration versions",
    TELEMETRY: "turns runs into GenAI spans and metrics; alerts on budgets, dead letters, lag",
    PYAGENT: "hosts Python agents: answers their runs' turns, records their logs and metrics",
    HOOKS: "runs the run_end extension hooks and records what they noted",
    PROJECTOR: "builds read models; publishes nothing",
    CLI: "people submitting work, steering and cancelling runs, managing capabilities and "
    "configuration versions",
    APPROVER: "approval front ends (`nanocrab approve/deny`, the prompt in `nanocrab run`)",
    GATEWAY: "the HTTP gateway and chat channels: people's tasks, messages and cancels",
}

_READ_STREAMS: Final = (
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.INFO.*.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.FC.>",
)

READ_API: Final = (
    *_READ_STREAMS,
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.DELETE.*.*",
    "$JS.API.CONSUMER.MSG.NEXT.*.*",
    "$JS.ACK.>",
)
"""The JetStream API every identity needs to read: ordered and durable pull consumers (create,
info, delete, next, acks, flow control), stream info, direct and message gets. Stream create,
update, delete, purge and message delete are absent: only ``admin`` has them."""


OBSERVER_READ_API: Final = (*_READ_STREAMS, "$JS.API.CONSUMER.CREATE.*")
"""The part of :data:`READ_API` every observer gets: stream info, gets, consumer info and
server-named (unnamed ephemeral, e.g. ordered) consumers. The consumer rights that name a
consumer are granted per observer by :func:`observer_allow`."""


def observer_allow(name: str) -> list[str]:
    """The subjects observer ``name`` may publish to: :data:`OBSERVER_READ_API` plus creating,
    pulling from, acknowledging and deleting the one durable consumer named ``name``.

    NATS subject permissions match whole tokens, and a consumer name is one token of
    ``$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]``, so "names starting with ``name``"
    cannot be expressed; the durable is named exactly ``name``. Handler durables are named after
    their identities, which is why :func:`check_observer_name` refuses those names.
    """
    check_observer_name(name)
    return [*OBSERVER_READ_API, *durable_rights(name)]


def durable_rights(name: str) -> list[str]:
    """Creating, pulling from, acknowledging and deleting the durable consumer named ``name``
    (an identity's own: a handler's durable is named after its identity)."""
    return [
        f"$JS.API.CONSUMER.CREATE.*.{name}",
        f"$JS.API.CONSUMER.CREATE.*.{name}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.*.{name}",
        f"$JS.API.CONSUMER.DELETE.*.{name}",
        f"$JS.API.CONSUMER.MSG.NEXT.*.{name}",
        f"$JS.ACK.*.{name}.>",
    ]


_OBSERVER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def check_observer_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` can name an observer: lower-case letters, digits,
    ``-`` and ``_`` (one NATS subject token, one key file name) and not a built-in identity."""
    if not _OBSERVER_NAME.match(name):
        raise ValueError(
            f"invalid observer name {name!r}: use 1-64 lower-case letters, digits, - or _, "
            "starting with a letter"
        )
    if name in IDENTITIES or name == OBSERVER:
        raise ValueError(
            f"{name!r} is a built-in identity (and a handler's consumer name); choose another "
            "observer name"
        )


def artifact_bucket(cfg: BusConfig) -> str:
    """The object-store bucket holding large tool outputs (``<root>_artifacts``)."""
    return f"{cfg.root}_artifacts"


def _matches(event_type: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(event_type, pattern)


def may_publish(identity: str, event_type: str) -> bool:
    """Whether the broker lets ``identity`` append an event of ``event_type``."""
    if identity == ADMIN:
        return True
    return any(_matches(event_type, p) for p in MAY_PUBLISH.get(identity, ()))


def event_subjects(patterns: Sequence[str], cfg: BusConfig) -> list[str]:
    """Subject patterns for event type patterns, on the log root and on the ephemeral root."""
    out = []
    for root in (cfg.root, cfg.ephemeral_root):
        for pattern in patterns:
            family, _, name = pattern.partition(".")
            tokens = (sanitize_token(family), name if name == "*" else sanitize_token(name))
            out.append(f"{root}.*.*.*.{tokens[0]}.{tokens[1]}")
    return out


def publish_allow(identity: str, cfg: BusConfig) -> list[str]:
    """Every subject pattern ``identity`` may publish to."""
    if identity == ADMIN:
        return [">"]
    if identity not in MAY_PUBLISH:
        raise KeyError(f"unknown identity {identity!r}; known: {', '.join(IDENTITIES)}")
    # server-named consumers (ordered feeds, replays) and the durable named after itself: a
    # compromised identity must not reconfigure, drain or acknowledge another's durable (an
    # acknowledged delivery is never redelivered; a changed filter stalls the handler)
    allow = [*OBSERVER_READ_API, *durable_rights(identity),
             *event_subjects(MAY_PUBLISH[identity], cfg)]  # fmt: skip
    if identity in (EXECUTOR, RELOADER, CLI, GATEWAY):
        # (the CLI and the gateway store the images a task carries: TaskSubmitted.images)
        # put = chunks and meta on $O.<bucket>.>; no purge: keys are content-addressed, an
        # existing object is never written twice (bus/artifacts.py); the reloader stores
        # configuration snapshots there
        allow.append(f"$O.{artifact_bucket(cfg)}.>")
    return allow


def _user(comment: str, key: str, allow: Sequence[str]) -> str:
    if not (key.startswith("U") and len(key) == 56):
        raise ValueError(f"{comment}: {key!r} is not a public user nkey (U…, 56 chars)")
    subjects = "".join(f"\n        {json.dumps(s)}," for s in allow)
    return (
        f"    # {comment}\n"
        f"    {{ nkey: {key}, permissions: {{\n"
        f"      publish: {{ allow: [{subjects}\n      ] }},\n"
        f'      subscribe: {{ allow: [">"] }} }} }}'
    )


def auth_config(
    public_keys: Mapping[str, str],
    cfg: BusConfig,
    *,
    observers: Mapping[str, str] | None = None,
) -> str:
    """The nats-server ``authorization { users = [...] }`` block for these identities.

    ``public_keys`` maps identity names (see :data:`IDENTITIES`) to their public user nkeys
    (``U…``); ``observers`` maps observer names to theirs. Subscribing is allowed everywhere
    (reading is not what the table protects); publishing is allowed only on
    :func:`publish_allow` (:func:`observer_allow` for observers). The block is deterministic:
    the same keys always render the same text (the embedded server compares digests of it).
    """
    unknown = sorted(set(public_keys) - set(IDENTITIES))
    if unknown:
        raise KeyError(f"unknown identities {unknown}; known: {', '.join(IDENTITIES)}")
    users = [
        _user(f"{identity}: {WHY[identity]}", public_keys[identity], publish_allow(identity, cfg))
        for identity in IDENTITIES
        if identity in public_keys
    ]
    for name in sorted(observers or {}):
        users.append(
            _user(f"observer {name}: reads the log, publishes nothing", (observers or {})[name],
                  observer_allow(name))
        )  # fmt: skip
    return "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"


__all__ = [
    "ADMIN",
    "APPROVER",
    "CAPGEN",
    "CLI",
    "EXECUTOR",
    "GATEWAY",
    "GUARDRAILS",
    "HANDLER_IDENTITIES",
    "HOOKS",
    "IDENTITIES",
    "LLM",
    "MAY_PUBLISH",
    "OBSERVER",
    "OBSERVER_READ_API",
    "ORCHESTRATOR",
    "POLICY",
    "PROJECTOR",
    "PYAGENT",
    "READ_API",
    "RELOADER",
    "ROUTER",
    "RUNTIME_IDENTITIES",
    "TELEMETRY",
    "WHY",
    "artifact_bucket",
    "auth_config",
    "check_observer_name",
    "event_subjects",
    "may_publish",
    "observer_allow",
    "publish_allow",
]
