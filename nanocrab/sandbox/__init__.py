"""The WebAssembly sandbox: untrusted Python in CPython-for-WASI under wasmtime.

:class:`Sandbox` runs code with fuel, wall-clock, memory, stack and output limits, with only the
standard library and the given :class:`Mount` directories visible and no network; every way a
run can end is a typed :class:`SandboxResult`. :func:`run_python` and :func:`call_function` add
a structured channel (a value in, a JSON value out) on top. See docs/sandbox.md.
"""

from nanocrab.sandbox.cache import Interpreter, find_interpreter
from nanocrab.sandbox.limits import Limits, Mount, Outcome, SandboxError, SandboxResult
from nanocrab.sandbox.runner import CallResult, call_function, run_python
from nanocrab.sandbox.runtime import Sandbox

__all__ = [
    "CallResult",
    "Interpreter",
    "Limits",
    "Mount",
    "Outcome",
    "Sandbox",
    "SandboxError",
    "SandboxResult",
    "call_function",
    "find_interpreter",
    "run_python",
]
