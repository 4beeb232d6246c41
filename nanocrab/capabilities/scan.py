"""Static safety scan of a generated capability module: ``ast`` only, nothing is executed.

:func:`scan` parses the source and returns a :class:`ScanReport` of :class:`Finding` values, one
per offending occurrence, each with a line, a 0-based column and a message that says what to do
instead, so it can be handed back to the model that wrote the module. The scan is the first gate,
not the sandbox: it rejects the obvious and the well-known obfuscations; isolation and resource
limits (CPU, memory, ``while True``) are the executor's job.

Rules (E = error, W = warning; a *gated* rule is silent, and counts its permission as used, when
the permission is declared):

==========================  ====  =========================================================
rule                        sev   what triggers it
==========================  ====  =========================================================
``syntax_error``            E     the source does not parse (one finding, at the error)
``too_complex``             E     over ``MAX_SOURCE_CHARS``, or nested too deeply to walk
``import_not_allowed``      E     importing anything outside :data:`ALLOWED_MODULES` (and the
                                  network modules when ``net`` is declared); relative imports;
                                  reaching such a module through an allowed one (``pathlib.os``)
``star_import``             E     ``from m import *``
``process``                 E     ``subprocess``, ``pty``, ``multiprocessing``, ``concurrent``;
                                  ``os.system``/``popen``/``exec*``/``spawn*``/``posix_spawn*``/
                                  ``fork*``/``kill``; ``asyncio`` subprocesses; ``help()``;
                                  ``uuid.getnode``/``uuid1`` (may run ``ifconfig``)
``dynamic_code``            E     ``eval``, ``exec``, ``compile``, ``__import__``,
                                  ``breakpoint``; ``importlib``, ``builtins``, ``runpy``,
                                  ``code``, ``pdb``...; ``typing.get_type_hints``/``ForwardRef``
                                  (they ``eval`` string annotations)
``dynamic_attribute``       E     ``getattr``/``hasattr``/``setattr``/``delattr`` with a computed
                                  name, a dunder name, or an imported module as target, or used
                                  other than by a direct call; ``vars``/``globals``/``locals``;
                                  dunder names and attributes outside a small allow-list
                                  (``__class__``, ``__dict__``, ``__globals__``, ``__builtins__``
                                  ...), including in strings (``"{0.__class__}".format``) and
                                  ``match`` class patterns; frame/code introspection
                                  (``gi_frame``, ``f_globals``, ``tb_frame``...);
                                  ``operator.attrgetter``/``methodcaller`` with computed names
``private_access``          E     ``_private`` attributes of an imported module
``file_delete``             E     ``os.remove``/``unlink``/``rmdir``/``removedirs``,
                                  ``shutil.rmtree``/``move``; any ``.unlink``/``.rmdir``/
                                  ``.removedirs``/``.rmtree`` attribute
``unsafe_deserialization``  E     ``pickle``, ``marshal``, ``shelve``, ``copyreg``, ``dill``...
``native_code``             E     ``ctypes``, ``cffi``
``runtime_control``         E     ``threading``, ``_thread``, ``signal``; ``sys.modules``,
                                  ``sys.setrecursionlimit``, ``sys.exit``, ``sys.path``...;
                                  ``os.environ`` writes, ``os.putenv``, ``os.chdir``; assigning
                                  attributes of imported modules; ``input``/``exit``/``quit``
``network``                 E     gated by ``net``: importing or using ``socket``, ``ssl``,
                                  ``http``, ``urllib``, ``requests``, ``httpx``, ``ftplib``,
                                  ``smtplib``, ``asyncio``...; ``.open_connection`` and friends
``fs_write``                E     gated by ``fs.write``: ``open``-like calls (``open``,
                                  ``io.open``, ``gzip.open``, ``Path.open``) whose mode has
                                  ``w``/``a``/``x``/``+`` or is not a literal; a reference to
                                  ``open`` that is not a call; ``.write_text``/``.write_bytes``/
                                  ``.touch``/``.mkdir``/``.rename``/``.chmod``...;
                                  ``os.mkdir``/``rename``/``replace``..., ``shutil.copy*``
``fs_read``                 W     gated by ``fs.read``: ``open``-like calls in a read mode;
                                  calls of ``.read_text``/``.read_bytes``/``.iterdir``/``.glob``/
                                  ``.exists``/``.stat``/``.home``/``.cwd``...
``unknown_permission``      E     a declared permission outside :data:`PERMISSIONS`
``unused_permission``       W     a declared permission the code never needs
==========================  ====  =========================================================

Names are resolved through imports (``import subprocess as sp``, ``from os import system as s``)
and through allowed modules that re-export others (``pathlib.os`` is ``os``). The dangerous
builtins (``eval``, ``getattr``, ``open``...) are flagged even when the module binds the same
name, because a binding that never runs leaves the builtin visible; rename such variables.
``list.remove`` is ordinary, so ``remove`` counts as a deletion only when it resolves to
``os.remove``. String annotations are parsed and scanned like code, since ``get_type_hints``
style helpers evaluate them.
"""

