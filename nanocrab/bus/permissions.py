"""Broker-level permissions: who may publish which events (DESIGN §8).

Each process part connects to NATS as its own identity (an nkey user) and the server refuses any
publish outside that identity's event families, so a compromised or buggy LLM handler cannot
forge a ``grant.issued`` and a CLI cannot answer its own ``approval.requested``. The table below
is the single source of truth: the embedded server's config, ``nanocrab security nats-config``
and docs/security.md are all rendered from it.

Everyone may read (subscribe, create and use consumers, direct and message gets); only ``admin``
may create, update, purge or delete streams, which it does once at set-up.
"""

from __future__ import annotations

import fnmatch
import json
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
CAPGEN: Final = "capgen"

HANDLER_IDENTITIES: Final = (ORCHESTRATOR, POLICY, EXECUTOR, LLM, CAPGEN)
"""One per reactor of the agent loop; a reactor's ``name`` is its identity."""
RUNTIME_IDENTITIES: Final = (*HANDLER_IDENTITIES, PROJECTOR)
"""What a process running the agent loop (``nanocrab up``, ``run`` in-process) connects as."""
IDENTITIES: Final = (ADMIN, *RUNTIME_IDENTITIES, CLI, APPROVER)

_DEAD_LETTERS = ("bus.dead_lettered", "bus.malformed")

MAY_PUBLISH: Final[Mapping[str, tuple[str, ...]]] = {
    ORCHESTRATOR: (
        "task.submitted", "run.*", "llm.requested", "tool.requested", "tool.skipped",
        # the ``spawn`` pseudo-tool is run by the orchestrator itself: it completes the parent's
        # call when the child run ends (handlers/orchestrator/decide.py)
        "tool.completed",
        "subagent.*", "reply.sent", "session.archived", "step.*", "plan.*", "route.*",
        "message.queued", *_DEAD_LETTERS,
    ),
    LLM: ("llm.*", "context.compacted", *_DEAD_LETTERS),
    POLICY: (
        "grant.*", "approval.requested", "approval.expired", "security.rejected", *_DEAD_LETTERS,
    ),
    EXECUTOR: (
        "tool.started", "tool.output", "tool.completed", "security.rejected",
        # the ``capability`` tool's runs, for the registry's statistics (handlers/executor.py)
        "capability.invoked", *_DEAD_LETTERS,
    ),
    CAPGEN: (
        "capability.generated", "capability.tested", "capability.registered", *_DEAD_LETTERS,
    ),
    PROJECTOR: (),
    CLI: (
        "task.submitted", "message.queued", "run.cancelled", "capability.requested",
        "capability.enabled", "capability.disabled", "capability.removed", "capability.invoked",
    ),
    APPROVER: ("approval.granted", "approval.denied"),
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
    PROJECTOR: "builds read models; publishes nothing",
    CLI: "people submitting work, steering and cancelling runs, managing capabilities",
    APPROVER: "approval front ends (`nanocrab approve/deny`, the prompt in `nanocrab run`)",
}

READ_API: Final = (
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.INFO.*.*",
    "$JS.API.CONSUMER.DELETE.*.*",
    "$JS.API.CONSUMER.MSG.NEXT.*.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.ACK.>",
    "$JS.FC.>",
)
"""The JetStream API every identity needs to read: ordered and durable pull consumers (create,
info, delete, next, acks, flow control), stream info, direct and message gets. Stream create,
update, delete, purge and message delete are absent: only ``admin`` has them."""


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
    allow = [*READ_API, *event_subjects(MAY_PUBLISH[identity], cfg)]
    if identity == EXECUTOR:
        # put = chunks and meta on $O.<bucket>.>; no purge: keys are content-addressed, an
        # existing object is never written twice (bus/artifacts.py)
        allow.append(f"$O.{artifact_bucket(cfg)}.>")
    return allow


def auth_config(public_keys: Mapping[str, str], cfg: BusConfig) -> str:
    """The nats-server ``authorization { users = [...] }`` block for these identities.

    ``public_keys`` maps identity names (see :data:`IDENTITIES`) to their public user nkeys
    (``U…``). Subscribing is allowed everywhere (reading is not what the table protects);
    publishing is allowed only on :func:`publish_allow`.
    """
    unknown = sorted(set(public_keys) - set(IDENTITIES))
    if unknown:
        raise KeyError(f"unknown identities {unknown}; known: {', '.join(IDENTITIES)}")
    users = []
    for identity in IDENTITIES:
        key = public_keys.get(identity)
        if key is None:
            continue
        if not (key.startswith("U") and len(key) == 56):
            raise ValueError(f"{identity}: {key!r} is not a public user nkey (U…, 56 chars)")
        allow = "".join(f"\n        {json.dumps(s)}," for s in publish_allow(identity, cfg))
        users.append(
            f"    # {identity}: {WHY[identity]}\n"
            f"    {{ nkey: {key}, permissions: {{\n"
            f"      publish: {{ allow: [{allow}\n      ] }},\n"
            f'      subscribe: {{ allow: [">"] }} }} }}'
        )
    return "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"


__all__ = [
    "ADMIN",
    "APPROVER",
    "CAPGEN",
    "CLI",
    "EXECUTOR",
    "HANDLER_IDENTITIES",
    "IDENTITIES",
    "LLM",
    "MAY_PUBLISH",
    "ORCHESTRATOR",
    "POLICY",
    "PROJECTOR",
    "READ_API",
    "RUNTIME_IDENTITIES",
    "WHY",
    "artifact_bucket",
    "auth_config",
    "event_subjects",
    "may_publish",
    "publish_allow",
]
