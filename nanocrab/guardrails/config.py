"""The guardrails file (``guardrails.yaml``): an ordered chain of typed filters.

Format (unknown keys are an error)::

    version: 1
    filters:
      - id: task-pii                 # unique, required
        checkpoints: [task_input]    # task_input | tool_output | tool_call | reply (one or more)
        tools: ["web_fetch", "gmail.*"]  # optional fnmatch patterns (tool_output / tool_call)
        agents: ["*"]                # optional fnmatch patterns on the agent profile
        detector: pii                # pii|secrets|injection|deny_list|allow_list|alignment
        entities: [email, phone, card, iban, national_id, ip]   # pii only (default: all)
        region: US                   # pii only: country assumed for numbers without '+'
        classifier: true             # injection only: the learned layer backs the heuristics
        llm: true                    # alignment only: ask Claude too when a key is set
        on_llm_error: offline        # alignment only: offline (rules alone) | fire (fail closed)
        threshold: 0.6               # a finding counts when its score >= threshold (0..1)
        action: redact               # allow | alert | redact | require_approval | block
        alert: false                 # also raise an alert when this filter fires
        reason: ""                   # what the model or the user is told (block, approval)
      - id: deny-paste-sites
        checkpoints: [tool_call, reply]
        detector: deny_list          # deny_list / allow_list take any of:
        domains: [pastebin.com, "*.ngrok.io"]
        keywords: [rm -rf /]
        regexes: ["(?i)bearer\\s+[a-z0-9._-]{20,}"]
        topics: {gambling: [casino, poker]}
        action: block

How the chain runs is in :mod:`nanocrab.guardrails.chain`. Files are read with
``yaml.safe_load`` semantics only (tags refused) and duplicate keys are refused; every
:class:`GuardrailsError` names the file, the line, the filter (id and position) and what to fix
— the same approach as :mod:`nanocrab.policy.rules`.
"""

from __future__ import annotations

import fnmatch
import importlib.resources
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from nanocrab.guardrails.alignment import check_alignment
from nanocrab.guardrails.classifier import shared_classifier
from nanocrab.guardrails.injection import detect_injection, needs_classifier
from nanocrab.guardrails.lists import CompiledList
from nanocrab.guardrails.model import Action, CheckContext, Checkpoint, Finding
from nanocrab.guardrails.pii import ENTITIES, Entity, detect_pii
from nanocrab.guardrails.secrets import detect_secrets
from nanocrab.yamlfile import line_of, read_yaml

BUNDLED = "default.yaml"
_FILTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]-]+")


class GuardrailsError(Exception):
    """Root of ``nanocrab.guardrails`` errors: a guardrails file that cannot be used as written."""


class _Filter(BaseModel):
    """What every filter has: identity, scope, threshold and action."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    checkpoints: tuple[Checkpoint, ...] = Field(min_length=1)
    tools: tuple[str, ...] | None = None
    agents: tuple[str, ...] | None = None
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    action: Action
    alert: bool = False
    reason: str = ""

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _FILTER_ID.fullmatch(value):
            raise ValueError(f"filter id {value!r} must be letters, digits, '_', '.', '-'")
        return value

    @field_validator("tools", "agents")
    @classmethod
    def _patterns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("an empty list matches nothing; remove the key to match everything")
        for pattern in value or ():
            if not _PATTERN.fullmatch(pattern):
                raise ValueError(f"{pattern!r} is not a name or an fnmatch pattern")
        return value

    @model_validator(mode="after")
    def _scope(self) -> _Filter:
        if self.tools is not None and not set(self.checkpoints) & {"tool_output", "tool_call"}:
            raise ValueError(
                "'tools' scopes tool_output and tool_call checks; add one of those checkpoints "
                "or remove 'tools'"
            )
        return self

    def applies(self, checkpoint: Checkpoint, context: CheckContext) -> bool:
        """Whether this filter runs for ``checkpoint`` in ``context`` (a tool or agent pattern
        needs the context to name a matching tool or agent)."""
        if checkpoint not in self.checkpoints:
            return False
        tool = context.tool
        if self.tools is not None and (
            tool is None or not any(fnmatch.fnmatchcase(tool, p) for p in self.tools)
        ):
            return False
        return self.agents is None or (
            context.agent is not None
            and any(fnmatch.fnmatchcase(context.agent, p) for p in self.agents)
        )

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        """The detector's findings on ``text`` (all scores; the chain applies the threshold)."""
        raise NotImplementedError


class PiiFilter(_Filter):
    """PII: :func:`nanocrab.guardrails.pii.detect_pii`."""

    detector: Literal["pii"]
    entities: tuple[Entity, ...] = ENTITIES
    region: str = Field(default="US", pattern=r"^[A-Z]{2}$")

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        return detect_pii(text, self.entities, region=self.region)


class SecretsFilter(_Filter):
    """Secrets: :func:`nanocrab.guardrails.secrets.detect_secrets`."""

    detector: Literal["secrets"]

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        return detect_secrets(text)


