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
   path outside the workspace is still a resource: rules decide); ``exec`` → the command;
   ``web_fetch`` → the URL's normalised host; any other tool → its name as the scope.
4. **Deny rules**, wherever they stand in the file: if any matches, deny (deny wins). A deny
   rule's ``paths`` match a path inside them — and for glob/grep, which descend, also a
   directory containing them — and, for exec, any command argument or glob prefix reaching
   them; its ``commands`` match when any segment, or any tail of a segment's words (so
   ``nohup``/``timeout``/``xargs`` cannot hide a command), matches a glob.
5. **Other rules**, top to bottom: the first that matches assigns its tier, scope and
   ``share_with_subagents``. A rule's ``commands`` match only when every segment of the command
   matches one of that rule's globs.
6. **Nothing matched**: deny, with a hint for the rule to add to policy.yaml.
7. **Budget** (when given): the call must be covered by one of the task's capabilities (same
   tool or ``*``; access ``any`` or equal; a resource, when set, contains the path / matches the
   host / equals the scope / matches every command segment), else deny. A budget only narrows:
   it never turns a deny into anything else and never changes a tier.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nanocrab.events.values import Capability, GrantScope, RiskTier
from nanocrab.policy.matchers import (
    EXEC_TOOL,
    PATH_TOOLS,
    URL_TOOLS,
    WALK_TOOLS,
    Refused,
    check_text,
    check_tool_name,
    compile_globs,
    expand_rule_path,
    host_list,
    inside,
    inside_any,
    parse_url,
    resolve_path,
)
from nanocrab.policy.rules import Policy, Rule
from nanocrab.policy.shell import ParsedCommand, PathWord, parse_command
from nanocrab.tools.hosts import HostAllowList

Access = Literal["read", "write", "execute", "network", "any"]
_ACCESS: dict[str, Access] = {
    "read": "read", "ls": "read", "glob": "read", "grep": "read",
    "write": "write", "edit": "write", EXEC_TOOL: "execute", "web_fetch": "network",
}  # fmt: skip
_DOT_DEFAULT = frozenset({"ls", "glob", "grep"})
_MAX_WORKSPACES = 64


@dataclass(frozen=True)
class Request:
    """One tool call to decide. ``workspace`` is already a real path."""

    tool: str
    arguments: Mapping[str, Any]
    workspace: Path
    known_tools: frozenset[str]


@dataclass(frozen=True)
class Decision:
    """The policy's answer. ``capabilities`` is what a grant would cover (empty when denied);
    ``resource`` is the canonical resource to bind a grant or approval to; ``rule`` is the id of
    the deciding rule (``None`` for default deny, the sanity checks and a budget refusal)."""

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
    kind: Literal["path", "host", "command", "scope"]
    resource: str
    access: Access
    walks: bool = False
    command: ParsedCommand | None = None

    def describe(self) -> str:
        if self.kind == "path":
            return f"{self.tool} on {self.resource}"
        if self.kind == "host":
            return f"{self.tool} of host {self.resource!r}"
        if self.kind == "command":
            return f"exec of {self.resource!r}"
        return self.tool


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    tools: frozenset[str] | None  # None: every tool
    paths: tuple[str, ...] | None
    hosts: HostAllowList | None
    commands: tuple[re.Pattern[str], ...] | None
    scopes: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class _Rules:
    workspace: str
    deny: tuple[_Compiled, ...]
    ordered: tuple[_Compiled, ...]


