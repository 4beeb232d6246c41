"""What a generated capability is: one Python source file with a literal ``CAPABILITY`` dict.

A capability module assigns ``CAPABILITY`` once, at top level, to a dict literal::

    CAPABILITY = {
        "name": "word_count",            # ^[a-z][a-z0-9_]{1,47}$
        "version": "1.0.0",               # x.y.z
        "description": "Count words in a text.",
        "entry": "run",                   # a top-level ``def`` in the same file
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]},  # JSON Schema for entry's keyword arguments
        "permissions": [],                # optional; any of "fs.read", "fs.write", "net"
        "user_guidance": "Pass the text.", # optional; how to use it, for people and the model
        "requires": [],                   # optional; names of capabilities it depends on
    }

and defines its tests as top-level ``def test_*()`` functions using plain ``assert``.

:func:`parse_module` reads all of this without executing anything (``ast`` and
``ast.literal_eval`` only). It checks the metadata, not the code's safety: run
:func:`nanocrab.capabilities.scan.scan` for that.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from nanocrab.capabilities.rules import PERMISSIONS
from nanocrab.capabilities.scan import Permission

METADATA_NAME = "CAPABILITY"
MAX_DESCRIPTION_CHARS = 1024
MAX_GUIDANCE_CHARS = 2000
MAX_REQUIRES = 16
TEST_PREFIX = "test_"

_NAME = re.compile(r"[a-z][a-z0-9_]{1,47}")
_VERSION = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")

CapabilityErrorKind = Literal[
    "syntax",  # the source does not parse
    "missing_metadata",  # no top-level CAPABILITY assignment, or more than one
    "not_literal",  # CAPABILITY's value uses names, calls or other non-literal expressions
    "invalid_metadata",  # the dict fails CapabilitySpec validation
    "invalid_entry",  # entry is not a top-level def, or its signature disagrees with parameters
]


class CapabilityError(Exception):
    """A capability module's metadata is unusable.

    ``message`` names the problem and says what to change, for the model that wrote the module;
    ``line`` is the 1-based source line concerned, when there is one.
    """

    def __init__(self, kind: CapabilityErrorKind, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.kind: CapabilityErrorKind = kind
        self.message = message
        self.line = line


class CapabilitySpec(BaseModel):
    """The validated ``CAPABILITY`` dict. Unknown keys are rejected so a typo is not lost.

    ``parameters`` is a JSON Schema (draft 2020-12) of ``"type": "object"`` describing the
    keyword arguments ``entry`` is called with; it may hold only JSON values.
    ``permissions`` is normalised to a sorted tuple without duplicates, and so is ``requires``
    (capability names; a module cannot require itself). ``user_guidance``: how to use it, for
    people and the model (``""``: the registry keeps the request's guidance instead).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    description: str
    entry: str
    parameters: dict[str, object]
    permissions: tuple[Permission, ...] = ()
    user_guidance: str = ""
    requires: tuple[str, ...] = ()

    @field_validator("name", mode="before")
    @classmethod
    def _check_name(cls, value: object) -> object:
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise PydanticCustomError(
                "capability_name",
                "{value} is not a valid name: use 2-48 lowercase letters, digits and "
                "underscores, starting with a letter, e.g. 'word_count'",
                {"value": repr(value)},
            )
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _check_version(cls, value: object) -> object:
        if not isinstance(value, str) or not _VERSION.fullmatch(value):
            raise PydanticCustomError(
                "capability_version",
                "{value} is not a valid version: use a string 'MAJOR.MINOR.PATCH', e.g. '1.0.0'",
                {"value": repr(value)},
            )
        return value

    @field_validator("description", mode="before")
    @classmethod
    def _check_description(cls, value: object) -> object:
        if not isinstance(value, str) or not value.strip():
            raise PydanticCustomError(
                "capability_description", "must be a non-empty string saying what it does"
            )
        if len(value.strip()) > MAX_DESCRIPTION_CHARS:
            raise PydanticCustomError(
                "capability_description",
                "is {n} characters long; the limit is {limit}",
                {"n": len(value.strip()), "limit": MAX_DESCRIPTION_CHARS},
            )
        return value.strip()

    @field_validator("entry", mode="before")
    @classmethod
    def _check_entry(cls, value: object) -> object:
        if not isinstance(value, str) or not value.isidentifier() or value.startswith("_"):
            raise PydanticCustomError(
                "capability_entry",
                "{value} is not a function name: name a public top-level function, e.g. 'run'",
                {"value": repr(value)},
            )
        return value

    @field_validator("parameters", mode="before")
    @classmethod
    def _check_parameters(cls, value: object) -> object:
        if not isinstance(value, dict) or value.get("type") != "object":
            raise PydanticCustomError(
                "capability_parameters",
                'must be a JSON Schema object with "type": "object" describing the entry '
                "function's keyword arguments (got {value})",
                {"value": _short(value)},
            )
        where = _non_json(value, "parameters")
        if where is not None:
            raise PydanticCustomError(
                "capability_parameters",
                "must hold only JSON values (dicts with string keys, lists, strings, numbers, "
                "booleans, None); {where} is not one",
                {"where": where},
            )
        from jsonschema import Draft202012Validator  # ~50 ms to import: only when checked
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            path = "".join(f"[{p!r}]" for p in exc.absolute_path)
            raise PydanticCustomError(
                "capability_parameters",
                "is not a valid JSON Schema: parameters{path}: {reason}",
                {"path": path, "reason": exc.message},
            ) from exc
        return value

    @field_validator("permissions", mode="before")
    @classmethod
    def _check_permissions(cls, value: object) -> object:
        if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
            raise PydanticCustomError(
                "capability_permissions", "must be a list of strings, e.g. [] or ['net']"
            )
        unknown = sorted(set(value) - PERMISSIONS)
        if unknown:
            raise PydanticCustomError(
                "capability_permissions",
                "unknown permission(s) {unknown}: declare only {known}",
                {"unknown": ", ".join(map(repr, unknown)), "known": ", ".join(sorted(PERMISSIONS))},
            )
        return tuple(sorted(set(value)))

    @field_validator("user_guidance", mode="before")
    @classmethod
    def _check_guidance(cls, value: object) -> object:
        if not isinstance(value, str):
            raise PydanticCustomError("capability_guidance", "must be a string")
        if len(value.strip()) > MAX_GUIDANCE_CHARS:
            raise PydanticCustomError(
                "capability_guidance",
                "is {n} characters long; the limit is {limit}",
                {"n": len(value.strip()), "limit": MAX_GUIDANCE_CHARS},
            )
        return value.strip()

    @field_validator("requires", mode="before")
    @classmethod
    def _check_requires(cls, value: object) -> object:
        if not isinstance(value, list | tuple) or not all(isinstance(r, str) for r in value):
            raise PydanticCustomError(
                "capability_requires", "must be a list of capability names, e.g. ['word_count']"
            )
        bad = [r for r in value if not _NAME.fullmatch(r)]
        if bad:
            raise PydanticCustomError(
                "capability_requires",
                "{bad} is not a capability name (2-48 lowercase letters, digits, underscores)",
                {"bad": repr(bad[0])},
            )
        if len(set(value)) > MAX_REQUIRES:
            raise PydanticCustomError(
                "capability_requires", "lists more than {n} capabilities", {"n": MAX_REQUIRES}
            )
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _not_itself(self) -> CapabilitySpec:
        if self.name in self.requires:
            raise PydanticCustomError(
                "capability_requires", "a capability cannot require itself ({name})",
                {"name": repr(self.name)},
            )  # fmt: skip
        return self


@dataclass(frozen=True)
class ParsedModule:
    """A capability module whose metadata checked out; its code is not yet scanned or run.

    ``content_hash`` is the sha256 hex digest of the UTF-8 source, so identical sources share it.
    ``test_names`` are the top-level ``def test_*`` functions, in source order.
    """

    spec: CapabilitySpec
    source: str
    content_hash: str
    test_names: tuple[str, ...]


def content_hash(source: str) -> str:
    """The sha256 hex digest of ``source`` encoded as UTF-8."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def parse_module(source: str) -> ParsedModule:
    """Extract and validate ``CAPABILITY`` from ``source`` without executing it.

    Raises :class:`CapabilityError` whose ``kind`` says which check failed and whose message
    says what to change.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CapabilityError(
            "syntax", f"line {exc.lineno}: syntax error: {exc.msg}", line=exc.lineno
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise CapabilityError("syntax", f"the source does not parse: {exc}") from exc
    node = _metadata_node(tree)
    raw = _literal(node, source)
    if not isinstance(raw, dict):
        raise CapabilityError(
            "invalid_metadata",
            f"{METADATA_NAME} must be a dict literal, not a {type(raw).__name__}",
            line=node.lineno,
        )
    try:
        spec = CapabilitySpec.model_validate(raw)
    except ValidationError as exc:
        raise CapabilityError(
            "invalid_metadata", _describe(exc), line=_key_line(node, exc)
        ) from exc
    _check_entry(tree, spec)
    tests = tuple(
        stmt.name
        for stmt in tree.body
        if isinstance(stmt, ast.FunctionDef) and stmt.name.startswith(TEST_PREFIX)
    )
    return ParsedModule(spec, source, content_hash(source), tests)


def _metadata_node(tree: ast.Module) -> ast.expr:
    """The value assigned to ``CAPABILITY`` by the module's single top-level assignment."""
    values: list[ast.expr] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == METADATA_NAME for t in stmt.targets):
                values.append(stmt.value)
        elif (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id == METADATA_NAME
            and stmt.value is not None
        ):
            values.append(stmt.value)
    if not values:
        raise CapabilityError(
            "missing_metadata",
            f"no top-level {METADATA_NAME} = {{...}} assignment: add the metadata dict with "
            "name, version, description, entry, parameters and permissions",
        )
    if len(values) > 1:
        lines = ", ".join(str(v.lineno) for v in values)
        raise CapabilityError(
            "missing_metadata",
            f"{METADATA_NAME} is assigned {len(values)} times (lines {lines}); assign it once",
            line=values[1].lineno,
        )
    return values[0]


_LITERAL_NODES = (
    ast.Constant,
    ast.Dict,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.UnaryOp,
    ast.USub,
    ast.UAdd,
    ast.Load,
)


def _literal(node: ast.expr, source: str) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        bad = next((n for n in ast.walk(node) if not isinstance(n, _LITERAL_NODES)), node)
        segment = ast.get_source_segment(source, bad) or type(bad).__name__
        text = segment.splitlines()[0][:57]
        if text != segment:
            text += "..."
        raise CapabilityError(
            "not_literal",
            f"{METADATA_NAME} must be a plain literal (strings, numbers, booleans, None, lists, "
            f"dicts), with no names, calls or expressions: `{text}` on line "
            f"{getattr(bad, 'lineno', node.lineno)} is not a literal",
            line=getattr(bad, "lineno", node.lineno),
        ) from exc


def _describe(exc: ValidationError) -> str:
    problems: list[str] = []
    for error in exc.errors():
        key = ".".join(str(p) for p in error["loc"]) or METADATA_NAME
        if error["type"] == "missing":
            problems.append(f"{key!r} is missing")
        elif error["type"] == "extra_forbidden":
            allowed = ", ".join(CapabilitySpec.model_fields)
            problems.append(f"{key!r} is not a known key (allowed: {allowed})")
        else:
            problems.append(f"{key!r}: {error['msg']}")
    return f"{METADATA_NAME} is invalid: " + "; ".join(problems)


def _key_line(node: ast.expr, exc: ValidationError) -> int:
    """The line of the first offending key in the dict literal, else of the dict."""
    first = exc.errors()[0]["loc"][:1]
    if isinstance(node, ast.Dict) and first:
        for key in node.keys:
            if isinstance(key, ast.Constant) and key.value == first[0]:
                return key.lineno
    return node.lineno


def _check_entry(tree: ast.Module, spec: CapabilitySpec) -> None:
    """``entry`` is a top-level plain ``def`` that accepts exactly the schema's arguments."""
    defs = {
        stmt.name: stmt
        for stmt in tree.body
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    fn = defs.get(spec.entry)
    if not isinstance(fn, ast.FunctionDef):
        found = "" if fn is None else f" (line {fn.lineno} defines it with {_kind(fn)})"
        raise CapabilityError(
            "invalid_entry",
            f"entry {spec.entry!r} is not defined as a top-level function{found}: add "
            f"`def {spec.entry}(...)` at the top level of the module",
            line=None if fn is None else fn.lineno,
        )
    problem = _signature_problem(fn, spec.parameters)
    if problem is not None:
        raise CapabilityError("invalid_entry", f"{spec.entry}(): {problem}", line=fn.lineno)


def _kind(node: ast.AST) -> str:
    return "async def" if isinstance(node, ast.AsyncFunctionDef) else "class"


def _signature_problem(fn: ast.FunctionDef, schema: dict[str, object]) -> str | None:
    """Why ``fn`` cannot be called with keyword arguments valid under ``schema``, if it can't."""
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    names = set(properties) if isinstance(properties, dict) else set()
    needed = set(required) if isinstance(required, list) else set()
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    without_default = [a.arg for a, d in zip(positional, defaults, strict=True) if d is None]
    without_default += [
        a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
    ]
    posonly = {a.arg for a in args.posonlyargs}
    accepted = {a.arg for a in [*args.args, *args.kwonlyargs]}
    for arg in without_default:
        if arg in posonly:
            return f"argument {arg!r} is positional-only; entry is called with keyword arguments"
        if arg not in names:
            return (
                f"argument {arg!r} has no default and is not in parameters['properties']: "
                "describe it there or give it a default"
            )
        if arg not in needed:
            return (
                f"argument {arg!r} has no default but is not in parameters['required']: "
                "list it there or give it a default"
            )
    if args.kwarg is None:
        extra = sorted(names - accepted)
        if extra:
            return (
                f"parameters['properties'] lists {', '.join(map(repr, extra))} but the function "
                "has no such argument: add the argument or remove the property"
            )
    return None


def _non_json(value: object, where: str) -> str | None:
    """The path of the first value in ``value`` that JSON cannot represent, if any."""
    if value is None or isinstance(value, str | bool | int | float):
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _non_json(item, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"the key {key!r} in {where}"
            found = _non_json(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    return f"{where} (a {type(value).__name__})"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
