"""Capability generation: the ``capgen`` reactor and the checks and sandbox runs it relies on.

``handler`` is the reactor; ``prompt`` talks to the model; ``checks`` vets a module statically;
``sandboxed`` runs its tests, and invocations, in the WASM sandbox.
"""

from nanocrab.capabilities.invoke import INVOKE_LIMITS, argument_errors, invoke
from nanocrab.handlers.capgen.checks import StaticVerdict, check_module
from nanocrab.handlers.capgen.handler import CapgenHandler
from nanocrab.handlers.capgen.sandboxed import TEST_LIMITS, ModuleTests, run_tests

__all__ = [
    "INVOKE_LIMITS",
    "TEST_LIMITS",
    "CapgenHandler",
    "ModuleTests",
    "StaticVerdict",
    "argument_errors",
    "check_module",
    "invoke",
    "run_tests",
]
