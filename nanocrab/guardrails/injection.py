"""The fast local prompt-injection detector: scored heuristics over normalised and decoded text.

How a text is scored (rules and weights in :mod:`nanocrab.guardrails.injection_rules`):

1. normalise (lower case, invisible characters dropped, compatibility forms and look-alike
   letters folded — :func:`nanocrab.guardrails.text.normalize`) and match every rule;
2. match again on variants that undo obfuscation: spaced-out letters and leetspeak joined,
   base64 / hex / URL / escape payloads decoded, rot13 and reversed text (for short texts, or
   when the text mentions the encoding); evidence found only in a variant adds the
   ``encoded`` signal, since hiding an instruction is itself suspicious;
3. per family keep the strongest match, lowered when the match looks like a *mention* (quoted
   and surrounded by words about injection, as in documentation or a detector's own code);
4. combine families as independent evidence: ``score = 1 - Π(1 - w)`` — weak ones only near
   each other (:func:`_local`);
5. when a classifier is given and the heuristic score is still below the filter's threshold
   (at ``task_input`` and ``tool_output``), the learned head
   (:mod:`nanocrab.guardrails.classifier`) reads a few windows of the text and its probability
   joins as one more family, ``learned`` (weight ``0.6`` at ``p >= P_STRONG``, enough alone;
   ``0.3`` at ``p >= P_WEAK``, enough with some heuristic evidence; halved when words about
   injection surround the window, as the rules' weights are). In a user's task it counts only
   at ``p >= P_TASK`` with an override or secret word in the window: asking the assistant to
   act is what tasks do (as the rules, which ignore action requests there).

The checkpoint matters: in a user's task, requests for consequential actions ("transfer $500
to ...") are the user's own and do not count; in a tool's output they are the typical
indirect injection. The detector is a heuristic: it reports evidence with a score, and the
chain's threshold decides. Its measured recall and false-positive rate are in
docs/guardrails.md.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from nanocrab.guardrails.classifier import InjectionClassifier, windows
from nanocrab.guardrails.injection_rules import (
    ANCHOR_AUTOMATON,
    COMPILED,
    MENTION_CUES,
    SELF_CORRECTION,
    SHORT_ONLY,
    Rule,
)
from nanocrab.guardrails.model import Checkpoint, Finding
from nanocrab.guardrails.text import decode_payloads, despace, normalize, reverse_words, rot13

_IGNORED_AT: dict[Checkpoint, frozenset[str]] = {
    "task_input": frozenset({"action", "imperative", "coercion", "address", "secret_words",
                             "answer", "urgency", "authority", "directive"}),
    "tool_output": frozenset(),
    "tool_call": frozenset({"imperative"}),
    "reply": frozenset({"imperative", "action"}),
}
_SHORT = 600  # texts up to this length are also read as rot13 and in leetspeak
# Rules run only near their anchors in long texts: a match reaches at most its rule's width
# (bounded patterns), or ~_REACH characters (the longest unbounded rule's matches span ~300),
# from an anchor, and a 4 KB text then costs a fraction of a full scan per rule; past
# _MAX_WINDOWS occurrences the whole text is scanned.
_REACH = 320
_LOOKAHEAD = 64  # a window ends this far past a match's reach: a search stops at its end, and
# a rule's closing look-ahead ("(?!-)", "\b") must see the text that follows, not the end
_MAX_WINDOWS = 40
_WINDOWED = 1500
# words that must appear in a long text's spaced-out/leet variant for it to be re-scanned
_TRIGGERS = re.compile(r"ignore|disregard|forget|instruction|prompt|password|secret|system|"
                       r"reveal|override|jailbreak|assistant|send|token|api ?key")
_ROT13_HINT = re.compile(r"\b(?:rot-?13|caesar|rotate)\b")
_REVERSE_HINT = re.compile(r"\b(?:backwards?|reversed?|in reverse|right to left)\b")
_OPEN_SINGLE = re.compile(r"(?:^|[\s(:=\[])'[^']*$")
_QUOTES = ("\"", "`", "“", "”", "«", "»")
_ENCODED_WEIGHT = 0.3
# the learned head's probability -> family weight (tuned on the training set's own validation
# split and checked on the dev set; see bench/guardrails_train.py and docs/guardrails.md)
P_STRONG = 0.9
P_WEAK = 0.6
P_TASK = 0.9  # in a user's task (see below)
_LEARNED_AT: frozenset[Checkpoint] = frozenset({"task_input", "tool_output"})


@dataclass(frozen=True, slots=True)
class _Match:
    family: str
    name: str
    weight: float
    start: int
    end: int


def _anchor_hits(text: str) -> dict[str, list[int]]:
    """Start offsets of every anchor in ``text``, found in one Aho-Corasick pass (~0.1 ms for
    4 KB, against ~1 ms for ~500 separate substring searches)."""
    hits: dict[str, list[int]] = {}
    for end, anchor in ANCHOR_AUTOMATON.iter(text):
        hits.setdefault(anchor, []).append(end - len(anchor) + 1)
    return hits


def _windows(starts: list[int], text_length: int, reach: int) -> list[tuple[int, int]] | None:
    """Merged ``[start, end)`` windows around anchor occurrences, or ``None`` when they would
    cover most of the text anyway (then the whole text is scanned once)."""
    if len(starts) > _MAX_WINDOWS:
        return None
    merged: list[tuple[int, int]] = []
    for pos in sorted(starts):
        start, end = max(0, pos - reach), pos + reach + _LOOKAHEAD
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    if sum(e - s for s, e in merged) > text_length * 4 // 5:
        return None
    return merged


def _together(groups: list[list[int]], reach: int) -> list[int]:
    """The occurrences of the rarest anchor group that have an occurrence of every other group
    within ``reach``: a match holds one anchor of each group, so only there can one start."""
    rarest = min(groups, key=len)
    others = [sorted(g) for g in groups if g is not rarest]
    if not others:
        return rarest
    kept = []
    for pos in rarest:
        for other in others:
            i = bisect.bisect_left(other, pos - reach)
            if i == len(other) or other[i] > pos + reach:
                break
        else:
            kept.append(pos)
    return kept


def _rule_index() -> dict[str, tuple[tuple[int, int], ...]]:
    """Each anchor → the (rule, anchor group) pairs it belongs to, rules by their index in
    :data:`COMPILED`."""
    index: dict[str, list[tuple[int, int]]] = {}
    for i, rule in enumerate(COMPILED):
        for g, group in enumerate(rule.anchors):
            for anchor in group:
                index.setdefault(anchor, []).append((i, g))
    return {anchor: tuple(pairs) for anchor, pairs in index.items()}


_BY_ANCHOR = _rule_index()
_UNANCHORED = tuple(i for i, rule in enumerate(COMPILED) if not rule.anchors)


def _candidates(hits: dict[str, list[int]]) -> list[tuple[int, list[list[int]]]]:
    """The rules (by index, in table order) with a hit in every anchor group, each with its
    groups' hit offsets: only these can match. Looked up from the text's hits, so a check
    costs what the text holds, not a pass over every rule (a 4 KB page reaches ~60 of them)."""
    found: dict[int, dict[int, list[int]]] = {}
    for anchor, starts in hits.items():
        for i, g in _BY_ANCHOR.get(anchor, ()):
            found.setdefault(i, {}).setdefault(g, []).extend(starts)
    out: list[tuple[int, list[list[int]]]] = [(i, []) for i in _UNANCHORED]
    for i, groups in found.items():
        if len(groups) == len(COMPILED[i].anchors):
            out.append((i, [groups[g] for g in range(len(groups))]))
    out.sort(key=lambda c: c[0])
    return out


def _scan(text: str, ignored: frozenset[str]) -> dict[str, _Match]:
    best: dict[str, _Match] = {}
    whole = [(0, len(text))]
    long_text = len(text) > _WINDOWED
    for i, groups in _candidates(_anchor_hits(text)):
        rule = COMPILED[i]
        if rule.family in ignored or (long_text and rule.name in SHORT_ONLY):
            continue
        current = best.get(rule.family)
        if current is not None and current.weight >= rule.weight:
            continue
        windows = None
        if long_text and groups:
            # (a few characters over the width: an anchor may overhang its match, " ai")
            reach = min((rule.width or _REACH) + 8, _REACH)
            starts = _together(groups, reach)
            if not starts:
                continue  # the anchors never come within one match's reach of each other
            windows = _windows(starts, len(text), reach)
        match = _first(rule, text, windows or whole)
        if match is not None:
            best[rule.family] = _Match(rule.family, rule.name, rule.weight, *match)
    return best


def _first(rule: Rule, text: str, windows: list[tuple[int, int]]) -> tuple[int, int] | None:
    for lo, hi in windows:
        for m in rule.pattern.finditer(text, lo, min(hi, len(text))):
            start = m.start()
            if rule.word_start and start > 0 and text[start - 1].isalnum():
                continue  # "_" counts as a boundary: OPENAI_API_KEY holds "api_key"
            return start, m.end()
    return None


def _damped(text: str, match: _Match) -> float:
    """The match's weight, lowered when the text seems to talk *about* the phrase: words about
    injection nearby (the match itself excluded), more so when the match sits in quotes; and
    halved inside a string literal of code (test inputs of a sanitizer, a shell policy or a
    sandbox: ``("cat ~/.ssh/id_rsa", "deny"),``), which data *quotes* rather than says — a
    literal with a second signal beside it still adds up to a finding."""
    weight = match.weight * (0.5 if _in_code_string(text, match.start, match.end) else 1.0)
    around = text[max(0, match.start - 200) : match.start] + " " + text[match.end : match.end + 200]
    cues = {m.group(0) for m in MENTION_CUES.finditer(around)}
    if not cues:
        return weight
    line_start = max(text.rfind("\n", 0, match.start) + 1, match.start - 300)
    before = text[line_start : match.start]
    quoted = (sum(before.count(q) for q in _QUOTES) % 2 == 1
              or _OPEN_SINGLE.search(before) is not None)  # fmt: skip
    if quoted:
        return weight * 0.4
    return weight * (0.6 if len(cues) >= 2 else 0.8)


_BEFORE_LITERAL = re.compile(
    r"(?:[=(]|\([^\n]*,|\b(?:return|assert|yield|in|print|echo))\s*[frbu]{0,2}$"
)
_AFTER_LITERAL = re.compile(r"\s*(?:[)\]},;:]|\+|%|$|#|//)")


def _in_code_string(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` lies inside one string literal that code passes, assigns,
    compares or returns: between a quote opened after ``=``, ``(``, a comma inside a call's
    parentheses, or ``return``/``assert``/``in``, and its closing quote on the same line,
    followed by code punctuation or the line's end. Prose in quotes ("he said 'run it'") is
    not code-shaped, and neither are JSON's or YAML's values (``"body": "..."``, ``[..., "..."]``):
    tool output quotes its injections there."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    for q in ('"', "'", "`"):
        opened = text.rfind(q, line_start, start)
        if opened < 0 or text.count(q, line_start, start) % 2 == 0:
            continue
        closed = text.find(q, end, line_end)
        if closed < 0 or q in text[start:end]:
            continue
        if (_BEFORE_LITERAL.search(text, line_start, opened)
                and _AFTER_LITERAL.match(text, closed + 1, line_end)):  # fmt: skip
            return True
    return False


_NEAR = 600
"""Characters between two weak signals that still count as one piece of evidence."""


def _local(direct: dict[str, _Match], weights: dict[str, float]) -> dict[str, float]:
    """Weak signals only add up near each other: when no family is strong on its own
    (< 0.5), those further than :data:`_NEAR` characters from the strongest are dropped — in
    a long page, "automatically" in one section and "system prompt" in another are not one
    instruction."""
    if len(weights) < 2 or max(weights.values()) >= 0.5:
        return weights
    top = max(weights, key=lambda f: weights[f])
    anchor = direct[top]
    return {f: w for f, w in weights.items()
            if f == top or (direct[f].start < anchor.end + _NEAR
                            and direct[f].end > anchor.start - _NEAR)}  # fmt: skip


def _combine(weights: list[float]) -> float:
    remaining = 1.0
    for w in weights:
        remaining *= 1.0 - w
    return round(1.0 - remaining, 4)


def detect_injection(text: str, checkpoint: Checkpoint = "tool_output", *,
                     classifier: InjectionClassifier | None = None,
                     threshold: float = 1.0) -> list[Finding]:  # fmt: skip
    """At most one ``INJECTION`` finding for ``text``: its span is the strongest evidence, its
    score the combined evidence, its ``signals`` the ``family:rule`` names that contributed.

    ``classifier``: the learned layer, consulted at ``task_input`` / ``tool_output`` only while
    the heuristic score is below ``threshold`` (a text already over it needs no second opinion,
    and the classifier costs ~12 ms per window)."""
    if not text.strip():
        return []
    ignored = _IGNORED_AT[checkpoint]
    norm = normalize(text)
    direct = _scan(norm.text, ignored)
    weights = {f: _damped(norm.text, m) for f, m in direct.items()}
    weights = _local(direct, weights)
    direct = {f: m for f, m in direct.items() if f in weights}
    signals = [f"{m.family}:{m.name}" for m in direct.values()]
    top = max(direct.values(), key=lambda m: weights[m.family], default=None)
    span = norm.span(top.start, top.end) if top is not None else None

    variants: list[tuple[str, tuple[int, int] | None, str]] = []
    joined = despace(norm.text, leet=len(norm.text) <= _SHORT)
    if joined != norm.text and (len(norm.text) <= _SHORT or _TRIGGERS.search(joined)):
        variants.append(("despaced", None, joined))
    for payload in decode_payloads(text):
        variants.append((payload.encoding, (payload.start, payload.end),
                         normalize(payload.text).text))  # fmt: skip
    if len(norm.text) <= _SHORT or _ROT13_HINT.search(norm.text):
        variants.append(("rot13", None, rot13(norm.text)))
    if len(norm.text) <= _SHORT and _REVERSE_HINT.search(norm.text):
        variants.append(("reversed", None, reverse_words(norm.text)))
    encoded = False
    for label, where, variant in variants:
        for family, m in _scan(variant, ignored).items():
            seen = direct[family].weight if family in direct else weights.get(family, 0.0)
            if m.weight < 0.4 or m.weight <= seen:
                continue
            weights[family] = m.weight
            signals.append(f"{family}:{m.name}@{label}")
            encoded = encoded or label != "despaced" or family not in direct
            if span is None or top is None or m.weight > weights.get(top.family, 0.0):
                span = where or (0, len(text))
    if encoded:
        weights["encoded"] = _ENCODED_WEIGHT
        signals.append("encoded")
    if classifier is not None and checkpoint in _LEARNED_AT and (
        not weights or _combine(list(weights.values())) < threshold
    ):
        learned = _learned(classifier, norm.text, top, text)
        if learned is not None:
            p, (lo, hi) = learned
            weight = 0.6 if p >= P_STRONG else 0.3 if p >= P_WEAK else 0.0
            if checkpoint == "task_input" and p < P_TASK:
                weight = 0.0  # a user's task is imperative by nature: only overrides count
            if weight and (
                MENTION_CUES.search(norm.text, max(0, lo - 200), hi + 200)  # about injection
                or (not weights and SELF_CORRECTION.search(norm.text, lo, hi))  # a retraction
            ):
                weight /= 2  # the classifier cannot tell use from mention, nor a retraction
            if weight:
                weights["learned"] = weight
                signals.append(f"learned:p={p:.2f}")
                if span is None or weight > max(weights.values(), default=0.0) - 1e-9:
                    span = norm.span(lo, hi)
    if not weights or span is None:
        return []
    score = _combine(list(weights.values()))
    top_family = max(weights, key=lambda f: weights[f])
    return [Finding("injection", "INJECTION", top_family, span[0], span[1], score,
                    signals=tuple(signals))]  # fmt: skip


def _learned(classifier: InjectionClassifier, norm_text: str, top: _Match | None,
             raw: str = "") -> tuple[float, tuple[int, int]] | None:  # fmt: skip
    """The classifier's best probability over the text's windows (plus the window around the
    strongest heuristic match, when there is one) and that window's span in ``norm_text``.

    ``raw``: the text as given. A window that is the whole text, which normalising only
    lowercased, is read as given: the embedding model is uncased (the same vector), and the
    shared embedder's cache then serves the LLM handler's recall of the same task."""
    picked = windows(norm_text)
    if top is not None and len(norm_text) > len(picked[0] if picked else ""):
        lo = max(0, top.start - 120)
        around = norm_text[lo : top.end + 120]
        if around not in picked:
            picked = [around, *picked[:1]]
    as_given = raw if raw.lower() == norm_text else None
    result = classifier.score([as_given if as_given and w == norm_text else w for w in picked])
    if result is None:
        return None
    p, best = result
    lo = max(norm_text.find(picked[best]), 0)
    return p, (lo, min(lo + len(picked[best]), len(norm_text)))


def needs_classifier(text: str, checkpoint: Checkpoint, found: list[Finding],
                     threshold: float) -> bool:  # fmt: skip
    """Whether :func:`detect_injection` with a classifier would consult it on ``text``, given
    the heuristics' ``found`` (a pre-screen cannot vouch for a text the classifier reads)."""
    if checkpoint not in _LEARNED_AT or not text.strip():
        return False
    if found and found[0].score >= threshold:
        return False
    norm = normalize(text)
    return bool(windows(norm.text)) or bool(found)