class InjectionFilter(_Filter):
    """Prompt injection: :func:`nanocrab.guardrails.injection.detect_injection`; with
    ``classifier: true`` (the default) the learned layer
    (:mod:`nanocrab.guardrails.classifier`) backs the heuristics where they are unsure."""

    detector: Literal["injection"]
    classifier: bool = True

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        learned = shared_classifier() if self.classifier else None
        if context.fast and learned is not None:
            found = detect_injection(text, checkpoint, threshold=self.threshold)
            if needs_classifier(text, checkpoint, found, self.threshold):
                return [Finding("injection", "UNSURE", "needs_classifier", 0, len(text), 1.0)]
            return found
        return detect_injection(text, checkpoint, classifier=learned, threshold=self.threshold)


class _ListFilter(_Filter):
    keywords: tuple[str, ...] = ()
    regexes: tuple[str, ...] = ()
    topics: dict[str, tuple[str, ...]] = {}
    domains: tuple[str, ...] = ()
    _compiled: CompiledList | None = PrivateAttr(default=None)

    @field_validator("regexes")
    @classmethod
    def _regexes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for rx in value:
            try:
                re.compile(rx)
            except re.error as exc:
                raise ValueError(f"regex {rx!r} does not compile: {exc}") from None
        return value

    @field_validator("domains")
    @classmethod
    def _domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for domain in value:
            if not re.fullmatch(r"(?:\*\.)?[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+", domain):
                raise ValueError(f"domain {domain!r}: use 'example.com' or '*.example.com'")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> _ListFilter:
        if not (self.keywords or self.regexes or self.topics or self.domains):
            raise ValueError("a list filter needs keywords, regexes, topics or domains")
        return self

    def _list(self, mode: str) -> CompiledList:
        if self._compiled is None:
            self._compiled = CompiledList.build(
                mode, keywords=self.keywords, regexes=self.regexes, topics=self.topics,
                domains=self.domains,
            )  # fmt: skip
        return self._compiled


class DenyListFilter(_ListFilter):
    """Fires on listed keywords, regexes, topic words and domains."""

    detector: Literal["deny_list"]

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        return self._list("deny").detect(text)


class AllowListFilter(_ListFilter):
    """Fires on URLs outside ``domains`` and on texts mentioning none of the listed content."""

    detector: Literal["allow_list"]

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        return self._list("allow").detect(text)


class AlignmentFilter(_Filter):
    """The offline alignment check (:func:`nanocrab.guardrails.alignment.check_alignment`) of
    the call in ``context.tool_call`` against ``context.task`` and ``context.untrusted``."""

    detector: Literal["alignment"]
    llm: bool = True
    on_llm_error: Literal["offline", "fire"] = "offline"

    @model_validator(mode="after")
    def _only_tool_calls(self) -> AlignmentFilter:
        if set(self.checkpoints) != {"tool_call"}:
            raise ValueError("the alignment detector checks tool calls: checkpoints: [tool_call]")
        return self

    def detect(self, text: str, checkpoint: Checkpoint, context: CheckContext) -> list[Finding]:
        """The offline rules, joined by the model's judgement when there is one (``llm``):
        misaligned adds ``0.6 + 0.35 * confidence`` as independent evidence; aligned halves
        the rules' score unless a secret leaves (``secret_out`` is never waived); no answer
        (``error``): ``on_llm_error: offline`` keeps the rules' score (the default, as without
        a key), ``fire`` fails closed (score 1, the filter's action applies)."""
        call = context.tool_call
        if call is None:
            return []
        result = check_alignment(context.task or "", call.tool, call.arguments, context.untrusted)
        score, reasons = result.score, list(result.reasons)
        if context.fast and self.llm and context.untrusted:
            # the model-based check may be asked about this call: only the handler knows
            return [Finding("alignment", "UNSURE", "needs_judge", 0, len(text), 1.0)]
        judged = context.judgement if self.llm else None
        kind = reasons[0].split(":", 1)[0] if reasons else ""
        if judged is not None and judged.aligned is False:
            weight = 0.6 + 0.35 * judged.confidence
            score = round(1.0 - (1.0 - score) * (1.0 - weight), 4)
            reasons.insert(0, f"llm_misaligned: {judged.model}: {judged.reason}")
            kind = "llm_misaligned"
        elif judged is not None and judged.aligned is True:
            if not any(r.startswith("secret_out") for r in reasons):
                score = round(score * 0.5, 4)
            reasons.append(f"llm_aligned: {judged.model}")
        elif judged is not None:
            reasons.append(f"llm_error: {judged.error}")
            if self.on_llm_error == "fire":
                score, kind = 1.0, "llm_unavailable"
        if not reasons or score <= 0.0:
            return []
        return [Finding("alignment", "MISALIGNED", kind or "llm", 0, len(text), score,
                        signals=tuple(reasons))]  # fmt: skip

    @property
    def wants_judge(self) -> bool:
        """Whether the handler should ask the model-based check for this filter's calls."""
        return self.llm


