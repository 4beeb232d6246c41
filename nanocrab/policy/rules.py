"""The capability policy file (``policy.yaml``): typed rules, loaded safely, rejected loudly.

Format (every key shown; unknown keys are an error)::

    version: 1
    grant_ttl: 600              # seconds a grant stays valid
    approval:
      timeout: 300              # seconds an approval request waits before it expires (denied)
      approvers: []             # extra trusted approver public nkeys ("U…")
      trust_local_approver: true  # the data directory's own approver key is trusted
    exec:                       # the operating-system sandbox exec commands run in
      sandbox: required         # required | off (off: every command runs unconfined)
      env: [PIP_INDEX_URL]      # extra variables passed through; secret-like names are refused
      read_paths: ["/srv/data"] # extra read-only trees (absolute or ~)
      protect_git: true         # .git/config, .git/hooks, .git/modules read-only in the sandbox
      limits: {memory_mb: 4096, processes: 1024, file_size_mb: 1024, open_files: 4096}
    budgets:                    # spending caps (format: nanocrab/policy/budgets.py)
      run: {max_usd: 0.5, max_tokens: 200000}
      tenants: {"*": {max_usd: 10.0}}
    rules:
      - id: read-workspace      # unique, required
        tools: [read, ls, glob, grep]   # canonical tool names, or "*"
        paths: ["${workspace}"] # ${workspace} and a leading ~ are expanded; symlinks resolved
        tier: safe              # safe | guarded | unsafe | deny
        scope: step             # task | step | resource (default step)
        share_with_subagents: false  # a session approval under this rule also covers subagents
      - id: shell-tests
        tools: [exec]
        programs:               # per command: an allow-list of options and operands
          - command: ["python3 -m pytest", "pytest"]
            flags: [-q, -v, -x]
            options: {-k: text, --tb: [short, long, no]}
            operands: paths     # none | paths | git | modules
        tier: safe
      - id: shell-other
        tools: [exec]
        commands: ["make *"]    # fnmatch glob per command segment (coarse: use programs for safe)
        tier: guarded
      - id: web-docs
        tools: [web_fetch]
        hosts: ["docs.python.org", "*.python.org"]     # exact host, or subdomains at a label
        tier: safe
      - id: gmail
        tools: ["gmail.read"]
        scopes: ["gmail.read"]  # for tools without a path/URL/command: the tool name
        tier: guarded
      - id: mail-outside
        tools: [mail.send]
        resources: ["mail.to:*.example.com", "mail.to:example.com"]  # connectors (docs/tools.md):
        tier: deny              # fnmatch globs over the call's resources; deny: any matches,
      - id: mail-team           # other tiers: every resource matches
        tools: [mail.list, mail.read]
        resources: ["mail:work/*"]
        tier: safe
      - id: mcp-files
        tools: ["mcp.files.*"]  # a family: every tool of the MCP server "files" (docs/mcp.md)
        tier: deny
      - id: secrets
        tools: ["*"]
        paths: ["~/.ssh", "/etc"]
        tier: deny
      - id: homes
        tools: ["*"]
        paths: ["/home", "/root"]
        except_paths: ["${workspace}"]  # deny rules only: subtrees of ``paths`` left out
        tier: deny

A rule constrains at most one kind of resource (``paths``, ``hosts``, ``commands``,
``programs`` or ``scopes``); a rule with none matches every call of its tools. Which kind fits
which tool is checked at load time: ``commands`` and ``programs`` only with ``exec``
(``programs`` not in deny rules; their grammar is :mod:`nanocrab.policy.programs`); ``paths``
with the path tools (read, write, edit, ls, glob, grep) — and ``exec`` in a deny rule, where it
denies commands whose arguments lie in those paths; ``hosts`` with ``web_fetch`` and
``web_search`` (its provider's API host) or ``*``;
``scopes`` and ``resources`` (a connector's) with tools that have no path, URL or command.
The rule id ``nanocrab-data`` is reserved for the engine's built-in protection of the data
directory. How rules are applied is in :mod:`nanocrab.policy.engine`.

Files are read with ``yaml.safe_load`` semantics only: a YAML tag such as
``!!python/object/apply:os.system`` is refused, as are duplicate keys (which YAML would silently
resolve to the last one). Every :class:`PolicyError` names the file, the line, the rule (id and
position) and what to fix.
"""

from __future__ import annotations

import importlib.resources
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from nanocrab.events.values import GrantScope, RiskTier
from nanocrab.policy.budgets import Budgets
from nanocrab.policy.matchers import (
    EXEC_TOOL,
    HOST_TOOLS,
    PATH_TOOLS,
    TOOL_FAMILY,
    TOOL_NAME,
    host_list,
)
from nanocrab.policy.programs import Program
from nanocrab.tools.confine import Confinement, Limits
from nanocrab.tools.confine.env import SECRET_PATTERNS, secret_like
from nanocrab.yamlfile import line_of, read_yaml

BUNDLED = "default.yaml"
PROTECTED_RULE = "nanocrab-data"  # the engine's built-in rule: the data directory
_RULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NKEY_USER = re.compile(r"U[A-Z2-7]{55}")


