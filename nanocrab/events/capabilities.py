"""AI-generated capabilities: generation attempts, sandbox tests, the registry, invocations.

A capability is one Python module (a ``CAPABILITY`` dict, an entry function, ``test_*``
functions). Its source (field ``code``; ``source`` is the envelope's emitter) travels inline in
``capability.generated`` and ``capability.registered``:
modules are small (the generator refuses anything over :data:`MAX_SOURCE_BYTES`), and an event
that carries its code lets the registry be rebuilt from the log alone.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

import msgspec

from nanocrab.events.base import Event, SubjectKind

MAX_SOURCE_BYTES: Final = 64 * 1024
"""The largest capability module the generator accepts (the source is carried inline)."""

SafetyLevel = Literal["safe", "restricted", "dangerous"]
SandboxOutcome = Literal["ok", "exit_code", "out_of_fuel", "timeout", "memory", "stack", "error"]


class CapabilityFinding(msgspec.Struct, frozen=True, kw_only=True):
    """One problem with a generated module: a scanner rule, a parse error, a sandbox limit.

    ``rule`` is a stable identifier (``forbidden_call``, ``syntax``, ``test_failed``,
    ``out_of_fuel``, ...); ``line`` is 1-based in the module (0 when it has no place).
    """

    rule: str
    message: str
    line: int = 0
    col: int = 0
    severity: Literal["error", "warning"] = "error"


class CapabilityTestResult(msgspec.Struct, frozen=True, kw_only=True):
    """One ``test_*`` function of a module, as it ran in the sandbox."""

    name: str
    passed: bool
    error: str = ""  # ``AssertionError: ... (line 12)`` when it failed


class _CapabilityEvent(Event, frozen=True):
    subject_kind: ClassVar[SubjectKind] = "capability"

    name: str

    def subject_id(self) -> str:
        return self.name or "_"


class CapabilityRequested(_CapabilityEvent, frozen=True, tag="capability.requested"):
    """``name`` may be empty: the model then names the capability."""

    guidance: str
    max_attempts: int = 3
    requested_by: str = ""


class CapabilityGenerated(_CapabilityEvent, frozen=True, tag="capability.generated"):
    """The model's code for one attempt, before any check (it may not even parse)."""

    version: str
    attempt: int
    code: str
    content_hash: str
    model: str = ""


class CapabilityTested(_CapabilityEvent, frozen=True, tag="capability.tested"):
    """The verdict on one attempt: parse, static scan, then the module's tests in the sandbox.

    ``final`` marks the last verdict of a request: passed (``capability.registered`` follows)
    or failed with no attempts left (nothing is registered)."""

    version: str
    attempt: int
    passed: bool
    final: bool = False
    content_hash: str = ""
    safety_level: SafetyLevel | None = None
    findings: list[CapabilityFinding] = []
    tests: list[CapabilityTestResult] = []
    sandbox_outcome: SandboxOutcome | None = None
    duration_ms: float = 0.0
    report: str = ""


class CapabilityRegistered(_CapabilityEvent, frozen=True, tag="capability.registered"):
    """A tested version became the capability's current one.

    ``user_guidance``: how to use it (the module's ``user_guidance``, else the request's
    guidance); ``requires``: the capabilities it depends on, by name (they must be enabled for
    it to be enabled or invoked)."""

    version: str
    content_hash: str
    safety_level: SafetyLevel
    description: str
    entry: str
    parameters: dict[str, Any]
    permissions: list[str] = []
    code: str = ""
    tests: list[str] = []
    attempt: int = 1
    user_guidance: str = ""
    requires: list[str] = []


class CapabilityEnabled(_CapabilityEvent, frozen=True, tag="capability.enabled"):
    """``requires``: its declared dependencies, all enabled when it was; ``required_by``: the
    capability whose enabling enabled this one too (``""``: enabled for itself); ``reason``:
    e.g. ``auto_enable`` when the generator enabled it by configuration."""

    version: str
    requires: list[str] = []
    required_by: str = ""
    reason: str = ""


class CapabilityAutoEnabled(CapabilityEnabled, frozen=True, tag="capability.auto_enabled"):
    """The generator enabled a capability new to the registry (``capability_config``'s
    ``auto_enable``): the only enabling it may publish (the broker lets only people, ``cli``,
    publish ``capability.enabled``). A subclass of :class:`CapabilityEnabled`, so whatever reads
    an enabling reads both; the registry believes it only for a capability nobody has enabled
    or disabled since it was registered, and only for its current version — a new version of an
    enabled capability waits for a person (an adversarial pass, as ``capgen``, enabled its own
    capabilities and swapped the code of enabled ones)."""


class CapabilityDisabled(_CapabilityEvent, frozen=True, tag="capability.disabled"):
    """``dependents``: enabled capabilities requiring this one when it was disabled (only with
    ``forced``: otherwise such a disable is refused); they stay enabled but cannot be invoked
    until it is enabled again."""

    version: str
    reason: str = ""
    forced: bool = False
    dependents: list[str] = []


class CapabilityRemoved(_CapabilityEvent, frozen=True, tag="capability.removed"):
    """``forced`` and ``dependents`` as in ``capability.disabled``."""

    reason: str = ""
    forced: bool = False
    dependents: list[str] = []


class CapabilityInvoked(_CapabilityEvent, frozen=True, tag="capability.invoked"):
    """One run of a capability in the sandbox; failures are typed by ``outcome``."""

    version: str
    ok: bool
    outcome: SandboxOutcome
    duration_ms: float
    peak_memory_bytes: int = 0
    fuel_used: int = 0
    error: str | None = None