Filter = Annotated[
    PiiFilter
    | SecretsFilter
    | InjectionFilter
    | DenyListFilter
    | AllowListFilter
    | AlignmentFilter,
    Field(discriminator="detector"),
]
DETECTORS = ("pii", "secrets", "injection", "deny_list", "allow_list", "alignment")
_FILTER_FIELDS: dict[str, type[_Filter]] = {
    "pii": PiiFilter, "secrets": SecretsFilter, "injection": InjectionFilter,
    "deny_list": DenyListFilter, "allow_list": AllowListFilter, "alignment": AlignmentFilter,
}  # fmt: skip


class GuardrailsConfig(BaseModel):
    """A validated chain. Build with :func:`load_guardrails` or :meth:`from_mapping`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    filters: tuple[Filter, ...] = ()
    _source: str = PrivateAttr(default="<guardrails>")

    @property
    def source(self) -> str:
        """Where the chain came from (a file path, or the name given to ``from_mapping``)."""
        return self._source

    @model_validator(mode="after")
    def _unique_ids(self) -> GuardrailsConfig:
        counts = Counter(f.id for f in self.filters)
        dupes = [fid for fid, n in counts.items() if n > 1]
        if dupes:
            raise ValueError(f"duplicate filter id {dupes[0]!r}: filter ids must be unique")
        return self

    def has_filter_for(self, checkpoint: Checkpoint) -> bool:
        """Whether any filter watches ``checkpoint`` (no filter: the handler skips the hop)."""
        return any(checkpoint in f.checkpoints for f in self.filters)

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> GuardrailsConfig:
        """Validate already-parsed data (e.g. in tests); errors are :class:`GuardrailsError`."""
        return _validate(data, source, None)


_ADAPTER: TypeAdapter[GuardrailsConfig] = TypeAdapter(GuardrailsConfig)


def load_guardrails(path: Path | None = None) -> GuardrailsConfig:
    """The chain in ``path``, or the bundled ``default.yaml`` when ``path`` is ``None``.

    Raises :class:`GuardrailsError` for an unreadable file, YAML that is not plain data (tags,
    several documents, duplicate keys) and any validation failure, naming file and line.
    """
    if path is None:
        source = f"{__package__.replace('.', '/')}/{BUNDLED} (bundled)"
        text = importlib.resources.files(__package__).joinpath(BUNDLED).read_text("utf-8")
    else:
        source = str(path)
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise GuardrailsError(f"{source}: cannot read the guardrails file: {exc}") from exc
    return parse_guardrails(text, source)


def parse_guardrails(text: str, source: str = "<string>") -> GuardrailsConfig:
    """Parse and validate guardrails YAML held in memory (``source`` names it in errors)."""
    data, node = read_yaml(
        text, source, GuardrailsError, what="guardrails files",
        empty="the file is empty; it needs at least 'version: 1'",
    )  # fmt: skip
    return _validate(data, source, node)


def _validate(data: Any, source: str, node: yaml.Node | None) -> GuardrailsConfig:
    if not isinstance(data, dict):
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        raise GuardrailsError(f"{source}{line}: a guardrails file is a mapping with 'version: 1' "
                              "and 'filters'")  # fmt: skip
    try:
        config = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = [_describe(err, data, source, node) for err in exc.errors()]
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise GuardrailsError("\n".join(problems[:5]) + more) from exc
    config._source = source
    return config


def _describe(err: Mapping[str, Any], data: dict[str, Any], source: str,
              node: yaml.Node | None) -> str:  # fmt: skip
    loc: tuple[Any, ...] = tuple(err["loc"])
    label = ""
    field = loc
    model: type[_Filter] | None = None
    if len(loc) >= 2 and loc[0] == "filters" and isinstance(loc[1], int):
        raw = data.get("filters")
        item = raw[loc[1]] if isinstance(raw, list) and loc[1] < len(raw) else None
        fid = item.get("id") if isinstance(item, dict) else None
        n = loc[1] + 1
        label = f"filter {fid!r} (#{n})" if isinstance(fid, str) else f"filter #{n}"
        field = loc[2:]
        if field and field[0] in _FILTER_FIELDS:  # the discriminator's tag, not a YAML key
            model = _FILTER_FIELDS[field[0]]
            field = field[1:]
            loc = loc[:2] + field
    line = line_of(node, loc)
    where = f"{source}:{line}" if line else source
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        allowed = f" (allowed for this detector: {', '.join(model.model_fields)})" if model else ""
        message = f"unknown key{allowed}"
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        message = f"'detector' must be one of {', '.join(DETECTORS)}"
    elif err["type"] in ("literal_error", "enum") and isinstance(err.get("input"), str | int):
        message += f", not {err['input']!r}"
    parts = [p for p in (label, ".".join(str(f) for f in field)) if p]
    return f"{where}: {': '.join(parts)}: {message}" if parts else f"{where}: {message}"
