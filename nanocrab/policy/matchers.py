"""Turning one tool call's arguments into a canonical resource, refusing anything ambiguous.

Everything here is pure and synchronous. A problem with a call (an unknown tool name, a control
character, a URL with credentials, a shell command with indirection) raises :class:`Refused`,
whose ``reason`` is shown to the model; the engine turns it into a ``deny`` decision.

- **Tool names** must be exactly a known canonical name; close misses get a "did you mean" hint.
- **Text**: NUL, C0/C1 control characters, DEL, bidi controls and zero-width characters are
  refused in every resource string (a command may contain tabs and newlines; a newline separates
  commands).
- **Paths** are resolved to real paths (``..`` and symlinks followed) against the workspace;
  containment is ``os.path.commonpath``, never a string prefix.
- **URLs** are parsed with ``httpx.URL`` (the parser ``web_fetch`` itself uses): http(s) only, no
  userinfo, host lower-cased, IDNA-encoded, trailing dot stripped; a numeric host must be a
  canonical dotted quad or an IPv6 address (``2130706433``, ``0x7f.1``, ``127.1`` are refused,
  because resolvers read them as ``127.0.0.1``).
- **Shell commands** are parsed with ``bashlex`` (see :func:`parse_command`).
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import ipaddress
import os
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

import bashlex
import bashlex.errors
import httpx
import idna

from nanocrab.tools.hosts import HostAllowList
from nanocrab.tools.paths import is_inside

PATH_TOOLS = frozenset({"read", "write", "edit", "ls", "glob", "grep"})
WALK_TOOLS = frozenset({"glob", "grep"})  # descend into the directory they are given
EXEC_TOOL = "exec"
URL_TOOLS = frozenset({"web_fetch"})
TOOL_NAME = re.compile(r"[a-z][a-z0-9_.-]*")

_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_C0_C1 = "".join(chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)])
_BAD_TEXT = re.compile("[" + re.escape(_C0_C1 + _BIDI + _ZERO_WIDTH) + "]")
_BAD_COMMAND = re.compile("[" + re.escape(_C0_C1.replace("\t", "").replace("\n", "") + _BIDI
                                          + _ZERO_WIDTH) + "]")  # fmt: skip
_HOST_CHARS = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")
_GLOB_CHARS = frozenset("*?[{")

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "csh", "tcsh", "fish", "busybox"})
INDIRECTION = frozenset({"eval", "exec", "source", ".", "env", "command", "builtin", "trap", "fc"})
_REDIRECT_OPS = frozenset({">", ">>", ">|", "<", ">&", "<&"})
_BASH_ONLY = frozenset({"&>", "&>>", "|&"})
_FORBIDDEN_NODES = {  # node kind: (what it is, what to do instead)
    "commandsubstitution": ("command substitution ($(...) or backticks)", "write values out"),
    "processsubstitution": ("process substitution (<(...) or >(...))", "use files instead"),
    "parameter": ("parameter expansion ($X, ${X}, $HOME)", "write values out literally"),
    "assignment": ("an environment assignment (FOO=bar)", "pass values as arguments"),
    "heredoc": ("a heredoc (<<)", "write the text to a file with the write tool first"),
}
_PARSE_ERRORS = (
    bashlex.errors.ParsingError,
    NotImplementedError,  # bashlex: arithmetic expansion, `time`, coprocesses
    AttributeError,
    IndexError,
    TypeError,
    ValueError,
    AssertionError,
    RecursionError,
)


class Refused(Exception):
    """A call the policy refuses before any rule is consulted; ``reason`` is for the model."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- tool names ---------------------------------------------------------------------------------


def check_tool_name(name: object, known: frozenset[str]) -> str:
    """``name`` when it is exactly one of ``known``; else :class:`Refused` with a hint.

    No normalisation is applied to accept a name: ``Read``, ``read ``, ``rea%64``, a Cyrillic
    ``\u0435`` for ``e`` or a zero-width space are unknown tools. The hint compares a folded
    form (percent-decoded, NFKC, without format characters, case-folded, stripped), then difflib.
    """
    if isinstance(name, str) and name in known:
        return name
    shown = ascii(name)
    if not isinstance(name, str):
        raise Refused(f"tool name {shown} is not a string")
    folded = _fold(name)
    guess = folded if folded in known else None
    if guess is None:
        close = difflib.get_close_matches(folded, sorted(known), n=1, cutoff=0.6)
        guess = close[0] if close else None
    hint = f"; did you mean {guess!r}?" if guess else f" (known tools: {', '.join(sorted(known))})"
    raise Refused(f"unknown tool {shown}: tool names must match exactly{hint}")