class PolicyError(Exception):
    """Root of ``nanocrab.policy`` errors: a policy file that cannot be used as written."""


class Approval(BaseModel):
    """How approvals for guarded and unsafe calls work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: PositiveFloat = 300
    approvers: tuple[str, ...] = ()
    trust_local_approver: bool = True

    @field_validator("approvers")
    @classmethod
    def _public_nkeys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for key in value:
            if not _NKEY_USER.fullmatch(key):
                raise ValueError(
                    f"approver {key!r} is not a user public nkey ('U' and 55 base32 characters)"
                )
        return value


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")
_LIMITS = Limits()


class ExecLimits(BaseModel):
    """Resource limits of sandboxed exec commands (see :class:`nanocrab.tools.confine.Limits`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: PositiveInt = _LIMITS.memory_mb
    processes: PositiveInt = _LIMITS.processes
    file_size_mb: PositiveInt = _LIMITS.file_size_mb
    open_files: PositiveInt = _LIMITS.open_files


class ExecSettings(BaseModel):
    """How exec commands are confined (docs/security.md, "The exec sandbox").

    ``sandbox: required`` (the default) runs every command in the operating-system sandbox and,
    where the host cannot provide it, refuses Safe commands (approved ones run unconfined with a
    note); ``off`` is the explicit opt-out: every command runs unconfined.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox: Literal["required", "off"] = "required"
    env: tuple[str, ...] = ()
    read_paths: tuple[str, ...] = ()
    protect_git: bool = True
    limits: ExecLimits = ExecLimits()

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a variable name (letters, digits, '_'; a trailing '*' "
                    "matches a prefix)"
                )
            if secret_like(name):
                raise ValueError(
                    f"{name!r} looks like a secret and is never passed to commands (refused "
                    f"names: {', '.join(SECRET_PATTERNS)}); give the command what it needs "
                    "another way"
                )
        return value

    @field_validator("read_paths")
    @classmethod
    def _read_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if "\x00" in path or not path.startswith(("/", "~")):
                raise ValueError(f"read path {path!r} must be absolute or start with ~")
        return value

    def confinement(self, *, protected: tuple[Path, ...] = ()) -> Confinement:
        """The executor's base :class:`Confinement` (a Safe call's; the grant sets the tier and
        hosts per call). ``protected``: paths kept unreadable even inside readable trees."""
        return Confinement(
            required=self.sandbox == "required",
            env=self.env,
            read_paths=tuple(Path(p).expanduser() for p in self.read_paths),
            protected=protected,
            protect_git=self.protect_git,
            limits=Limits(**self.limits.model_dump()),
        )


class Rule(BaseModel):
    """One policy rule: which tools (and resources) it covers, and the tier it assigns."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    tools: tuple[str, ...] = Field(min_length=1)
    tier: RiskTier
    scope: GrantScope = "step"
    share_with_subagents: bool = False
    paths: tuple[str, ...] | None = None
    except_paths: tuple[str, ...] | None = None
    hosts: tuple[str, ...] | None = None
    commands: tuple[str, ...] | None = None
    programs: tuple[Program, ...] | None = None
    scopes: tuple[str, ...] | None = None
    resources: tuple[str, ...] | None = None  # connector resources (globs), docs/tools.md

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _RULE_ID.fullmatch(value):
            raise ValueError(f"rule id {value!r} must be letters, digits, '_', '.', '-'")
        if value == PROTECTED_RULE:
            raise ValueError(f"rule id {value!r} is reserved for the built-in data protection")
        return value

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name != "*" and not TOOL_NAME.fullmatch(name) and not TOOL_FAMILY.fullmatch(name):
                raise ValueError(
                    f"tool name {name!r} is not canonical: use lower-case names such as 'read' "
                    "or 'gmail.read' (^[a-z][a-z0-9_.-]*$), a family such as 'mcp.files.*' "
                    "(every tool of the MCP server 'files'), or '*' for every tool"
                )
        return value

    @field_validator("paths", "except_paths")
    @classmethod
    def _paths(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for path in value or ():
            rest = path.replace("${workspace}", "")
            if "$" in rest or "\x00" in path:
                raise ValueError(f"path {path!r}: only ${{workspace}} is expanded")
            if not path.startswith(("/", "~", "${workspace}")):
                raise ValueError(
                    f"path {path!r} must be absolute, start with ~ or with ${{workspace}}"
                )
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value:
            host_list(value)  # ValueError names the bad pattern
        return value

    @model_validator(mode="after")
    def _resource_fits_tools(self) -> Rule:
        kinds = {
            k: v
            for k, v in (
                ("paths", self.paths),
                ("hosts", self.hosts),
                ("commands", self.commands),
                ("programs", self.programs),
                ("scopes", self.scopes),
                ("resources", self.resources),
            )
            if v is not None
        }
        if len(kinds) > 1:
            raise ValueError(
                f"a rule constrains one kind of resource, not {' and '.join(kinds)}; "
                "split it into one rule per kind"
            )
        for kind, values in kinds.items():
            if not values:
                raise ValueError(f"'{kind}' is empty and would match nothing; remove it")
        named = set(self.tools) - {"*"}
        for kind in ("commands", "programs"):
            if kind in kinds and set(self.tools) != {EXEC_TOOL}:
                raise ValueError(f"'{kind}' only applies to exec: set tools: [exec]")
        if self.programs is not None and self.tier == "deny":
            raise ValueError(
                "'programs' allow-lists what a command may take; a deny rule names what to "
                "forbid with 'commands' globs or 'paths'"
            )
        if self.except_paths is not None and (self.paths is None or self.tier != "deny"):
            raise ValueError(
                "'except_paths' spares subtrees of a deny rule's 'paths'; use it in a rule "
                "with tier: deny and paths"
            )
        if self.paths is not None:
            fits = PATH_TOOLS | ({EXEC_TOOL} if self.tier == "deny" else set())
            _require(named <= fits, "paths", named - fits, "read, write, edit, ls, glob, grep "
                     "(and exec in deny rules)")  # fmt: skip
        if self.hosts is not None:
            _require(named <= HOST_TOOLS, "hosts", named - HOST_TOOLS, "web_fetch, web_search")
        for kind in ("scopes", "resources"):
            if kind in kinds:
                wrong = named & (PATH_TOOLS | HOST_TOOLS | {EXEC_TOOL})
                _require(not wrong, kind, wrong, "tools without a path, URL or command")
        return self


def _require(ok: bool, kind: str, wrong: set[str], fits: str) -> None:
    if not ok:
        names = ", ".join(sorted(wrong))
        raise ValueError(
            f"'{kind}' does not apply to {names}; it fits {fits} — give {names} its own rule"
        )


class Policy(BaseModel):
    """A validated policy. Build with :func:`load_policy` or :meth:`from_mapping`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    grant_ttl: PositiveInt = 600
    approval: Approval = Approval()
    exec: ExecSettings = ExecSettings()
    budgets: Budgets = Budgets()  # spending caps (nanocrab/policy/budgets.py)
    rules: tuple[Rule, ...] = ()

    _source: str = PrivateAttr(default="<policy>")
    # engine's compiled rules per (workspace, protected paths); values are engine._Rules
    _cache: dict[tuple[str, tuple[str, ...]], Any] = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> str:
        """Where the policy came from (a file path, or the name given to ``from_mapping``)."""
        return self._source

    @model_validator(mode="after")
    def _unique_ids(self) -> Policy:
        counts = Counter(rule.id for rule in self.rules)
        dupes = [rid for rid, n in counts.items() if n > 1]
        if dupes:
            raise ValueError(f"duplicate rule id {dupes[0]!r}: rule ids must be unique")
        return self

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> Policy:
        """Validate already-parsed data (e.g. in tests); errors are :class:`PolicyError`."""
        return _validate(data, source, None)


def load_policy(path: Path | None = None) -> Policy:
    """The policy in ``path``, or the bundled ``default.yaml`` when ``path`` is ``None``.

    Raises :class:`PolicyError` for an unreadable file, YAML that is not plain data (tags,
    several documents, duplicate keys) and any validation failure.
    """
    if path is None:
        source = f"{__package__.replace('.', '/')}/{BUNDLED} (bundled)"
        text = importlib.resources.files(__package__).joinpath(BUNDLED).read_text("utf-8")
    else:
        source = str(path)
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{source}: cannot read the policy file: {exc}") from exc
    data, node = read_yaml(
        text, source, PolicyError, what="policy files",
        empty="the policy file is empty; it needs at least 'version: 1'",
    )  # fmt: skip
    return _validate(data, source, node)


def _validate(data: Any, source: str, node: yaml.Node | None) -> Policy:
    if not isinstance(data, dict):
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        raise PolicyError(f"{source}{line}: a policy is a mapping with 'version: 1' and 'rules'")
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(err, data, source, node) for err in exc.errors()]
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise PolicyError("\n".join(problems[:5]) + more) from exc
    policy._source = source
    return policy


def _describe(err: Any, data: dict[str, Any], source: str, node: yaml.Node | None) -> str:
    loc: tuple[Any, ...] = tuple(err["loc"])
    line = line_of(node, loc)
    where = f"{source}:{line}" if line else source
    label = ""
    field = loc
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        raw = data.get("rules")
        rule = raw[loc[1]] if isinstance(raw, list) and loc[1] < len(raw) else None
        rid = rule.get("id") if isinstance(rule, dict) else None
        label = f"rule {rid!r} (#{loc[1] + 1})" if isinstance(rid, str) else f"rule #{loc[1] + 1}"
        field = loc[2:]
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        model = Rule if label and len(field) == 1 else None
        allowed = f" (allowed: {', '.join(model.model_fields)})" if model else ""
        message = f"unknown key{allowed}"
    elif err["type"] in ("literal_error", "enum") and isinstance(err.get("input"), str | int):
        message += f", not {err['input']!r}"
    parts = [p for p in (label, ".".join(str(f) for f in field)) if p]
    return f"{where}: {': '.join(parts)}: {message}" if parts else f"{where}: {message}"
