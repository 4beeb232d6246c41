"""How exec rules read a parsed command: deny globs, allow globs, argument grammars, and what
keeps a command from being Safe. Pure: the only I/O is resolving paths and listing globs."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from nanocrab.policy.programs import Grammar, Where, problem, stays_inside
from nanocrab.policy.shell import ParsedCommand


def forbidden(globs: Sequence[re.Pattern[str]], parsed: ParsedCommand) -> str | None:
    """What a deny rule's ``globs`` forbid in ``parsed``: a segment, or any tail of a segment's
    words (``nohup rm -rf x`` still holds ``rm -rf x``)."""
    for seg in parsed.segments:
        for text in (seg.text, *(" ".join(seg.argv[i:]) for i in range(len(seg.argv)))):
            if any(g.match(text) for g in globs):
                return f"the command {text!r} is forbidden"
    return None


def covered(
    parsed: ParsedCommand,
    workspace: str,
    *,
    globs: Sequence[re.Pattern[str]] | None = None,
    grammars: Sequence[Grammar] | None = None,
    safe: bool,
) -> tuple[bool, str | None]:
    """Whether every segment of ``parsed`` matches one of ``globs`` or is accepted by one of
    ``grammars`` — and, for a ``safe`` rule, whether the command also stays Safe (see
    :func:`not_safe`; grammars check their own operands). The second item says why a rule
    whose commands fit did not match, for the model (``None`` when nothing fit)."""
    for seg, base in zip(parsed.segments, parsed.bases, strict=True):
        if globs is not None:
            if not any(g.match(seg.text) for g in globs):
                return False, None
            continue
        why = refusal(grammars or (), seg.argv, Where(base, workspace))
        if why is not None:
            return False, (f"{seg.text!r}: {why}" if why else None)
    if safe:
        bad = not_safe(parsed, workspace, paths=grammars is None)
        if bad is not None:
            return False, bad
    return True, None


def refusal(grammars: Sequence[Grammar], argv: tuple[str, ...], where: Where) -> str | None:
    """``None`` when a grammar accepts ``argv``; else the objection of the grammar with the
    longest matching command ("" when no grammar is for this command)."""
    why, best = "", -1
    for grammar in grammars:
        rest = grammar.rest(argv)
        if rest is None:
            continue
        bad = problem(grammar, rest, where)
        if bad is None:
            return None
        if len(argv) - len(rest) > best:
            why, best = f"{grammar.name}: {bad}", len(argv) - len(rest)
    return why


def not_safe(parsed: ParsedCommand, workspace: str, *, paths: bool) -> str | None:
    """Why a command cannot be Safe: it writes through a redirection (anything but
    ``/dev/null``), or (``paths``) a word read as a path leaves the workspace."""
    for word in parsed.writes:
        if word.path != os.devnull:
            return f"it redirects output to {word.word!r}, and a Safe command writes nothing"
    if paths:
        for word in parsed.path_words:
            bad = stays_inside(word, workspace)
            if bad is not None:
                return bad
    return None


def git_write(paths: Iterable[str]) -> str | None:
    """The first of ``paths`` (written to) that lies in a ``.git`` directory, described."""
    for path in paths:
        if ".git" in path.lower().split("/"):
            return f"it writes {path}, inside a .git directory (hooks and config there run code)"
    return None
