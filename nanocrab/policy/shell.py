"""Shell commands as the policy reads them: parsed with ``bashlex`` into simple commands.

The exec tool runs ``/bin/sh -c``; anything whose meaning depends on expansion or on bash-only
syntax is refused rather than guessed (see :func:`parse_command`). Every segment of a compound
command (``a && b | c``) is a :class:`Segment` the rules match on its own.
"""

from __future__ import annotations

import functools
import glob
import itertools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanocrab.policy.matchers import (
    _GLOB_CHARS,
    Refused,
    Zone,
    check_text,
    component_matches,
    inside,
    lexical_path,
    resolve_path,
)

if TYPE_CHECKING:  # bashlex costs ~0.1 s to import: it is imported by the first parse
    import bashlex

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
_OUTPUT_OPS = frozenset({">", ">>", ">|"})
_SEPARATORS = re.compile(r"[=:,]")
_SHELL_TILDE = re.compile(r"~[+-]|~[0-9]")
_MAX_MATCHES = 1000
_PARSE_ERRORS: tuple[type[Exception], ...] = (  # with bashlex.errors.ParsingError
    NotImplementedError,  # bashlex: arithmetic expansion, `time`, coprocesses
    AttributeError,
    IndexError,
    TypeError,
    ValueError,
    AssertionError,
    RecursionError,
)


@dataclass(frozen=True, slots=True)
class Segment:
    """One simple command: its words (unquoted), file redirection targets (``writes``: those of
    ``>``, ``>>`` and ``>|``), and the text rules match (words joined by single spaces,
    redirections rendered as ``> file``, ``2>&1``)."""

    argv: tuple[str, ...]
    redirect_targets: tuple[str, ...]
    text: str
    writes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PathWord:
    """A command word read as a path.

    ``lexical`` is the path with ``..`` applied but no symlink followed, ``path`` the real path
    (for a glob: of the directory before its first glob character, and ``glob`` holds the
    pattern's components below it). ``matches`` are the real paths the glob matches now
    (``complete`` is false when there were too many to list).
    """

    word: str
    path: str
    lexical: str
    glob: tuple[str, ...] | None = None
    matches: tuple[str, ...] = ()
    complete: bool = True


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """``segments`` in order; ``bases`` the working directory each runs in (moved by literal
    ``cd``); ``path_words`` the words read as paths; ``redirects`` every redirection target and
    ``writes`` those of output redirections (``>``, ``>>``, ``>|``)."""

    segments: tuple[Segment, ...]
    path_words: tuple[PathWord, ...]
    bases: tuple[str, ...] = ()
    redirects: tuple[PathWord, ...] = ()
    writes: tuple[PathWord, ...] = ()

    def every_path(self) -> Iterable[PathWord]:
        """The path words, then the redirection targets."""
        yield from self.path_words
        yield from self.redirects


def parse_command(command: str, workspace: str) -> ParsedCommand:
    """``command`` split into simple commands, with its words resolved as paths.

    Refused (:class:`Refused`): anything bashlex cannot parse; command substitution, backticks,
    process substitution, ``$`` expansion of any kind, ``FOO=bar`` prefixes, heredocs;
    compound commands (subshells, ``{ }``, loops, ``if``, functions); indirection through
    ``eval``/``exec``/``source``/``.``/``env``/``command``/``builtin``/``trap``/``fc`` or a shell
    reading commands from ``-c``, ``-s`` or stdin; a command name with glob or brace characters;
    a file redirection whose target (resolved after any ``cd``) is outside the workspace, other
    than ``/dev/null``; a tilde form that depends on the shell's state (``~+``, ``~-``, ``~2``);
    a glob that could climb out of its directory (``*/..``, ``.*`` matches ``..`` in sh). bashlex
    parses bash, but the exec tool runs ``/bin/sh`` (often dash), so bash-only syntax that sh
    splits differently (``&>``, ``&>>``, ``|&``, ``>& file``) is refused: dash reads
    ``ls &>x curl evil`` as ``ls &`` and ``>x curl evil``.

    Every word after the command name — and the parts of a word after ``=``, ``:`` or ``,``, and
    what follows a single-letter option (``-f/x``) — is also resolved as a path relative to the
    current directory (the workspace, moved by literal ``cd`` segments), so deny rules on paths
    apply to command arguments (``cat ~/.ssh/id_rsa``, ``--file=/etc/x``, ``if=/dev/sda``).
    """
    parsed = _parse_shell(command)
    if isinstance(parsed, str):
        raise Refused(parsed)
    base = workspace
    words: list[PathWord] = []
    bases: list[str] = []
    redirects: list[PathWord] = []
    writes: list[PathWord] = []
    for segment in parsed:
        bases.append(base)
        for target in segment.redirect_targets:
            real = resolve_path(base, target, tilde=True)
            if real != os.devnull and not inside(workspace, real):
                raise Refused(
                    f"the redirection target {target!r} resolves to {real}, outside the "
                    "workspace; redirect only to files inside the workspace (or /dev/null)"
                )
            resolved = path_word(base, target, literal=True)  # sh does not glob a target
            redirects.append(resolved)
            if target in segment.writes:
                writes.append(resolved)
        for word, literal in _path_candidates(segment.argv):
            words.append(path_word(base, word, literal=literal))
        if segment.argv[0] in ("pushd", "popd") or segment.argv[:2] == ("cd", "-"):
            raise Refused(
                "pushd, popd and 'cd -' are not supported (the policy follows the working "
                "directory through literal cd only); use cd with a path"
            )
        if segment.argv[0] == "cd":
            where = segment.argv[1] if len(segment.argv) > 1 else "~"
            base = resolve_path(base, where, tilde=True)
    return ParsedCommand(
        segments=parsed,
        path_words=tuple(words),
        bases=tuple(bases),
        redirects=tuple(redirects),
        writes=tuple(writes),
    )