from __future__ import annotations

import ast
import functools
import importlib
import types
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Literal

from nanocrab.capabilities.rules import (
    ALLOWED_DUNDER_ATTRS,
    ALLOWED_DUNDER_NAMES,
    ALLOWED_DUNDER_STRINGS,
    ALLOWED_MODULES,
    ALWAYS_BUILTIN,
    ATTR_BUILTINS,
    ATTR_RULES,
    BUILTIN_NAMES,
    DUNDER,
    GATES,
    INTROSPECTION,
    MAX_SOURCE_CHARS,
    MODULE_RULES,
    OPEN_LIKE,
    PERMISSIONS,
    QNAME_RULES,
    QNAME_STEMS,
    READ_CALLS,
    RULES,
    WARNINGS,
)

Permission = Literal["fs.read", "fs.write", "net"]
Severity = Literal["error", "warning"]
SafetyLevel = Literal["safe", "restricted", "dangerous"]


@dataclass(frozen=True)
class Finding:
    """One rule violation at ``line`` (1-based) and ``col`` (0-based, as in ``ast``).

    ``message`` says what was found and what to do instead; ``rule`` is a key of :data:`RULES`.
    """

    rule: str
    message: str
    line: int
    col: int
    severity: Severity

    def describe(self) -> str:
        """One line for a model or a log: ``line 3, col 4: error [process] ...``."""
        return f"line {self.line}, col {self.col}: {self.severity} [{self.rule}] {self.message}"


@dataclass(frozen=True)
class ScanReport:
    """The findings of one scan, sorted by position, and the declared permissions the code uses.

    ``safety_level``: ``dangerous`` if any finding is an error; else ``restricted`` if there is a
    warning or a permission is used; else ``safe``. An unused declared permission is itself a
    warning, so ``safe`` means no findings and no permissions.
    """

    findings: tuple[Finding, ...]
    permissions_used: frozenset[str] = field(default_factory=frozenset)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def ok(self) -> bool:
        """No error-severity findings: the module may be run (with its declared permissions)."""
        return not self.errors

    @property
    def safety_level(self) -> SafetyLevel:
        if not self.ok:
            return "dangerous"
        if self.findings or self.permissions_used:
            return "restricted"
        return "safe"


def scan(source: str, permissions: Collection[str] = ()) -> ScanReport:
    """Scan ``source`` against the rules above, with ``permissions`` declared by the module.

    Never raises for bad input: a syntax error, an over-long source or an unknown permission is a
    finding like any other.
    """
    if len(source) > MAX_SOURCE_CHARS:
        return _single("too_complex", f"source is over {MAX_SOURCE_CHARS} characters", 1, 0)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        line, col = exc.lineno or 1, max((exc.offset or 1) - 1, 0)
        return _single("syntax_error", f"syntax error: {exc.msg}", line, col)
    except ValueError as exc:  # null bytes
        return _single("syntax_error", f"syntax error: {exc}", 1, 0)
    except RecursionError:
        return _single("too_complex", "source is nested too deeply to parse", 1, 0)
    anchor = _permissions_anchor(tree)
    findings = [
        _finding("unknown_permission", f"unknown permission {p!r}", anchor)
        for p in sorted(set(permissions) - PERMISSIONS)
    ]
    scanner = _Scanner(tree, frozenset(permissions) & PERMISSIONS)
    try:
        scanner.visit(tree)
    except RecursionError:
        return _single("too_complex", "source is nested too deeply to scan", 1, 0)
    findings += scanner.findings
    findings += [
        _finding("unused_permission", f"permission {p!r} is declared but never needed", anchor)
        for p in sorted(scanner.granted - scanner.used)
    ]
    unique = {(f.rule, f.line, f.col): f for f in reversed(findings)}
    ordered = sorted(unique.values(), key=lambda f: (f.line, f.col, f.rule))
    return ScanReport(tuple(ordered), frozenset(scanner.used))


