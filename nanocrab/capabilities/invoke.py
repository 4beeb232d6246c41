"""Running a registered capability: its arguments checked against its JSON Schema, its entry
called in the sandbox, and the ``capability.invoked`` record of how that went. One path for the
CLI (`nanocrab capabilities invoke`) and the agent's ``capability`` tool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nanocrab.events import CapabilityInvoked
from nanocrab.sandbox import CallResult, Limits, Mount, Sandbox, call_function

INVOKE_LIMITS = Limits(fuel=2_000_000_000, timeout_s=10.0, memory_bytes=128 * 2**20)
LIMIT_HINTS = {
    "out_of_fuel": "ran out of fuel (an endless or far too long loop?)",
    "timeout": "ran past its time limit",
    "memory": "ran out of memory",
    "stack": "overflowed the stack (runaway recursion?)",
}
"""What a limit outcome means, in words a model or a person can act on."""


def argument_errors(parameters: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Where ``arguments`` break the capability's JSON Schema, one line per problem."""
    import jsonschema  # ~50 ms to import: only when arguments are checked

    validator_cls = jsonschema.validators.validator_for(parameters)
    validator = validator_cls(parameters)
    out = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path)
        out.append(f"{where}: {error.message}" if where else error.message)
    return out


async def invoke(
    sandbox: Sandbox,
    *,
    name: str,
    version: str,
    code: str,
    entry: str,
    arguments: dict[str, Any],
    mounts: Sequence[Mount] = (),
    limits: Limits = INVOKE_LIMITS,
) -> tuple[CallResult, CapabilityInvoked]:
    """Run ``entry(**arguments)`` of a capability's module in the sandbox (``mounts``: the
    directories a module with file permissions works in, the first being its working
    directory); returns the call's result and the ``capability.invoked`` event that records it
    (for the caller to append)."""
    call = await call_function(sandbox, code, entry, arguments, mounts=mounts, limits=limits)
    result = call.sandbox
    error = call.error
    if not call.ok and error is None:
        error = LIMIT_HINTS.get(result.outcome) or result.detail or result.outcome
    return call, CapabilityInvoked(
        name=name,
        version=version,
        ok=call.ok,
        outcome=result.outcome,
        duration_ms=result.duration_ms,
        peak_memory_bytes=result.peak_memory_bytes,
        fuel_used=result.fuel_used,
        error=error,
    )
