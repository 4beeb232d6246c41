"""Argument grammars for exec rules: which options and operands an allowed command may take.

A rule's ``programs`` names each command it allows and, for that command, an allow-list of what
may follow it. Anything not on the list — an option the grammar does not name, an abbreviation of
one (git and argparse accept unique prefixes: ``--out`` is ``--output``), an option glued in a way
the grammar does not know, an operand outside the workspace — makes the segment not match::

    programs:
      - command: ["git diff", "git --no-pager diff"]   # the exact leading words (alternatives)
        flags: [--stat, --cached, -w, -<int>]           # options without a value; -<int>: -5
        options: {-U: int, --color=: [always, never, auto], --diff-filter=: text}
        operands: git                                   # none | paths | git | modules

**Flags** are matched as whole words; single-letter flags may also be bundled (``-la`` for
``-l -a``), as getopt, git and argparse read them. ``-<int>`` stands for ``-`` and digits.

**Options** take a value of a kind: ``text`` (any word), ``int`` (digits), ``path`` (a path that
stays inside the workspace, see below) or a list of allowed values. ``--name`` and ``-x`` take the
value as the next word or attached (``--name=V``, ``-xV``); a key ending in ``=`` (``--color=``,
``-M=``) only attached — for options whose value is optional, where a separate word would be an
operand to the program but a value to the grammar.

**Operands** (words that are not options, and every word after ``--``):

- ``none``: no operands;
- ``paths``: each must stay inside the workspace — its lexical form (``..`` applied, symlinks not
  followed) and its real path both, and for a glob also every file it matches now; a leading
  ``~`` (a home directory) or ``@`` (an argparse argument file: ``pytest @args``) is refused;
- ``git``: revisions and paths: as ``paths``, but ``@`` is allowed (``@{u}``), the part after a
  ``rev:`` is checked as a path too, and pathspec magic (``:/``, ``:(top)``) is refused;
- ``modules``: as ``python -m unittest`` reads them: a path (with ``/`` or ending in ``.py``)
  checked as ``paths``, or a dotted name whose first part is a module or package in the workspace
  (so ``antigravity`` or ``os`` cannot be imported by name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nanocrab.policy.matchers import Refused, inside
from nanocrab.policy.shell import PathWord, path_word

ValueKind = Literal["text", "int", "path"]
_VALUE_KINDS = frozenset({"text", "int", "path"})
OperandKind = Literal["none", "paths", "git", "modules"]
NUMERIC_FLAG = "-<int>"
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_FLAG = re.compile(r"-[A-Za-z0-9?@]|--[A-Za-z0-9][A-Za-z0-9-]*(=[A-Za-z0-9_.,:%-]+)?|-[A-Za-z]"
                   r"[A-Za-z0-9]+")  # fmt: skip
_OPTION = re.compile(r"(-[A-Za-z0-9]|--[A-Za-z0-9][A-Za-z0-9-]*)=?")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_DIGITS = re.compile(r"[0-9]+")


class Program(BaseModel):
    """One allowed command and the allow-list of what may follow it (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: tuple[str, ...] = Field(min_length=1)
    flags: tuple[str, ...] = ()
    options: dict[str, str | tuple[str, ...]] = Field(default_factory=dict)
    operands: OperandKind = "none"

    @field_validator("command", "flags", "options", mode="before")
    @classmethod
    def _plain_strings(cls, value: object) -> object:
        """YAML reads ``no``/``yes``/``on``/``off`` as booleans and ``-1`` as a number: say so."""
        items = value.values() if isinstance(value, dict) else value
        for item in items if isinstance(items, Iterable) and not isinstance(items, str) else ():
            for element in item if isinstance(item, list | tuple) else (item,):
                if not isinstance(element, str):
                    raise ValueError(
                        f"{element!r} is not a string: quote it (YAML reads no, yes, on, off as "
                        "booleans and -1 as a number)"
                    )
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for spelling in value:
            words = spelling.split()
            if not words or any(not _WORD.fullmatch(w) and not _FLAG.fullmatch(w) for w in words):
                raise ValueError(
                    f"command {spelling!r} must be plain words (letters, digits, _ . + -), "
                    "e.g. 'git diff' or 'python3 -m pytest'"
                )
            if not _WORD.fullmatch(words[0]):
                raise ValueError(f"command {spelling!r} must start with the program's name")
        return value

    @field_validator("flags")
    @classmethod
    def _flags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for flag in value:
            if flag != NUMERIC_FLAG and not _FLAG.fullmatch(flag):
                raise ValueError(
                    f"flag {flag!r} must be one option word such as -q, --stat, -uno or "
                    f"--porcelain=v2 (or {NUMERIC_FLAG} for -5)"
                )
        return value

    @field_validator("options")
    @classmethod
    def _options(cls, value: dict[str, str | tuple[str, ...]]) -> dict[str, str | tuple[str, ...]]:
        for name, kind in value.items():
            if not _OPTION.fullmatch(name):
                raise ValueError(
                    f"option {name!r} must be -x or --name, with a trailing '=' when the value "
                    "can only be attached"
                )
            if isinstance(kind, str) and kind not in _VALUE_KINDS:
                raise ValueError(
                    f"option {name!r}: the value kind {kind!r} is not one of text, int, path "
                    "(or a list of allowed values)"
                )
            if isinstance(kind, tuple) and (not kind or not all(kind)):
                raise ValueError(f"option {name!r}: the list of allowed values is empty")
        return value

    @model_validator(mode="after")
    def _no_overlap(self) -> Program:
        both = sorted(set(self.flags) & set(self.options))
        if both:
            raise ValueError(
                f"{', '.join(both)} is listed as a flag and as an option taking a value; keep one "
                "(an option whose value is optional: a flag, plus the option with a trailing '=')"
            )
        return self


@dataclass(frozen=True, slots=True)
class _Option:
    kind: ValueKind | frozenset[str]
    attached_only: bool


@dataclass(frozen=True, slots=True)
class Grammar:
    """A :class:`Program` ready to judge argument vectors."""

    prefixes: tuple[tuple[str, ...], ...]
    flags: frozenset[str]
    numeric: bool
    options: Mapping[str, _Option]
    operands: OperandKind

    @property
    def name(self) -> str:
        return " ".join(self.prefixes[0])

    def rest(self, argv: tuple[str, ...]) -> tuple[str, ...] | None:
        """The words after this program's command, or ``None`` when ``argv`` is not it."""
        for prefix in self.prefixes:
            if argv[: len(prefix)] == prefix:
                return argv[len(prefix) :]
        return None


def compile_program(program: Program) -> Grammar:
    """``program`` with its option keys split into name, value kind and attachment."""
    options: dict[str, _Option] = {}
    for key, kind in program.options.items():
        name = key.removesuffix("=")
        spec: ValueKind | frozenset[str] = (
            frozenset(kind) if isinstance(kind, tuple) else cast(ValueKind, kind)
        )
        options[name] = _Option(spec, attached_only=key.endswith("="))
    return Grammar(
        prefixes=tuple(tuple(s.split()) for s in program.command),
        flags=frozenset(f for f in program.flags if f != NUMERIC_FLAG),
        numeric=NUMERIC_FLAG in program.flags,
        options=options,
        operands=program.operands,
    )


@dataclass(frozen=True, slots=True)
class Where:
    """Where a segment runs: its working directory and the workspace (both real paths)."""

    base: str
    workspace: str


def problem(grammar: Grammar, rest: tuple[str, ...], where: Where) -> str | None:
    """``None`` when ``rest`` (the words after the command) is allowed; else what is not."""
    words = iter(rest)
    options_end = False
    for word in words:
        if options_end or word == "-" or not word.startswith("-"):
            bad = _operand(grammar, word, where)
        elif word == "--":
            options_end = True
            continue
        else:
            bad = _option(grammar, word, words, where)
        if bad is not None:
            return bad
    return None


def _option(grammar: Grammar, word: str, words: Iterator[str], where: Where) -> str | None:
    if word in grammar.flags or (grammar.numeric and _DIGITS.fullmatch(word[1:])):
        return None
    name, eq, attached = word.partition("=")
    if word.startswith("--"):
        spec = grammar.options.get(name)
        if spec is None:
            return f"the option {_shown(word)} is not allowed"
        if eq:
            return _value(name, spec, attached, where)
        if spec.attached_only:
            return f"the option {name} takes its value attached ({name}=…)"
        return _value(name, spec, _separate(words), where)
    for i in range(1, len(word)):  # a bundle of single-letter options, getopt style
        letter = "-" + word[i]
        if letter in grammar.flags:
            continue
        spec = grammar.options.get(letter)
        if spec is None:
            return f"the option {_shown(word)} is not allowed" + (
                f" ({letter} in it)" if len(word) > 2 else ""
            )
        value: str | None = word[i + 1 :]
        if value and value.startswith("="):  # argparse reads -s=x as -s x, getopt as -s =x
            return f"write {letter}{value[1:]} or {letter} {value[1:]}, not {_shown(word)}"
        if not value:
            if spec.attached_only:
                return f"the option {letter} takes its value attached ({letter}…)"
            value = _separate(words)
        return _value(letter, spec, value, where)
    return None


def _separate(words: Iterator[str]) -> str | None:
    """The next word as an option's value. One that looks like an option is not taken:
    argparse would read it as an option, getopt and git as the value."""
    value = next(words, None)
    if value is not None and value.startswith("-") and value != "-":
        return None
    return value


def _value(name: str, spec: _Option, value: str | None, where: Where) -> str | None:
    if value is None:
        return f"the option {name} needs a value (one that does not start with '-')"
    kind = spec.kind
    if isinstance(kind, frozenset):
        if value in kind:
            return None
        return f"the option {name} allows only {', '.join(sorted(kind))}, not {_shown(value)}"
    if kind == "int":
        return None if _DIGITS.fullmatch(value) else f"the option {name} takes a number"
    if kind == "path":
        return _path(value, where, f"the value of {name}")
    return None


def _operand(grammar: Grammar, word: str, where: Where) -> str | None:
    kind = grammar.operands
    if kind == "none":
        return f"{grammar.name} takes no operands here, not {_shown(word)}"
    if kind == "git":
        if word.startswith(":"):
            return f"the pathspec magic {_shown(word)} is not allowed"
        if word.startswith("@"):
            word = word[1:] or "."
        rev, colon, path = word.partition(":")
        if colon:
            return _path(rev or ".", where, "the operand") or _path(path or ".", where, "the path")
        return _path(word, where, "the operand")
    if kind == "modules" and "/" not in word and not word.endswith(".py"):
        return _module(word, where)
    return _path(word, where, "the operand")


def _module(word: str, where: Where) -> str | None:
    if not _MODULE.fullmatch(word):
        return f"{_shown(word)} is neither a path nor a dotted module name"
    first = word.split(".", 1)[0]
    # a regular module or package only: a bare directory is a namespace portion, and a module
    # of that name installed later on sys.path would win over it
    for candidate in (first + ".py", os.path.join(first, "__init__.py")):
        real = os.path.realpath(os.path.join(where.base, candidate))
        if os.path.isfile(real):
            if inside(where.workspace, real):
                return None
            return f"the module {first!r} resolves to {real}, outside the workspace"
    return (
        f"the module {first!r} is not a file or package in the workspace (an installed module "
        "would be imported by name)"
    )


def _path(word: str, where: Where, what: str) -> str | None:
    if word.startswith(("~", "@")):
        return f"{what} {_shown(word)} starts with {word[0]!r}"
    try:
        resolved = path_word(where.base, word)
    except Refused as exc:
        return exc.reason
    return stays_inside(resolved, where.workspace, what)


def stays_inside(word: PathWord, workspace: str, what: str = "the argument") -> str | None:
    """``None`` when ``word`` stays inside ``workspace`` (lexically, really and, for a glob,
    every current match); else where it goes."""
    if not inside(workspace, word.lexical):
        return f"{what} {_shown(word.word)} is outside the workspace ({word.lexical})"
    if not inside(workspace, word.path):
        return f"{what} {_shown(word.word)} resolves outside the workspace ({word.path})"
    for match in word.matches:
        if not inside(workspace, match):
            return f"the glob {_shown(word.word)} matches {match}, outside the workspace"
    if not word.complete:
        return f"the glob {_shown(word.word)} matches too many files to check; narrow it"
    return None


def _shown(word: str) -> str:
    return repr(word if len(word) <= 60 else word[:57] + "...")
