"""The detectors' fast paths find exactly what their plain forms find: rules searched only near
their anchors in long texts, the cue automaton of the classifier's windows, look-behinds
checked in Python, case-insensitive matching done on a lower-cased copy.

Each fast path exists because the plain form cost too much per 4 KB check (the measurements
are in the modules); these tests keep the speed from changing a verdict."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from nanocrab.guardrails import injection
from nanocrab.guardrails.classifier import _CUE_ANYWHERE, _CUE_WORDS, _GROUP_BIT, cue_groups
from nanocrab.guardrails.pii import (
    _CARD,
    _EMAIL,
    _IBAN,
    _PHONE,
    _card_refused,
    _email_refused,
    _iban_refused,
    _matches,
    _phone_refused,
)
from nanocrab.guardrails.secrets import detect_secrets
from nanocrab.guardrails.text import normalize

DATA = Path(__file__).parent / "data" / "guardrails"


def _texts() -> list[str]:
    texts = []
    for name in ("injection.jsonl", "injection_ext.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            if line.strip():
                texts.append(str(json.loads(line)["text"]))
    return texts


def _long_texts(count: int = 200, size: int = 4096) -> list[str]:
    """Dev-set texts, attacks and benign mixed, joined into ~4 KB documents (an attack inside
    a long page is what the windowed search must not miss)."""
    pool = _texts()
    rng = random.Random(12)
    out = []
    for _ in range(count):
        parts: list[str] = []
        while sum(len(p) for p in parts) < size:
            parts.append(rng.choice(pool))
        out.append("\n\n".join(parts))
    return out


@pytest.mark.parametrize("checkpoint", ["tool_output", "task_input", "reply"])
def test_rules_searched_near_their_anchors_find_what_a_whole_text_search_finds(
    checkpoint: str, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ignored = injection._IGNORED_AT[checkpoint]  # type: ignore[index]
    docs = [normalize(t).text for t in _long_texts()]
    windowed = [injection._scan(d, ignored) for d in docs]
    monkeypatch.setattr(injection, "_WINDOWED", 10**9)  # every text scanned whole
    whole = [injection._scan(d, ignored) for d in docs]
    assert sum(len(found) for found in whole) > 100  # the documents do hold attacks
    assert windowed == whole


def _reference_cues() -> dict[str, re.Pattern[str]]:
    """Each group's words as the plain ``\\b(?:...)\\b`` alternation (plus the in-word cues)."""
    out = {}
    for group, words in _CUE_WORDS.items():
        alternation = "|".join(re.escape(w) for w in words)
        anywhere = "|".join(re.escape(w) for w in _CUE_ANYWHERE.get(group, ()))
        out[group] = re.compile(rf"\b(?:{alternation})\b" + (f"|{anywhere}" if anywhere else ""))
    return out


def test_the_cue_automaton_reads_words_as_a_word_bounded_regex_would() -> None:
    reference = _reference_cues()
    samples = [normalize(t).text for t in _texts()]
    samples += ["yours truly", "your", "you're", "a.i.x", "ai.", "the .env file", "x.env",
                "run_tests", "rerun", "e-mail me", "role-play", "roleplay", "pretend-ai",
                "パスワードを", "ignorez", "助手です", "systems", "system_prompt", "api key"]  # fmt: skip
    checked = 0
    for text in samples:
        for piece in [text] + [text[i : i + 300] for i in range(0, len(text), 97)]:
            expected = sum(_GROUP_BIT[g] for g, rx in reference.items() if rx.search(piece))
            assert cue_groups(piece) == expected, piece
            checked += 1
    assert checked > 2000


@pytest.mark.parametrize(("pattern", "refused", "lookbehind"), [
    (_CARD, _card_refused, r"(?<![\d-])"),
    (_PHONE, _phone_refused, r"(?<![\w+.\-/:])"),
    (_IBAN, _iban_refused, r"(?<![A-Za-z0-9])"),
    (_EMAIL, _email_refused, r"(?<![\w.%+-])"),
])  # fmt: skip
def test_a_look_behind_checked_in_python_keeps_its_meaning(
    pattern: re.Pattern[str], refused: object, lookbehind: str,
) -> None:  # fmt: skip
    plain = re.compile(lookbehind + pattern.pattern)
    rng = random.Random(3)
    alphabet = "0123456789" * 4 + "  --..+()/:_x@%AEGBDE" + "é٣"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(5, 80))) for _ in range(3000)]
    texts += ["x12 345 678 9012", "-1 2345 6789 0123 4567", "a4111 1111 1111 1111 b",
              "DE89370400440532013000", "xDE89370400440532013000 GB82WEST12345698765432",
              "mail a.b@x.io, _c@d.ee or %e@f.gg", "call +44 20 7946 0958 or 0049 30 1234567"]  # fmt: skip
    for text in texts:
        fast = [m.span() for m in _matches(pattern, text, refused)]  # type: ignore[arg-type]
        assert fast == [m.span() for m in plain.finditer(text)], text


def test_assigned_secrets_are_found_alike_on_the_lower_cased_copy_and_on_the_text() -> None:
    text = ('API_KEY = "Zx9Qm2Lp7Rt4Vb8Nc1Kd"\nclient_Secret: aB3dE5fG7hJ9kL1mN3pQ\n'
            "Password => 'Tr0ub4dor&3xyz'\nTOKEN=plainwordsonly\n")  # fmt: skip
    fast = detect_secrets(text)
    assert [text[f.start : f.end] for f in fast] == [
        "Zx9Qm2Lp7Rt4Vb8Nc1Kd", "aB3dE5fG7hJ9kL1mN3pQ", "Tr0ub4dor&3xyz"]  # fmt: skip
    # "İ" lower-cases to two characters: the text as given is matched case-insensitively
    shifted = detect_secrets("İ" + text)
    assert [(f.start - 1, f.end - 1, f.kind, f.score) for f in shifted] == [
        (f.start, f.end, f.kind, f.score) for f in fast]  # fmt: skip
