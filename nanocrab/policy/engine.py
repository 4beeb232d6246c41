"""Deciding one tool call: ``evaluate(policy, request, budget) -> Decision``. Pure and synchronous.

Evaluation order (the first step that decides, decides):

1. **Tool name**: ``request.tool`` must be exactly one of ``request.known_tools``. Lookalikes
   (``Read``, ``read ``, ``rea%64``, homoglyphs, zero-width characters) are denied as unknown,
   with a "did you mean" hint when close.
2. **Argument sanity**: every string used as a resource (path, URL, command) is refused if it
   holds NUL, C0/C1 control, bidi or zero-width characters (commands may hold tabs and
   newlines); a URL must be http(s) without userinfo and with a canonical host; a command must
   parse and be free of substitution, expansion, assignment prefixes and indirection
   (:func:`nanocrab.policy.shell.parse_command`).
3. **Resource**: path tools (read, write, edit, ls, glob, grep) → the real path of ``path``
   (ls/glob/grep default ``.``), joined to the workspace with ``..`` and symlinks followed (a
   path outside the workspace is still a resource: rules decide), plus its lexical form;
   ``exec`` → the command; ``web_fetch`` → the URL's normalised host; ``web_search`` → its
   provider's API host (``request.tool_hosts``, when given); a connector tool → the resources
   it derived from its arguments (``request.resources``: ``mail:work/INBOX``,
   ``mail.to:example.org``, ``calendar:team``; docs/tools.md); any other tool → its name
   as the scope (``python`` also mounts the whole workspace).
4. **Protected paths** (built in, no policy file can change it): ``request.protected`` — the
   nanocrab data directory with its signing keys, log and database, and the policy file — is
   denied to every tool under the rule name ``nanocrab-data``: a path in it (real or as
   written), a grep descending into it, an exec argument, glob or redirection reaching it, a
   ``python`` mount of a workspace holding it. A workspace that lies strictly inside a protected
   directory (the default ``<home>/workspace``) is spared; one that *is* it, is not.
5. **Deny rules**, wherever they stand in the file: if any matches, deny (deny wins). A deny
   rule's ``paths`` match a path inside them, real or as written, minus its ``except_paths``
   subtrees (``except_paths`` that lie inside the rule's path; ``${workspace}`` spares a
   workspace inside a home directory) — and for glob/grep, which descend, also a directory
   containing them; for exec, any command argument, redirection, glob's current match or glob
   pattern reaching them; for ``python``, a workspace holding them. A deny rule's ``commands``
   match when any segment, or any tail of a segment's words (so
   ``nohup``/``timeout``/``xargs`` cannot hide a command), matches a glob.
6. **Other rules**, top to bottom: the first that matches assigns its tier, scope and
   ``share_with_subagents``. (In every rule, ``tools`` match a name exactly, or a family:
   ``mcp.files.*`` matches every name starting ``mcp.files.``.) A rule's ``commands`` match
   only when every segment of the command matches one of its globs, its ``programs`` when
   every segment is accepted by one of its
   argument grammars (:mod:`nanocrab.policy.programs`), its ``resources`` when every resource of
   a connector call matches one of its globs (a deny rule's: when any does). A **Safe** rule
   matches an exec call only if the command writes nothing through redirection (``>``,
   ``>>``, ``>|`` to anything but ``/dev/null``) and — for ``commands`` globs and rules without
   a resource — every word read as a path stays inside the workspace; otherwise the next rule
   decides (in the default policy ``shell-other``: Unsafe), and the reason says why the Safe
   rule did not apply.
7. **Nothing matched**: deny, with a hint for the rule to add to policy.yaml.
8. **Floor** (built in): a write into a ``.git`` directory (``write``/``edit`` of such a path,
   an exec redirection into one) is at least Unsafe — hooks and config there run code on
   later git calls.
9. **Budget** (when given): the call must be covered by one of the task's capabilities (same
   tool or ``*``; access ``any`` or equal; a resource, when set, contains the path / matches the
   host / equals the scope / matches every command segment; each of a connector call's resources
   matched by some capability's glob), else deny. A budget only narrows:
   it never turns a deny into anything else and never changes a tier.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nanocrab.events.values import Capability, GrantScope, RiskTier
from nanocrab.policy.commands import covered, forbidden, git_write, not_safe
from nanocrab.policy.matchers import (
    EXEC_TOOL,
    HOST_TOOLS,
    MOUNT_TOOLS,
    PATH_TOOLS,
    URL_TOOLS,
    WALK_TOOLS,
    Refused,
    Zone,
    check_text,
    check_tool_name,
    compile_globs,
    expand_rule_path,
    host_list,
    inside,
    inside_any,
    lexical_path,
    parse_url,
    resolve_path,
)
from nanocrab.policy.programs import Grammar, compile_program
from nanocrab.policy.rules import PROTECTED_RULE, Policy, Rule
from nanocrab.policy.shell import ParsedCommand, parse_command, word_in_zone
from nanocrab.tools.hosts import HostAllowList, normalise_host

Access = Literal["read", "write", "execute", "network", "any"]
_ACCESS: dict[str, Access] = {
    "read": "read", "ls": "read", "glob": "read", "grep": "read",
    "write": "write", "edit": "write", EXEC_TOOL: "execute", "web_fetch": "network",
    "web_search": "network",
}  # fmt: skip
_DOT_DEFAULT = frozenset({"ls", "glob", "grep"})
_CONTENT_WALKERS = frozenset({"grep"})  # walk tools that read what they find, not only names
_RANK: dict[RiskTier, int] = {"safe": 0, "guarded": 1, "unsafe": 2, "deny": 3}
_MAX_WORKSPACES = 64


@dataclass(frozen=True)
class CallResources:
    """What a connector tool says a call touches, derived from its arguments alone:
    ``names`` such as ``mail:work/INBOX`` or ``mail.to:example.org``, and its ``access``."""

    names: tuple[str, ...]
    access: Access


@dataclass(frozen=True)
class Request:
    """One tool call to decide. ``workspace`` is already a real path; ``protected`` are paths
    no tool may touch whatever the policy says (the data directory, the policy file)."""

    tool: str
    arguments: Mapping[str, Any]
    workspace: Path
    known_tools: frozenset[str]
    protected: tuple[str, ...] = ()
    # tools that reach one fixed host set by configuration (web_search → its provider's API
    # host): that host is the call's resource, decided by ``hosts`` rules like a URL's
    tool_hosts: Mapping[str, str] = field(default_factory=dict)
    resources: CallResources | None = None  # a connector call's resources (docs/tools.md)


@dataclass(frozen=True)
class Decision:
    """The policy's answer. ``capabilities`` is what a grant would cover (empty when denied);
    ``resource`` is the canonical resource to bind a grant or approval to; ``rule`` is the id of
    the deciding rule (``nanocrab-data`` for the built-in protection; ``None`` for default deny,
    the sanity checks and a budget refusal)."""

    tier: RiskTier
    reason: str
    rule: str | None
    capabilities: tuple[Capability, ...]
    resource: str | None
    scope: GrantScope
    share_with_subagents: bool


@dataclass(frozen=True, slots=True)
class _Target:
    tool: str
    kind: Literal["path", "host", "command", "scope", "resources"]
    resource: str
    access: Access
    names: tuple[str, ...] = ()  # a connector call's resources (kind "resources")
    walks: bool = False
    command: ParsedCommand | None = None
    lexical: str | None = None  # a path as written, ``..`` applied
    mounts: str | None = None  # the workspace, for tools that mount it whole

    def describe(self) -> str:
        if self.kind == "path":
            return f"{self.tool} on {self.resource}"
        if self.kind == "host":
            return f"{self.tool} of host {self.resource!r}"
        if self.kind == "command":
            return f"exec of {self.resource!r}"
        if self.kind == "resources":
            return f"{self.tool} on {', '.join(self.names)}"
        return self.tool


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    tools: frozenset[str] | None  # None: every tool
    families: tuple[str, ...]  # prefixes of tool families ("mcp.files." for "mcp.files.*")
    paths: tuple[str, ...] | None
    zone: Zone | None  # a deny rule's paths, minus their except_paths
    hosts: HostAllowList | None
    commands: tuple[re.Pattern[str], ...] | None
    programs: tuple[Grammar, ...] | None
    scopes: frozenset[str] | None
    resources: tuple[re.Pattern[str], ...] | None


@dataclass(frozen=True, slots=True)
class _Rules:
    workspace: str
    protected: Zone
    deny: tuple[_Compiled, ...]
    ordered: tuple[_Compiled, ...]


def evaluate(
    policy: Policy, request: Request, budget: Sequence[Capability] | None = None
) -> Decision:
    """Decide ``request`` under ``policy`` (narrowed by ``budget``); see the module docstring."""
    rules = _rules_for(policy, str(request.workspace), request.protected)
    try:
        tool = check_tool_name(request.tool, request.known_tools)
        target = _target(
            tool, request.arguments, rules.workspace, request.tool_hosts, request.resources
        )
    except Refused as exc:
        return _deny(exc.reason, None, None)
    hit = _in_zone(rules.protected, target, walks=target.tool in _CONTENT_WALKERS)
    if hit is not None:
        return _deny(
            f"{hit}: that is nanocrab's own data (signing keys, the event log, the database, "
            "the policy), which no tool may read or change whatever the policy says. Do not "
            "retry; work inside the workspace",
            PROTECTED_RULE,
            target.resource,
        )
    for compiled in rules.deny:
        detail = _match(compiled, target, rules.workspace, deny=True)
        if detail is not None:
            return _deny(
                f"denied by rule {compiled.rule.id!r}: {detail}. Do not retry this call; "
                "policy.yaml forbids it",
                compiled.rule.id,
                target.resource,
            )
    notes: list[str] = []
    chosen = next(
        (
            c.rule
            for c in rules.ordered
            if _match(c, target, rules.workspace, notes=notes) is not None
        ),
        None,
    )
    if chosen is None:
        return _deny(_no_rule(target, rules.ordered, notes), None, target.resource)
    tier: RiskTier = chosen.tier
    reason = f"rule {chosen.id!r} assigns tier {tier} to {target.describe()}"
    raised = _git_write(target)
    if raised is not None and _RANK[tier] < _RANK["unsafe"]:
        tier = "unsafe"
        reason += f"; raised to unsafe: {raised}"
    if notes and chosen.tier != "safe":
        reason += f" (not Safe: {notes[0]})"
    if budget is not None and not _within(budget, target, rules.workspace):
        held = ", ".join(_show(cap) for cap in budget) or "nothing"
        return _deny(
            f"{target.describe()} is outside the task's capability budget (it holds: {held}); "
            "stay within it, or ask the user for a task whose budget covers this",
            None,
            target.resource,
        )
    return Decision(
        tier=tier,
        reason=reason,
        rule=chosen.id,
        capabilities=tuple(
            Capability(tool=tool, resource=name, access=target.access)
            for name in (target.names or (target.resource,))
        ),
        resource=target.resource,
        scope=chosen.scope,
        share_with_subagents=chosen.share_with_subagents,
    )


def _deny(reason: str, rule: str | None, resource: str | None) -> Decision:
    return Decision(
        tier="deny", reason=reason, rule=rule, capabilities=(), resource=resource,
        scope="step", share_with_subagents=False,
    )  # fmt: skip


# --- steps 2 and 3: the call's resource ---------------------------------------------------------


def _target(
    tool: str,
    arguments: Mapping[str, Any],
    workspace: str,
    tool_hosts: Mapping[str, str],
    resources: CallResources | None = None,
) -> _Target:
    if resources is not None:
        if not resources.names:
            raise Refused(f"{tool} names no resource; it cannot be granted")
        for name in resources.names:
            check_text(name, "resource")
        joined = ", ".join(resources.names)
        return _Target(tool, "resources", joined, resources.access, names=resources.names)
    access = _ACCESS.get(tool, "any")
    if tool in PATH_TOOLS:
        raw = _string(arguments, "path", "." if tool in _DOT_DEFAULT else None)
        check_text(raw, "path")
        if not raw.strip():
            raise Refused("the path is empty; give a path inside the workspace")
        real = resolve_path(workspace, raw)
        lexical = lexical_path(workspace, raw)
        return _Target(tool, "path", real, access, walks=tool in WALK_TOOLS, lexical=lexical)
    if tool == EXEC_TOOL:
        command = _string(arguments, "command")
        parsed = parse_command(command, workspace)
        return _Target(tool, "command", command, access, command=parsed)
    if tool in URL_TOOLS:
        return _Target(tool, "host", parse_url(_string(arguments, "url")), access)
    if tool in HOST_TOOLS and tool in tool_hosts:
        return _Target(tool, "host", normalise_host(tool_hosts[tool]), access)
    return _Target(tool, "scope", tool, access, mounts=workspace if tool in MOUNT_TOOLS else None)


def _string(arguments: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = arguments.get(key, default)
    if not isinstance(value, str):
        problem = "is missing" if value is None else f"must be a string, not {type(value).__name__}"
        raise Refused(f"the argument {key!r} {problem}")
    return value


# --- steps 4 to 6: protected paths and rules ----------------------------------------------------


def _in_zone(zone: Zone, target: _Target, *, walks: bool) -> str | None:
    """Why ``target`` reaches ``zone`` (``walks``: also by descending into it), or ``None``."""
    if target.kind == "path":
        for path in dict.fromkeys((target.resource, target.lexical or target.resource)):
            root = zone.holds(path)
            if root is not None:
                return f"{path} is inside {root}"
        if walks:
            for root in zone.below(target.resource):
                return (
                    f"{target.tool} would descend from {target.resource} into {root}; "
                    "search a narrower directory"
                )
        return None
    if target.command is not None:
        for word in target.command.every_path():
            hit = word_in_zone(word, zone)
            if hit is not None:
                return hit
        return None
    if target.mounts is not None:
        root = zone.holds(target.mounts) or next(zone.below(target.mounts), None)
        if root is not None:
            return (
                f"{target.tool} mounts the whole workspace {target.mounts}, which holds {root}; "
                "keep that out of the workspace"
            )
    return None


def _match(
    c: _Compiled, target: _Target, workspace: str, *, deny: bool = False,
    notes: list[str] | None = None,
) -> str | None:  # fmt: skip
    """``None`` when ``c`` does not match ``target``; else what matched, for the reason.
    ``notes`` collects why a rule whose commands fit did not match (for the model)."""
    if (
        c.tools is not None
        and target.tool not in c.tools
        and not target.tool.startswith(c.families)
    ):
        return None
    if c.zone is not None:  # a deny rule's paths
        return _in_zone(c.zone, target, walks=target.walks)
    if c.paths is not None:
        root = inside_any(target.resource, c.paths) if target.kind == "path" else None
        return f"{target.resource} is inside {root}" if root is not None else None
    if c.hosts is not None:
        ok = target.kind == "host" and c.hosts.allows(target.resource)
        return f"host {target.resource!r} matches {', '.join(c.hosts.patterns)}" if ok else None
    if c.commands is not None and deny:
        return forbidden(c.commands, target.command) if target.command is not None else None
    if c.commands is not None or c.programs is not None:
        return _match_exec(c, target, workspace, notes)
    if c.resources is not None:
        return _match_resources(c.resources, target, deny=deny)
    if c.scopes is not None:
        ok = target.kind == "scope" and target.resource in c.scopes
        return f"scope {target.resource!r}" if ok else None
    if not deny and c.rule.tier == "safe" and target.command is not None:
        bad = not_safe(target.command, workspace, paths=True)
        if bad is not None:
            _note(notes, c, bad)
            return None
    return f"{target.tool} is covered by this rule whatever its arguments"


def _match_resources(
    globs: tuple[re.Pattern[str], ...], target: _Target, *, deny: bool
) -> str | None:
    """A deny rule matches when any of the call's resources matches a glob; any other rule
    when every one does."""
    if target.kind != "resources":
        return None
    hits = [name for name in target.names if any(g.match(name) for g in globs)]
    if deny:
        return f"resource {hits[0]!r} matches" if hits else None
    return f"{', '.join(target.names)} match" if len(hits) == len(target.names) else None


def _match_exec(
    c: _Compiled, target: _Target, workspace: str, notes: list[str] | None
) -> str | None:
    if target.command is None:
        return None
    ok, why = covered(
        target.command, workspace, globs=c.commands, grammars=c.programs,
        safe=c.rule.tier == "safe",
    )  # fmt: skip
    if why is not None:
        _note(notes, c, why)
    return f"every part of {target.resource!r} matches" if ok else None


def _note(notes: list[str] | None, c: _Compiled, text: str) -> None:
    if notes is not None:
        notes.append(f"rule {c.rule.id!r} does not cover it: {text}")


def _git_write(target: _Target) -> str | None:
    if target.kind == "path" and target.access == "write":
        return git_write((target.resource, target.lexical or target.resource))
    if target.command is not None:
        return git_write(p for w in target.command.writes for p in (w.path, w.lexical))
    return None


def _no_rule(target: _Target, ordered: tuple[_Compiled, ...], notes: list[str]) -> str:
    head = f"no rule allows {target.describe()}"
    if target.kind == "command" and target.command is not None:
        globs = [g for c in ordered if c.commands is not None for g in c.commands]
        segments = target.command.segments
        missing = [s.text for s in segments if not any(g.match(s.text) for g in globs)]
        if notes:
            head += f" ({notes[0]})"
        elif missing and len(segments) > 1:
            head += f" (not covered: {', '.join(repr(m) for m in missing)})"
        hint = "commands: [...]"
    elif target.kind == "path":
        hint = f"paths: [{target.resource!r}]"
    elif target.kind == "host":
        hint = f"hosts: [{target.resource!r}]"
    elif target.kind == "resources":
        hint = f"resources: {list(target.names)!r}"
    else:
        hint = f"scopes: [{target.tool!r}]"
    return (
        f"{head}; do not retry — ask the user to add a rule with tools: [{target.tool!r}] and "
        f"{hint} to policy.yaml if it is needed"
    )


# --- step 7: budget -----------------------------------------------------------------------------


def _within(budget: Sequence[Capability], target: _Target, workspace: str) -> bool:
    """Whether ``budget`` covers the call: some capability covers it — for a connector call,
    each of its resources."""
    if target.kind == "resources":
        return all(
            any(_covers(cap, target, workspace, name) for cap in budget) for name in target.names
        )
    return any(_covers(cap, target, workspace) for cap in budget)


def _covers(cap: Capability, target: _Target, workspace: str, name: str = "") -> bool:
    if cap.tool not in ("*", target.tool) or cap.access not in ("any", target.access):
        return False
    if cap.resource is None:
        return True
    if target.kind == "path":
        return inside(resolve_path(workspace, cap.resource, tilde=True), target.resource)
    if target.kind == "host":
        try:
            return host_list((cap.resource,)).allows(target.resource)
        except ValueError:
            return False
    if target.kind == "command" and target.command is not None:
        (glob,) = compile_globs((cap.resource,))
        return all(glob.match(seg.text) for seg in target.command.segments)
    if target.kind == "resources":
        (glob,) = compile_globs((cap.resource,))
        return glob.match(name) is not None
    return cap.resource == target.resource


def _show(cap: Capability) -> str:
    return cap.tool + (f" on {cap.resource}" if cap.resource is not None else "")


# --- compiled rules, per policy and workspace ---------------------------------------------------


def _rules_for(policy: Policy, workspace: str, protected: tuple[str, ...]) -> _Rules:
    """Rules with paths made real, globs, grammars and host lists compiled; cached on the policy
    object per workspace (rule paths are resolved once, so a symlink changed later is not
    seen)."""
    cache: dict[tuple[str, tuple[str, ...]], _Rules] = policy._cache
    key = (workspace, protected)
    rules = cache.get(key)
    if rules is None:
        real = os.path.realpath(workspace)
        compiled = tuple(_compile(rule, real) for rule in policy.rules)
        rules = _Rules(
            workspace=real,
            protected=Zone.of((os.path.realpath(p) for p in protected), (real,), strict=True),
            deny=tuple(c for c in compiled if c.rule.tier == "deny"),
            ordered=tuple(c for c in compiled if c.rule.tier != "deny"),
        )
        if len(cache) >= _MAX_WORKSPACES:
            cache.clear()
        cache[key] = rules
    return rules


def _compile(rule: Rule, workspace: str) -> _Compiled:
    paths = None if rule.paths is None else _real_paths(rule.paths, workspace)
    zone = None
    if paths is not None and rule.tier == "deny":
        zone = Zone.of(paths, _real_paths(rule.except_paths or (), workspace))
    return _Compiled(
        rule=rule,
        tools=None if "*" in rule.tools else frozenset(rule.tools),
        families=tuple(t.removesuffix("*") for t in rule.tools if t.endswith(".*")),
        paths=paths,
        zone=zone,
        hosts=None if rule.hosts is None else host_list(rule.hosts),
        commands=None if rule.commands is None else compile_globs(rule.commands),
        programs=None if rule.programs is None else tuple(map(compile_program, rule.programs)),
        scopes=None if rule.scopes is None else frozenset(rule.scopes),
        resources=None if rule.resources is None else compile_globs(rule.resources),
    )


def _real_paths(raw: tuple[str, ...], workspace: str) -> tuple[str, ...]:
    expanded = (expand_rule_path(p, workspace) for p in raw)
    return tuple(p for p in expanded if p is not None)
