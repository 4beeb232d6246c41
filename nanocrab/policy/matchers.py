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
- **Shell commands** are parsed in :mod:`nanocrab.policy.shell`.
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import idna

from nanocrab.tools.hosts import HostAllowList
from nanocrab.tools.paths import is_inside

PATH_TOOLS = frozenset({"read", "write", "edit", "ls", "glob", "grep"})
WALK_TOOLS = frozenset({"glob", "grep"})  # descend into the directory they are given
MOUNT_TOOLS = frozenset({"python"})  # see the whole workspace (mounted into the sandbox)
EXEC_TOOL = "exec"
URL_TOOLS = frozenset({"web_fetch"})
# tools whose resource is a host: a URL's (web_fetch), or the fixed API host of a configured
# service (web_search: its provider's, given to the engine in ``Request.tool_hosts``)
HOST_TOOLS = URL_TOOLS | {"web_search"}
TOOL_NAME = re.compile(r"[a-z][a-z0-9_.-]*")
# a family of tools in a rule: every name under a dotted prefix (``mcp.*``, ``mcp.files.*``)
TOOL_FAMILY = re.compile(r"[a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)*\.\*")

_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_C0_C1 = "".join(chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)])
_BAD_TEXT = re.compile("[" + re.escape(_C0_C1 + _BIDI + _ZERO_WIDTH) + "]")
_BAD_COMMAND = re.compile("[" + re.escape(_C0_C1.replace("\t", "").replace("\n", "") + _BIDI
                                          + _ZERO_WIDTH) + "]")  # fmt: skip
_HOST_CHARS = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")
_GLOB_CHARS = frozenset("*?[{")


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


def lexical_path(base: str, raw: str, *, tilde: bool = False) -> str:
    """``raw`` joined to ``base`` with ``.`` and ``..`` applied but no symlink followed — the
    path as written, which a deny rule also checks (``/proc/self/cwd/x`` is under ``/proc``
    whatever the policy's own working directory is). A leading ``//`` is folded to ``/``."""
    if tilde and raw.startswith("~"):
        raw = os.path.expanduser(raw)
    path = os.path.normpath(os.path.join(base, raw))
    return "/" + path.lstrip("/") if path.startswith("//") else path


def expand_rule_path(raw: str, workspace: str) -> str | None:
    """A rule's path made real: ``${workspace}`` and a leading ``~`` expanded, symlinks resolved.
    ``None`` for a ``~`` path when there is no home directory (``~`` is ``/``)."""
    expanded = os.path.expanduser(raw.replace("${workspace}", workspace))
    if raw.startswith("~") and os.path.realpath(os.path.expanduser("~")) == "/":
        return None
    return os.path.realpath(expanded)


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


@dataclass(frozen=True, slots=True)
class Zone:
    """Denied directory trees, each with the subtrees spared from it (all real paths).

    A path is held by the zone when it is inside a root and not inside one of that root's
    spared subtrees — how "every home directory, except the workspace when it lies in one" and
    "the data directory, except a workspace inside it" are said.
    """

    roots: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, roots: Iterable[str], spare: Iterable[str] = (), *, strict: bool = False) -> Zone:
        """``roots`` sparing those of ``spare`` that lie inside them (``strict``: strictly
        inside, so a spared path equal to a root spares nothing)."""
        spare = tuple(spare)
        return cls(
            tuple(
                (root, tuple(s for s in spare if inside(root, s) and not (strict and s == root)))
                for root in dict.fromkeys(roots)
            )
        )

    def holds(self, path: str) -> str | None:
        """The root that denies ``path``, or ``None``."""
        for root, spared in self.roots:
            if inside(root, path) and not any(inside(s, path) for s in spared):
                return root
        return None

    def below(self, directory: str) -> Iterator[str]:
        """The roots a walk down from ``directory`` would enter (those strictly below it)."""
        for root, spared in self.roots:
            if root != directory and inside(directory, root) and root not in spared:
                yield root


def component_matches(name: str, pattern: str) -> bool:
    """Whether the sh glob ``pattern`` may match the file name ``name``.

    Conservative where Python's fnmatch and sh differ: a leading ``.`` must be matched by a
    leading ``.`` in the pattern (or may be, by a bracket expression holding one);
    ``[^…]`` and ``[[:class:]]`` may match anything.
    """
    if name.startswith(".") and not pattern.startswith("."):
        return pattern.startswith("[") and "." in pattern.split("]", 1)[0]
    if "[^" in pattern or "[:" in pattern:
        return True
    return fnmatch.fnmatchcase(name, pattern)


# --- hosts --------------------------------------------------------------------------------------


def parse_url(raw: str) -> str:
    """The normalised host of an http(s) URL the policy can reason about; else :class:`Refused`."""
    check_text(raw, "URL")
    import httpx  # ~60 ms to import: only when a URL is checked, not for every command

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


@functools.lru_cache(maxsize=1024)
def compile_globs(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """``fnmatch.fnmatchcase`` patterns compiled once."""
    return tuple(re.compile(fnmatch.translate(p)) for p in patterns)