def _single(rule: str, what: str, line: int, col: int) -> ScanReport:
    return ScanReport((_finding(rule, what, (line, col)),))


def _finding(rule: str, what: str, at: tuple[int, int]) -> Finding:
    severity: Severity = "warning" if rule in WARNINGS else "error"
    return Finding(rule, f"{what}: {RULES[rule]}", at[0], at[1], severity)


def _permissions_anchor(tree: ast.Module) -> tuple[int, int]:
    """Where ``CAPABILITY["permissions"]`` is written, for permission findings; else line 1."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        else:
            continue
        named = any(isinstance(t, ast.Name) and t.id == "CAPABILITY" for t in targets)
        if not named or not isinstance(stmt.value, ast.Dict):
            continue
        for key, item in zip(stmt.value.keys, stmt.value.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "permissions":
                return item.lineno, item.col_offset
    return 1, 0


def _dunder_problem(name: str, allowed: frozenset[str]) -> bool:
    return (name.startswith("__") and name.endswith("__") and name not in allowed) or (
        name in INTROSPECTION
    )


def _qname_rule(qname: str) -> tuple[str, str] | None:
    """The rule for ``qname`` or one of its dotted prefixes, and the name that matched."""
    parts = qname.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in QNAME_RULES:
            return QNAME_RULES[prefix], prefix
    for stem, rule in QNAME_STEMS:
        if qname.startswith(stem):
            return rule, qname
    return None


@functools.cache
def _allowed_module(name: str) -> types.ModuleType | None:
    """Import an allow-listed stdlib module into the scanner, to see what it re-exports."""
    if name not in ALLOWED_MODULES:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _canonical(qname: str) -> tuple[str, str | None]:
    """Follow module attributes of allowed modules: ``pathlib.os.system`` is ``os.system``.

    Returns the canonical name and, when the walk left the allow-list, the module it reached.
    """
    parts = qname.split(".")
    obj = _allowed_module(parts[0])
    if obj is None:
        return qname, None
    prefix, used = parts[0], 1
    for part in parts[1:]:
        child = None if part.startswith("__") else getattr(obj, part, None)
        if not isinstance(child, types.ModuleType):
            break
        prefix, obj, used = child.__name__, child, used + 1
        if prefix.split(".")[0] not in ALLOWED_MODULES:
            return ".".join([prefix, *parts[used:]]), prefix
    return ".".join([prefix, *parts[used:]]), None


def _bound_names(tree: ast.AST) -> frozenset[str]:
    """Every name the module binds anywhere (assignment, def, argument, import, except, match)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
    return frozenset(names)


def _import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name → qualified name for every import in the module, wherever it is."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _chain(node: ast.expr) -> Iterator[ast.expr]:
    """``node`` and the Attribute/Name nodes under it that form one dotted name."""
    while isinstance(node, ast.Attribute):
        yield node
        node = node.value
    if isinstance(node, ast.Name):
        yield node


def _attr_position(node: ast.Attribute) -> tuple[int, int]:
    """Where the attribute's name is written, so ``a.__class__.__bases__`` gives two places."""
    if node.end_lineno is None or node.end_col_offset is None:
        return node.lineno, node.col_offset
    return node.end_lineno, max(node.end_col_offset - len(node.attr), 0)


