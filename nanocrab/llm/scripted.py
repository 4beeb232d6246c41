"""A deterministic offline model driven by a YAML script, for the demo and for tests.

Format (every field is checked; an unknown field is an error, so a typo cannot pass silently)::

    scripts:
      - name: fix-greeting
        match: "greeting"        # regex searched case-insensitively in the task; first match wins
        turns:
          - text: "Let me look around."
            tool_calls:
              - {name: ls, input: {path: "."}}
          - error: {kind: retryable, message: "overloaded", times: 2}
            tool_calls: [{name: read, input: {path: "greet.py"}}]
          - text: "Done: {task}"
      - name: fallback            # no `match`: used when no other script matches
        turns:
          - text: "I can only echo: {task}"

The answer to a request is ``turns[request.turn]`` of the chosen script; past the last turn it is
``(script finished)`` with ``end_turn``. ``{task}`` in a text is replaced by the task text.
A turn's ``error`` fails the first ``times`` attempts of that turn (counted per run and turn in
the provider instance) with an :class:`LlmError` of that kind, then the turn answers normally;
an error-only turn answers with no content once its errors are spent.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nanocrab.events import ContentBlock, TextBlock, ToolUseBlock, Usage
from nanocrab.llm.base import DeltaSink, LlmConfigError, LlmError, ModelRequest, ModelResponse

FINISHED_TEXT = "(script finished)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptedToolCall(_Strict):
    name: str = Field(min_length=1)
    input: dict[str, Any] = {}


class ScriptedError(_Strict):
    kind: Literal["retryable", "overflow", "fatal"]
    message: str = "injected failure"
    times: int = Field(default=1, ge=1)


class ScriptedTurn(_Strict):
    text: str = ""
    tool_calls: list[ScriptedToolCall] = []
    error: ScriptedError | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> ScriptedTurn:
        if not (self.text or self.tool_calls or self.error):
            raise ValueError("a turn needs text, tool_calls or error")
        return self


class Script(_Strict):
    name: str = Field(min_length=1)
    match: str | None = None
    turns: list[ScriptedTurn] = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    def matches(self, task: str) -> bool:
        return self.match is not None and re.search(self.match, task, re.IGNORECASE) is not None


class ScriptFile(_Strict):
    scripts: list[Script] = Field(min_length=1)


class ScriptedProvider:
    """Answers from :class:`Script` s; never touches the network. The response's model is
    ``scripted:<script name>`` whatever the request asked for, so a recording never passes for
    a real model's. Usage is synthetic but deterministic and the cost is always 0.0."""

    name = "scripted"

    def __init__(self, scripts: Sequence[Script]) -> None:
        if not scripts:
            raise LlmConfigError("a scripted provider needs at least one script")
        self.scripts = tuple(scripts)
        self._attempts: dict[tuple[str, int], int] = {}

    @classmethod
    def from_yaml(cls, path: str | Path) -> ScriptedProvider:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise LlmConfigError(f"cannot read model script {path}: {exc.strerror or exc}") from exc
        return cls.from_text(text, source=str(path))

    @classmethod
    def from_text(cls, yaml_text: str, *, source: str = "<script text>") -> ScriptedProvider:
        """Parse and validate a script; errors name ``source`` and the offending field."""
        try:
            data = yaml.safe_load(yaml_text)
        except yaml.YAMLError as exc:
            raise LlmConfigError(f"model script {source} is not valid YAML: {exc}") from exc
        try:
            parsed = ScriptFile.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise LlmConfigError(f"model script {source} is invalid: {problems}") from exc
        return cls(parsed.scripts)

    def script_for(self, task: str) -> Script:
        """The first script whose ``match`` is found in ``task``, else the first without one."""
        for script in self.scripts:
            if script.matches(task):
                return script
        for script in self.scripts:
            if script.match is None:
                return script
        raise LlmError(
            "fatal",
            f"no model script matches the task {task[:80]!r} and there is no fallback script "
            "(one without `match`)",
        )

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        script = self.script_for(request.task)
        if request.turn >= len(script.turns):
            turn = ScriptedTurn(text=FINISHED_TEXT)
        else:
            turn = script.turns[request.turn]
        if turn.error is not None:
            key = (request.run_id, request.turn)
            self._attempts[key] = attempt = self._attempts.get(key, 0) + 1
            if attempt <= turn.error.times:
                raise LlmError(turn.error.kind, turn.error.message)
        text = turn.text.replace("{task}", request.task)
        content: list[ContentBlock] = [TextBlock(text)] if text else []
        for i, call in enumerate(turn.tool_calls):
            call_id = tool_use_id(request.run_id, request.turn, i)
            content.append(
                ToolUseBlock(id=call_id, name=call.name, input=copy.deepcopy(call.input))
            )
        if on_delta is not None:
            for chunk in stream_chunks(text):
                await on_delta(chunk)
        return ModelResponse(
            content=content,
            stop_reason="tool_use" if turn.tool_calls else "end_turn",
            usage=synthetic_usage(request, content),
            model=f"scripted:{script.name}",
        )


def tool_use_id(run_id: str, turn: int, index: int) -> str:
    """Stable across re-runs of the same run, distinct across runs, turns and calls."""
    digest = hashlib.sha256(f"{run_id}\x00{turn}\x00{index}".encode()).hexdigest()
    return f"toolu_{digest[:24]}"


def stream_chunks(text: str, parts: int = 3) -> list[str]:
    """``text`` cut at word boundaries into at most ``parts`` pieces that join back to it."""
    words = re.findall(r"\s*\S+\s*|\s+", text)
    if not words:
        return []
    size = math.ceil(len(words) / parts)
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)]


def synthetic_usage(request: ModelRequest, content: list[ContentBlock]) -> Usage:
    """About one token per four characters of the prompt (system, messages, tools) and of the
    answer (its text and its JSON-encoded tool calls)."""
    prompt = (
        len(request.system)
        + len(msgspec.json.encode(request.messages))
        + len(msgspec.json.encode(request.tools))
    )
    answer = sum(
        len(b.text) if isinstance(b, TextBlock) else len(msgspec.json.encode(b)) for b in content
    )
    return Usage(input_tokens=math.ceil(prompt / 4), output_tokens=math.ceil(answer / 4))