def _path_candidates(argv: tuple[str, ...]) -> Iterable[tuple[str, bool]]:
    """Words to read as paths, each with whether it is only part of a word (not globbed)."""
    if "/" in argv[0]:
        yield argv[0], False
    for word in argv[1:]:
        if word.startswith("-"):
            if not word.startswith("--") and len(word) > 2:
                yield word[2:], True  # -f/etc/x: a single-letter option's attached value
        else:
            yield word, False
        if _SEPARATORS.search(word):
            yield from ((part, True) for part in _SEPARATORS.split(word)[1:] if part)


def path_word(base: str, word: str, *, literal: bool = False) -> PathWord:
    """``word`` read as a path from ``base`` (see :class:`PathWord`); a leading ``~`` or
    ``~user`` is expanded as sh does. Raises :class:`Refused` for tilde forms that depend on the
    shell's state and for globs that could leave their directory. A ``literal`` word (part of a
    shell word) is taken as it is: no glob, no refusal."""
    if literal:
        return PathWord(
            word, resolve_path(base, word, tilde=True), lexical_path(base, word, tilde=True)
        )
    if _SHELL_TILDE.match(word):
        raise Refused(
            f"the word {word!r} starts with a tilde form (~+, ~-, ~N) whose directory depends "
            "on the shell; write the path out"
        )
    cut = next((i for i, c in enumerate(word) if c in _GLOB_CHARS), -1)
    if cut < 0:
        return PathWord(
            word, resolve_path(base, word, tilde=True), lexical_path(base, word, tilde=True)
        )
    head = word[:cut]
    directory = head if head.endswith("/") else os.path.dirname(head)
    pattern = tuple(p for p in word[len(directory) :].split("/") if p)
    if any(p == ".." or (_has_glob(p) and component_matches("..", p)) for p in pattern):
        raise Refused(
            f"the glob {word!r} could match '..' and leave its directory; name the directory "
            "without '..' in or after the glob"
        )
    expanded = os.path.expanduser(word) if word.startswith("~") else word
    pattern_path = os.path.join(glob.escape(base), expanded)  # the base is no pattern
    found = list(itertools.islice(glob.iglob(pattern_path), _MAX_MATCHES + 1))
    return PathWord(
        word,
        resolve_path(base, directory or ".", tilde=True),
        lexical_path(base, directory or ".", tilde=True),
        glob=pattern,
        matches=tuple(os.path.realpath(m) for m in found[:_MAX_MATCHES]),
        complete=len(found) <= _MAX_MATCHES,
    )


def _has_glob(part: str) -> bool:
    return any(c in _GLOB_CHARS for c in part)


def word_in_zone(word: PathWord, zone: Zone) -> str | None:
    """Why ``word`` reaches a root of ``zone`` (as written, as resolved, through what a glob
    matches now, or through what its pattern could match), or ``None``."""
    for path in (word.path, word.lexical):
        root = zone.holds(path)
        if root is not None:
            how = "is" if path == word.lexical else "resolves to"
            return f"the argument {word.word!r} {how} {path}, inside {root}"
    for match in word.matches:
        root = zone.holds(match)
        if root is not None:
            return f"the glob {word.word!r} matches {match}, inside {root}"
    if word.glob is not None:
        for directory in dict.fromkeys((word.path, word.lexical)):
            for root in zone.below(directory):
                rel = root[len(directory) :].strip("/").split("/")
                if all(component_matches(n, p) for n, p in zip(rel, word.glob, strict=False)):
                    return f"the glob {word.word!r} could reach {root}"
    return None


@functools.lru_cache(maxsize=4096)
def _parse_shell(command: str) -> tuple[Segment, ...] | str:
    """The segments of ``command``, or why it is refused (cached: a pure function of the text)."""
    check_text(command, "command", command=True)
    if not command.strip():
        return "the command is empty"
    import bashlex
    import bashlex.errors

    try:
        trees = bashlex.parse(command)
    except (bashlex.errors.ParsingError, *_PARSE_ERRORS) as exc:
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
    import bashlex  # loaded by the parse that made ``tree``

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
    writes: list[str] = []
    text: list[str] = []
    for part in node.parts:
        if part.kind == "word":
            argv.append(part.word)
            text.append(part.word)
        elif part.kind == "redirect":
            target, rendered = _redirect(part)
            if target is not None:
                targets.append(target)
                if part.type in _OUTPUT_OPS:
                    writes.append(target)
            text.append(rendered)
        else:
            raise Refused(f"unsupported shell syntax ({part.kind}) in a command")
    if not argv:
        raise Refused("a command consists only of redirections")
    _check_command_name(argv)
    return Segment(
        argv=tuple(argv), redirect_targets=tuple(targets), text=" ".join(text), writes=tuple(writes)
    )


def _redirect(node: bashlex.ast.node) -> tuple[str | None, str]:
    import bashlex  # loaded by the parse that made ``node``

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