def _literal_str(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class _Scanner(ast.NodeVisitor):
    """One walk of one module; ``findings`` and ``used`` are read after :meth:`visit`."""

    def __init__(self, tree: ast.Module, granted: frozenset[str]) -> None:
        self.granted = granted
        self.used: set[str] = set()
        self.findings: list[Finding] = []
        self._aliases = _import_aliases(tree)
        self._bound = _bound_names(tree)
        self._judged: set[int] = set()  # Name/Attribute nodes whose dotted name was judged
        self._callees: set[int] = set()  # nodes that are the func of a Call
        self._quiet: set[int] = set()  # string constants already judged by their call
        self._annotation_depth = 0

    def _flag(self, rule: str, what: str, at: ast.AST | tuple[int, int]) -> None:
        permission = GATES.get(rule)
        if permission is not None and permission in self.granted:
            self.used.add(permission)
            return
        if isinstance(at, ast.AST):
            at = (getattr(at, "lineno", 1), getattr(at, "col_offset", 0))
        self.findings.append(_finding(rule, what, at))

    # Resolution

    def _qualify(self, node: ast.expr) -> str | None:
        """The dotted name ``node`` refers to through imports and builtins, if it has one."""
        if isinstance(node, ast.Attribute):
            base = self._qualify(node.value)
            return None if base is None else f"{base}.{node.attr}"
        if not isinstance(node, ast.Name):
            return None
        if node.id in self._aliases:
            return self._aliases[node.id]
        if node.id in BUILTIN_NAMES and (node.id in ALWAYS_BUILTIN or node.id not in self._bound):
            return f"builtins.{node.id}"
        return None

    def _is_imported(self, node: ast.expr) -> bool:
        root = list(_chain(node))
        return bool(root) and isinstance(root[-1], ast.Name) and root[-1].id in self._aliases

    def _judge_module(self, module: str, what: str, node: ast.AST) -> None:
        root = module.split(".")[0]
        if root in MODULE_RULES:
            self._flag(MODULE_RULES[root], what, node)
        elif root not in ALLOWED_MODULES:
            self._flag("import_not_allowed", what, node)

    def _judge_name(self, raw: str, node: ast.AST) -> None:
        """Judge a use of the dotted name ``raw`` (already resolved through imports)."""
        root = raw.split(".")[0]
        if root in ALLOWED_MODULES and any(
            p.startswith("_") and not p.startswith("__") for p in raw.split(".")[1:]
        ):
            self._flag("private_access", f"{raw} is private", node)
        qname, reached = _canonical(raw)
        if reached is not None:
            self._judge_module(
                reached, f"{raw} is the module {reached}, which is not allowed", node
            )
        rule = _qname_rule(qname)
        if rule is not None:
            self._flag(rule[0], f"use of {rule[1]} is not allowed", node)
        root = qname.split(".")[0]
        if root in MODULE_RULES and root != "builtins" and reached is None:
            self._flag(MODULE_RULES[root], f"use of {qname} is not allowed", node)

    # Imports

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._judge_module(alias.name, f"import of {alias.name} is not allowed", node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            self._flag("import_not_allowed", "relative imports are not allowed", node)
            return
        module = node.module
        root = module.split(".")[0]
        self._judge_module(module, f"import of {module} is not allowed", node)
        for alias in node.names:
            if alias.name == "*":
                self._flag("star_import", f"from {module} import * is not allowed", node)
            elif root in ALLOWED_MODULES:
                self._judge_name(f"{module}.{alias.name}", node)

    # Names and attributes

    def visit_Name(self, node: ast.Name) -> None:
        if (
            node.id.startswith("__")
            and node.id.endswith("__")
            and node.id not in ALLOWED_DUNDER_NAMES
            and f"builtins.{node.id}" not in QNAME_RULES
        ):
            self._flag("dynamic_attribute", f"the name {node.id} is not allowed", node)
        if id(node) not in self._judged and isinstance(node.ctx, ast.Load):
            raw = self._qualify(node)
            if raw is not None:
                self._judge_name(raw, node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr, called = node.attr, id(node) in self._callees
        at = _attr_position(node)
        if _dunder_problem(attr, ALLOWED_DUNDER_ATTRS):
            self._flag("dynamic_attribute", f"access to .{attr} is not allowed", at)
        if attr in ATTR_RULES:
            self._flag(ATTR_RULES[attr], f".{attr} is not allowed", at)
        elif attr in READ_CALLS and called:
            self._flag("fs_read", f".{attr}() reads the file system", at)
        elif attr == "open" and not called:
            self._flag("fs_write", "a reference to .open may open a file for writing", at)
        if not isinstance(node.ctx, ast.Load) and self._is_imported(node.value):
            self._flag("runtime_control", f"assigning .{attr} changes an imported module", at)
        if id(node) not in self._judged:
            raw = self._qualify(node)
            if raw is not None:
                self._judge_name(raw, node)
        self._judged.update(id(n) for n in _chain(node))  # one dotted name, judged once
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            raw = self._qualify(node.value)
            if raw is not None and _canonical(raw)[0] == "os.environ":
                self._flag("runtime_control", "writing os.environ is not allowed", node)
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:
            if _dunder_problem(attr, ALLOWED_DUNDER_ATTRS):
                self._flag("dynamic_attribute", f"matching on .{attr} is not allowed", node)
        self.generic_visit(node)

    # Calls

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        self._callees.add(id(func))
        qname = self._qualify(func)
        canonical = _canonical(qname)[0] if qname is not None else None
        if canonical in OPEN_LIKE or (isinstance(func, ast.Attribute) and func.attr == "open"):
            # A bound method (``Path(p).open``) takes the mode first; functions take it second.
            bound = isinstance(func, ast.Attribute) and qname is None
            self._judge_open(node, mode_index=0 if bound else 1)
            self._judged.add(id(func))
        elif canonical in ATTR_BUILTINS:
            self._judge_attr_builtin(node, canonical.removeprefix("builtins."))
            self._judged.add(id(func))
        elif canonical in ("operator.attrgetter", "operator.methodcaller"):
            self._judge_operator_getter(node, canonical)
            self._judged.add(id(func))
        self.generic_visit(node)

    def _judge_open(self, node: ast.Call, *, mode_index: int) -> None:
        mode_node = next((k.value for k in node.keywords if k.arg == "mode"), None)
        if mode_node is None and len(node.args) > mode_index:
            mode_node = node.args[mode_index]
        if mode_node is None:
            self._flag("fs_read", "open() reads a file", node)
            return
        mode = _literal_str(mode_node)
        if mode is None:
            self._flag("fs_write", "open() with a computed mode may write a file", node)
        elif set(mode) & set("wax+"):
            self._flag("fs_write", f"open() in mode {mode!r} writes a file", node)
        else:
            self._flag("fs_read", f"open() in mode {mode!r} reads a file", node)

    def _judge_attr_builtin(self, node: ast.Call, name: str) -> None:
        """``getattr(obj, "name")`` on a non-module is plain attribute access; nothing else is."""
        if len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args[:2]):
            self._flag("dynamic_attribute", f"{name}() needs an object and a literal name", node)
            return
        target, name_node = node.args[0], node.args[1]
        attr = _literal_str(name_node)
        if attr is None:
            self._flag("dynamic_attribute", f"{name}() with a computed attribute name", node)
            return
        self._quiet.add(id(name_node))
        if _dunder_problem(attr, ALLOWED_DUNDER_ATTRS):
            self._flag("dynamic_attribute", f"{name}(..., {attr!r}) is not allowed", node)
        elif self._is_imported(target):
            self._flag("dynamic_attribute", f"{name}() on an imported module or object", node)

    def _judge_operator_getter(self, node: ast.Call, name: str) -> None:
        """``attrgetter`` takes only names; ``methodcaller``'s first argument is the name."""
        name_nodes = node.args if name.endswith("attrgetter") else node.args[:1]
        names = [_literal_str(a) for a in name_nodes]
        if not names or any(n is None for n in names):
            self._flag("dynamic_attribute", f"{name}() with computed names", node)
            return
        self._quiet.update(id(a) for a in name_nodes)
        for text in filter(None, names):
            if any(_dunder_problem(p, ALLOWED_DUNDER_ATTRS) for p in text.split(".")):
                self._flag("dynamic_attribute", f"{name}({text!r}) is not allowed", node)

    # Strings and annotations

    def visit_Expr(self, node: ast.Expr) -> None:
        if _literal_str(node.value) is None:  # a bare string statement is a docstring: inert
            self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str) or id(node) in self._quiet:
            return
        if self._annotation_depth and self._visit_string_annotation(node, node.value):
            return
        bad = sorted({m for m in DUNDER.findall(node.value) if m not in ALLOWED_DUNDER_STRINGS})
        if bad:
            self._flag("dynamic_attribute", f"the string mentions {', '.join(bad)}", node)

    def _visit_string_annotation(self, node: ast.Constant, text: str) -> bool:
        """Scan a string annotation (``text``, the value of ``node``) as the expression it becomes;
        False if it does not parse."""
        try:
            expr = ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError):
            return False
        for sub in ast.walk(expr):
            if isinstance(sub, ast.expr):
                sub.lineno, sub.col_offset = node.lineno, node.col_offset
                sub.end_lineno, sub.end_col_offset = node.end_lineno, node.end_col_offset
        self.visit(expr)
        return True

    def _visit_annotation(self, node: ast.expr | None) -> None:
        if node is None:
            return
        self._annotation_depth += 1
        self.visit(node)
        self._annotation_depth -= 1

    def visit_arg(self, node: ast.arg) -> None:
        self._visit_annotation(node.annotation)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        self._visit_annotation(node.returns)
        for stmt in node.body:
            self.visit(stmt)

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        self._visit_annotation(node.annotation)
        if node.value is not None:
            self.visit(node.value)
