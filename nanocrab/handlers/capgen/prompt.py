"""What the generator tells the model, and how it reads the model's answer back.

The conversation of one request grows by two messages an attempt: the model's module, then what
was wrong with it (findings and failing tests, verbatim), so a retry sees its own code and
exactly why it was refused.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from nanocrab.capabilities.rules import ALLOWED_MODULES
from nanocrab.events import CapabilityFinding, CapabilityTestResult, TextBlock
from nanocrab.handlers.capgen.sandboxed import SANDBOX_RULES
from nanocrab.llm.base import Message, ModelResponse

SYSTEM_PROMPT = """\
You write one capability for nanocrab: a single self-contained Python 3.11 module. It runs in a
WebAssembly sandbox with no network, no subprocesses and no environment, under tight CPU and
memory limits.

The module has, at top level:

1. `CAPABILITY = {{...}}` — a literal dict (no computed values) with exactly these keys:
   - "name": a snake_case identifier, e.g. "word_count"
   - "version": "MAJOR.MINOR.PATCH", e.g. "0.1.0"
   - "description": one sentence saying what it does
   - "entry": the name of the function callers invoke
   - "parameters": a JSON Schema ({{"type": "object", "properties": ..., "required": [...]}})
     describing the entry function's keyword arguments
   - "permissions": [] unless the code must touch files: "fs.read" to read them, "fs.write"
     to write them (the caller's directory is then the working directory; use relative
     paths). Declare nothing the code does not use. There is no network: never declare "net".
     {permitted}
   - optionally "user_guidance": one or two sentences telling a person or an agent how to
     use it (what to pass, what comes back)
   - optionally "requires": names of other registered capabilities it depends on ([] if none)
2. the entry function: takes exactly the parameters as keyword arguments and returns a
   JSON-serialisable value (dict, list, str, int, float, bool or None).
3. at least two `test_*` functions without arguments that check the entry function with plain
   `assert` statements (no pytest, no fixtures, no output). With a file permission, tests run
   in an empty writable directory: create the files they need there.

Rules the static scanner enforces:
- import only these standard library modules: {imports};
- never use eval, exec, compile, __import__, breakpoint, globals, locals, vars, getattr or
  setattr with computed names, dunder attributes (type(x), not x.__class__), threads,
  signals, subprocesses, sys.exit or input.

Reply with exactly one ```python code block holding the whole module, and nothing else.
"""

_FENCE = re.compile(r"```[ \t]*(?P<lang>[A-Za-z0-9_+-]*)[^\n]*\n(?P<body>.*?)```", re.DOTALL)


def system_prompt(permitted: Collection[str] = ("fs.read", "fs.write")) -> str:
    """The generator's instructions, with the scanner's own list of importable modules and the
    permissions the configuration permits."""
    usable = sorted(set(permitted) - {"net"})
    allowed = (
        f"This installation permits only: {', '.join(usable)}."
        if usable
        else "This installation permits no permission at all: keep it []."
    )
    return SYSTEM_PROMPT.format(
        imports=", ".join(sorted(ALLOWED_MODULES - {"__future__"})), permitted=allowed
    )


def first_request(guidance: str, *, name: str = "", current: str | None = None) -> str:
    """The user's guidance plus the naming and versioning constraints of this request."""
    lines = [f"Write a capability that does this:\n\n{guidance.strip()}"]
    if name:
        lines.append(f'Its "name" must be "{name}".')
    if current:
        lines.append(
            f'Version {current} of it is registered now: give the new module a higher "version".'
        )
    return "\n\n".join(lines)


def feedback(
    attempt: int,
    findings: Sequence[CapabilityFinding],
    tests: Sequence[CapabilityTestResult],
) -> str:
    """Why attempt ``attempt`` was refused, verbatim, and what to send back."""
    lines = [f"Attempt {attempt} was refused."]
    errors = [f for f in findings if f.severity == "error" and f.rule not in SANDBOX_RULES]
    if errors:
        lines.append("Problems found:")
        lines.extend(f"- {describe_finding(f)}" for f in errors)
    failed = [t for t in tests if not t.passed]
    if failed:
        lines.append("Failing tests (run in the sandbox):")
        lines.extend(f"- {t.name}: {t.error}" for t in failed)
    lines.append(
        "Fix every problem and reply with the whole corrected module in one ```python block."
    )
    return "\n".join(lines)


def describe_finding(finding: CapabilityFinding) -> str:
    where = f" (line {finding.line})" if finding.line else ""
    return f"[{finding.rule}] {finding.message}{where}"


def response_text(response: ModelResponse) -> str:
    return "".join(b.text for b in response.content if isinstance(b, TextBlock))


def extract_code(text: str) -> str | None:
    """The module in the model's answer: the first ```python block (else the first fenced block
    of any language). ``None`` when the answer holds no fenced code."""
    blocks = [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(text)]
    for lang, body in blocks:
        if lang in ("python", "py", "python3"):
            return body.strip("\n") + "\n"
    if blocks:
        return blocks[0][1].strip("\n") + "\n"
    return None


def user(text: str) -> Message:
    return Message(role="user", content=[TextBlock(text)])


def assistant(text: str) -> Message:
    return Message(role="assistant", content=[TextBlock(text or "(no answer)")])