def _fold(name: str) -> str:
    text = unicodedata.normalize("NFKC", urllib.parse.unquote(name))
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cf", "Cc"))
    return text.casefold().strip()


# --- text ---------------------------------------------------------------------------------------


def check_text(value: str, what: str, *, command: bool = False) -> None:
    """Refuse control, bidi and zero-width characters in a resource string."""
    bad = (_BAD_COMMAND if command else _BAD_TEXT).search(value)
    if bad is None:
        return
    char = bad.group()
    label = "a NUL byte" if char == "\x00" else f"the invisible/control character U+{ord(char):04X}"
    raise Refused(
        f"the {what} {value!a} contains {label}; resend it as plain text without control, "
        "bidi or zero-width characters"
    )


# --- paths --------------------------------------------------------------------------------------


def resolve_path(base: str, raw: str, *, tilde: bool = False) -> str:
    """The real path ``raw`` names relative to ``base``; it may lie anywhere.

    ``tilde`` expands a leading ``~`` as a shell would; tools do not (to ``read``, ``~/x`` is a
    directory named ``~`` in the workspace), so tool path arguments are resolved without it.
    """
    if tilde and raw.startswith("~"):
        raw = os.path.expanduser(raw)
    return os.path.realpath(os.path.join(base, raw))


def expand_rule_path(raw: str, workspace: str) -> str:
    """A rule's path made real: ``${workspace}`` and a leading ``~`` expanded, symlinks resolved."""
    return os.path.realpath(os.path.expanduser(raw.replace("${workspace}", workspace)))


def inside(root: str, path: str) -> bool:
    """Whether the real path ``path`` is ``root`` or below it (``os.path.commonpath``).

    The string-prefix test only short-cuts the common negative case: ``commonpath`` can equal
    ``root`` only when ``path`` starts with it, and it alone decides the positive case.
    """
    return path.startswith(root) and is_inside(root, path)


def inside_any(path: str, roots: Iterable[str]) -> str | None:
    """The first of ``roots`` that contains ``path`` (both real), or ``None``."""
    for root in roots:
        if inside(root, path):
            return root
    return None


# --- hosts --------------------------------------------------------------------------------------


def parse_url(raw: str) -> str:
    """The normalised host of an http(s) URL the policy can reason about; else :class:`Refused`."""
    check_text(raw, "URL")
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as exc:
        raise Refused(f"the URL {raw!r} is invalid: {exc}") from exc
    if url.scheme not in ("http", "https"):
        raise Refused(f"only http and https URLs can be fetched, not {raw!r}")
    if url.userinfo:
        raise Refused(
            f"the URL {raw!r} carries userinfo before '@' (the real host is {url.host!r}); "
            "URLs with credentials or 'name@host' are refused — send the plain URL"
        )
    return _canonical_host(url.raw_host.decode("ascii"), raw)


def _canonical_host(host: str, raw: str) -> str:
    host = host.lower().rstrip(".")
    if not host:
        raise Refused(f"the URL {raw!r} has no host")
    if ":" in host:
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError as exc:
            raise Refused(f"the host {host!r} in {raw!r} is not a valid IPv6 address") from exc
    if not _HOST_CHARS.fullmatch(host):
        raise Refused(f"the host {host!r} in {raw!r} contains characters not allowed in a host")
    if _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):
        try:
            canonical = str(ipaddress.IPv4Address(host))
        except ValueError:
            canonical = ""
        if canonical != host:
            raise Refused(
                f"the numeric host {host!r} in {raw!r} is not a canonical dotted-quad IPv4 "
                "address (decimal, octal, hex and short forms are refused); write it as a.b.c.d"
            )
    return host


def normalise_pattern(pattern: str) -> str:
    """A host pattern (``example.com``, ``*.example.com``) in the form :func:`parse_url` gives."""
    wildcard = pattern.startswith("*.")
    body = pattern[2:] if wildcard else pattern
    if "*" in body:
        raise ValueError(f"host pattern {pattern!r}: '*' is only allowed as a leading '*.' label")
    try:
        ascii_host = body if body.isascii() else idna.encode(body.lower()).decode("ascii")
        host = _canonical_host(ascii_host, pattern)
    except (idna.IDNAError, Refused) as exc:
        raise ValueError(f"host pattern {pattern!r} is not a valid host name") from exc
    return ("*." if wildcard else "") + host