def evaluate(
    policy: Policy, request: Request, budget: Sequence[Capability] | None = None
) -> Decision:
    """Decide ``request`` under ``policy`` (narrowed by ``budget``); see the module docstring."""
    rules = _rules_for(policy, str(request.workspace))
    try:
        tool = check_tool_name(request.tool, request.known_tools)
        target = _target(tool, request.arguments, rules.workspace)
    except Refused as exc:
        return _deny(exc.reason, None, None)
    for compiled in rules.deny:
        detail = _match(compiled, target, deny=True)
        if detail is not None:
            return _deny(
                f"denied by rule {compiled.rule.id!r}: {detail}. Do not retry this call; "
                "policy.yaml forbids it",
                compiled.rule.id,
                target.resource,
            )
    chosen = next(
        (c.rule for c in rules.ordered if _match(c, target, deny=False) is not None), None
    )
    if chosen is None:
        return _deny(_no_rule(target, rules.ordered), None, target.resource)
    if budget is not None and not any(_covers(cap, target, rules.workspace) for cap in budget):
        held = ", ".join(_show(cap) for cap in budget) or "nothing"
        return _deny(
            f"{target.describe()} is outside the task's capability budget (it holds: {held}); "
            "stay within it, or ask the user for a task whose budget covers this",
            None,
            target.resource,
        )
    return Decision(
        tier=chosen.tier,
        reason=f"rule {chosen.id!r} assigns tier {chosen.tier} to {target.describe()}",
        rule=chosen.id,
        capabilities=(Capability(tool=tool, resource=target.resource, access=target.access),),
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


def _target(tool: str, arguments: Mapping[str, Any], workspace: str) -> _Target:
    access = _ACCESS.get(tool, "any")
    if tool in PATH_TOOLS:
        raw = _string(arguments, "path", "." if tool in _DOT_DEFAULT else None)
        check_text(raw, "path")
        if not raw.strip():
            raise Refused("the path is empty; give a path inside the workspace")
        real = resolve_path(workspace, raw)
        return _Target(tool, "path", real, access, walks=tool in WALK_TOOLS)
    if tool == EXEC_TOOL:
        command = _string(arguments, "command")
        parsed = parse_command(command, workspace)
        return _Target(tool, "command", command, access, command=parsed)
    if tool in URL_TOOLS:
        return _Target(tool, "host", parse_url(_string(arguments, "url")), access)
    return _Target(tool, "scope", tool, access)


def _string(arguments: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = arguments.get(key, default)
    if not isinstance(value, str):
        problem = "is missing" if value is None else f"must be a string, not {type(value).__name__}"
        raise Refused(f"the argument {key!r} {problem}")
    return value


# --- steps 4 and 5: rules -----------------------------------------------------------------------


def _match(c: _Compiled, target: _Target, *, deny: bool) -> str | None:
    """``None`` when ``c`` does not match ``target``; else what matched, for the reason."""
    if c.tools is not None and target.tool not in c.tools:
        return None
    if c.paths is not None:
        return _match_paths(c.paths, target, deny=deny)
    if c.hosts is not None:
        ok = target.kind == "host" and c.hosts.allows(target.resource)
        return f"host {target.resource!r} matches {', '.join(c.hosts.patterns)}" if ok else None
    if c.commands is not None:
        return _match_commands(c.commands, target, deny=deny)
    if c.scopes is not None:
        ok = target.kind == "scope" and target.resource in c.scopes
        return f"scope {target.resource!r}" if ok else None
    return f"{target.tool} is covered by this rule whatever its arguments"


def _match_paths(roots: tuple[str, ...], target: _Target, *, deny: bool) -> str | None:
    if target.kind == "path":
        root = inside_any(target.resource, roots)
        if root is not None:
            return f"{target.resource} is inside {root}"
        if deny and target.walks:
            for root in roots:
                if inside(target.resource, root):
                    return (
                        f"{target.tool} would descend from {target.resource} into {root}; "
                        "search a narrower directory"
                    )
        return None
    if deny and target.command is not None:
        for word in target.command.path_words:
            hit = _word_hits(word, roots)
            if hit is not None:
                return hit
    return None


def _word_hits(word: PathWord, roots: tuple[str, ...]) -> str | None:
    root = inside_any(word.path, roots)
    if root is not None:
        return f"the argument {word.word!r} resolves to {word.path}, inside {root}"
    if word.glob:
        for root in roots:
            if inside(word.path, root):
                return f"the glob {word.word!r} could reach {root}"
    return None


def _match_commands(
    globs: tuple[re.Pattern[str], ...], target: _Target, *, deny: bool
) -> str | None:
    if target.command is None:
        return None
    segments = target.command.segments
    if deny:
        for seg in segments:
            for text in (seg.text, *(" ".join(seg.argv[i:]) for i in range(len(seg.argv)))):
                if any(g.match(text) for g in globs):
                    return f"the command {text!r} is forbidden"
        return None
    if all(any(g.match(seg.text) for g in globs) for seg in segments):
        return f"every part of {target.resource!r} matches"
    return None


def _no_rule(target: _Target, ordered: tuple[_Compiled, ...]) -> str:
    head = f"no rule allows {target.describe()}"
    if target.kind == "command" and target.command is not None:
        globs = [g for c in ordered if c.commands is not None for g in c.commands]
        segments = target.command.segments
        missing = [s.text for s in segments if not any(g.match(s.text) for g in globs)]
        if missing and len(segments) > 1:
            head += f" (not covered: {', '.join(repr(m) for m in missing)})"
        hint = "commands: [...]"
    elif target.kind == "path":
        hint = f"paths: [{target.resource!r}]"
    elif target.kind == "host":
        hint = f"hosts: [{target.resource!r}]"
    else:
        hint = f"scopes: [{target.tool!r}]"
    return (
        f"{head}; do not retry — ask the user to add a rule with tools: [{target.tool!r}] and "
        f"{hint} to policy.yaml if it is needed"
    )


# --- step 7: budget -----------------------------------------------------------------------------


def _covers(cap: Capability, target: _Target, workspace: str) -> bool:
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
    return cap.resource == target.resource


def _show(cap: Capability) -> str:
    return cap.tool + (f" on {cap.resource}" if cap.resource is not None else "")


# --- compiled rules, per policy and workspace ---------------------------------------------------


def _rules_for(policy: Policy, workspace: str) -> _Rules:
    """Rules with paths made real, globs and host lists compiled; cached on the policy object
    per workspace (rule paths are resolved once, so a symlink changed later is not seen)."""
    cache: dict[str, _Rules] = policy._cache
    rules = cache.get(workspace)
    if rules is None:
        real = os.path.realpath(workspace)
        compiled = tuple(_compile(rule, real) for rule in policy.rules)
        rules = _Rules(
            workspace=real,
            deny=tuple(c for c in compiled if c.rule.tier == "deny"),
            ordered=tuple(c for c in compiled if c.rule.tier != "deny"),
        )
        if len(cache) >= _MAX_WORKSPACES:
            cache.clear()
        cache[workspace] = rules
    return rules


def _compile(rule: Rule, workspace: str) -> _Compiled:
    return _Compiled(
        rule=rule,
        tools=None if "*" in rule.tools else frozenset(rule.tools),
        paths=None
        if rule.paths is None
        else tuple(expand_rule_path(p, workspace) for p in rule.paths),
        hosts=None if rule.hosts is None else host_list(rule.hosts),
        commands=None if rule.commands is None else compile_globs(rule.commands),
        scopes=None if rule.scopes is None else frozenset(rule.scopes),
    )