@functools.lru_cache(maxsize=1024)
def host_list(patterns: tuple[str, ...]) -> HostAllowList:
    """A :class:`HostAllowList` of normalised ``patterns`` (``ValueError`` for a bad one)."""
    return HostAllowList(normalise_pattern(p) for p in patterns)


# --- shell commands -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """One simple command: its words (unquoted), file redirection targets, and matching text."""

    argv: tuple[str, ...]
    redirect_targets: tuple[str, ...]
    text: str  # words joined by single spaces, redirections rendered as ``> file``, ``2>&1``


@dataclass(frozen=True, slots=True)
class PathWord:
    """A command word read as a path: its real path, and whether it holds glob characters
    (then ``path`` is the real path of the directory before the first glob character)."""

    word: str
    path: str
    glob: bool


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    segments: tuple[Segment, ...]
    path_words: tuple[PathWord, ...]


def parse_command(command: str, workspace: str) -> ParsedCommand:
    """``command`` split into simple commands, with its words resolved as paths.

    Refused (:class:`Refused`): anything bashlex cannot parse; command substitution, backticks,
    process substitution, ``$`` expansion of any kind, ``FOO=bar`` prefixes, heredocs;
    compound commands (subshells, ``{ }``, loops, ``if``, functions); indirection through
    ``eval``/``exec``/``source``/``.``/``env``/``command``/``builtin``/``trap``/``fc`` or a shell
    reading commands from ``-c``, ``-s`` or stdin; a command name with glob or brace characters;
    a file redirection whose target (resolved after any ``cd``) is outside the workspace, other
    than ``/dev/null``. bashlex parses bash, but the exec tool runs ``/bin/sh`` (often dash), so
    bash-only syntax that sh splits differently (``&>``, ``&>>``, ``|&``, ``>& file``) is refused:
    dash reads ``ls &>x curl evil`` as ``ls &`` and ``>x curl evil``.

    Every word after the command name (and the value of ``--opt=value``) is also resolved as a
    path relative to the current directory — the workspace, moved by literal ``cd`` segments —
    so deny rules on paths apply to command arguments (``cat ~/.ssh/id_rsa``).
    """
    parsed = _parse_shell(command)
    if isinstance(parsed, str):
        raise Refused(parsed)
    base = workspace
    words: list[PathWord] = []
    for segment in parsed:
        for target in segment.redirect_targets:
            real = resolve_path(base, target, tilde=True)
            if real != os.devnull and not inside(workspace, real):
                raise Refused(
                    f"the redirection target {target!r} resolves to {real}, outside the "
                    "workspace; redirect only to files inside the workspace (or /dev/null)"
                )
        for word in _path_candidates(segment.argv):
            words.append(_path_word(base, word))
        if segment.argv[0] in ("pushd", "popd") or segment.argv[:2] == ("cd", "-"):
            raise Refused(
                "pushd, popd and 'cd -' are not supported (the policy follows the working "
                "directory through literal cd only); use cd with a path"
            )
        if segment.argv[0] == "cd":
            where = segment.argv[1] if len(segment.argv) > 1 else "~"
            base = resolve_path(base, where, tilde=True)
    return ParsedCommand(segments=parsed, path_words=tuple(words))


def _path_candidates(argv: tuple[str, ...]) -> Iterable[str]:
    if "/" in argv[0]:
        yield argv[0]
    for word in argv[1:]:
        if word.startswith("-"):
            if "=" in word:
                yield word.split("=", 1)[1]
            continue
        yield word


def _path_word(base: str, word: str) -> PathWord:
    cut = next((i for i, c in enumerate(word) if c in _GLOB_CHARS), -1)
    if cut < 0:
        return PathWord(word, resolve_path(base, word, tilde=True), glob=False)
    literal = word[:cut]
    directory = literal if literal.endswith("/") else os.path.dirname(literal)
    return PathWord(word, resolve_path(base, directory or ".", tilde=True), glob=True)


@functools.lru_cache(maxsize=4096)
def _parse_shell(command: str) -> tuple[Segment, ...] | str:
    """The segments of ``command``, or why it is refused (cached: a pure function of the text)."""
    check_text(command, "command", command=True)
    if not command.strip():
        return "the command is empty"
    try:
        trees = bashlex.parse(command)
    except _PARSE_ERRORS as exc:
        return (
            f"the command {command!r} could not be parsed as a shell command ({exc}); send "
            "simple commands joined by &&, ||, ;, | or newlines"
        )
    try:
        for tree in trees:
            _reject_forbidden(tree, command)
        segments: list[Segment] = []
        for tree in trees:
            _collect(tree, segments)
    except Refused as exc:
        return exc.reason
    return tuple(segments)


def _reject_forbidden(tree: bashlex.ast.node, command: str) -> None:
    stack = [tree]
    while stack:
        node = stack.pop()
        forbidden = _FORBIDDEN_NODES.get(node.kind)
        if forbidden is not None:
            what, instead = forbidden
            if node.kind == "commandsubstitution" and command[node.pos[0]] == "`":
                what = "command substitution with backticks"
            raise Refused(
                f"the command contains {what}, which the policy cannot see through; {instead}"
            )
        stack.extend(getattr(node, "parts", None) or ())
        stack.extend(getattr(node, "list", None) or ())
        for attr in ("command", "output", "heredoc"):
            child = getattr(node, attr, None)
            if isinstance(child, bashlex.ast.node):
                stack.append(child)


def _collect(node: bashlex.ast.node, out: list[Segment]) -> None:
    if node.kind in ("list", "pipeline"):
        for part in node.parts:
            if part.kind == "pipe" and part.pipe in _BASH_ONLY:
                raise Refused(_bash_only(part.pipe))
            if part.kind in ("operator", "pipe") or (
                part.kind == "reservedword" and part.word == "!"
            ):
                continue
            _collect(part, out)
    elif node.kind == "command":
        out.append(_segment(node))
    else:
        raise Refused(
            f"compound shell syntax ({node.kind}: subshells, {{ }} groups, loops, if, functions) "
            "is not supported by the policy; send simple commands joined by &&, ||, ;, |"
        )


def _segment(node: bashlex.ast.node) -> Segment:
    argv: list[str] = []
    targets: list[str] = []
    text: list[str] = []
    for part in node.parts:
        if part.kind == "word":
            argv.append(part.word)
            text.append(part.word)
        elif part.kind == "redirect":
            target, rendered = _redirect(part)
            if target is not None:
                targets.append(target)
            text.append(rendered)
        else:
            raise Refused(f"unsupported shell syntax ({part.kind}) in a command")
    if not argv:
        raise Refused("a command consists only of redirections")
    _check_command_name(argv)
    return Segment(argv=tuple(argv), redirect_targets=tuple(targets), text=" ".join(text))


def _redirect(node: bashlex.ast.node) -> tuple[str | None, str]:
    op = node.type
    if op in _BASH_ONLY:
        raise Refused(_bash_only(op))
    if op not in _REDIRECT_OPS:
        raise Refused(f"the redirection {op!r} is not supported; use >, >>, < or 2>&1")
    fd = "" if node.input is None else str(node.input)
    output = getattr(node, "output", None)
    if op in (">&", "<&"):  # descriptor duplication only: ``>& file`` is bash-only
        if isinstance(output, int) or output == "-":
            return None, f"{fd}{op}{output}"
        raise Refused(_bash_only(f"{op} file"))
    if isinstance(output, bashlex.ast.node):
        return output.word, f"{fd}{op} {output.word}"
    raise Refused(f"the redirection {op!r} has no target")


def _bash_only(syntax: str) -> str:
    return (
        f"'{syntax}' is bash-only syntax that /bin/sh (which runs the command) reads "
        "differently; use '> file 2>&1' or '2>&1 |'"
    )


def _check_command_name(argv: list[str]) -> None:
    name = argv[0]
    if any(c in _GLOB_CHARS or c in "]}" or c.isspace() for c in name):
        raise Refused(
            f"the command name {name!r} contains glob, brace or space characters; spell it out"
        )
    base = os.path.basename(name)
    if base in INDIRECTION or name in INDIRECTION:
        raise Refused(
            f"'{base}' runs another command indirectly, which the policy cannot check; "
            "run the command itself"
        )
    if base in SHELLS:
        flags = "".join(w[1:] for w in argv[1:] if w.startswith("-") and not w.startswith("--"))
        scripts = [w for w in argv[1:] if not w.startswith("-")]
        if "c" in flags or "s" in flags or not scripts:
            raise Refused(
                f"'{base}' reading commands from -c, -s or stdin is indirection the policy cannot "
                "check; run the commands directly"
            )


@functools.lru_cache(maxsize=1024)
def compile_globs(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """``fnmatch.fnmatchcase`` patterns compiled once."""
    return tuple(re.compile(fnmatch.translate(p)) for p in patterns)
