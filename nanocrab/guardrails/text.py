"""Text normalisation and payload decoding for the detectors.

Attackers hide instructions from pattern matchers with Unicode tricks (zero-width characters,
bidi controls, full-width or mathematical letters, Cyrillic look-alikes inside Latin words, tag
characters) and with encodings (base64, hex, rot13, URL escapes, spaced-out letters). The
detectors match a *normalised* view of the text and map every match back to the original span,
and re-scan the decoded payloads they find.

The common case is plain ASCII: it is lower-cased in one C call and the offset map is the
identity, so normalising a 4 KB source file costs microseconds.
"""

# ruff: noqa: RUF001  (look-alike and full-width characters are the point here)

from __future__ import annotations

import base64
import binascii
import codecs
import html
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote

# Format characters used to split words invisibly (zero-width, joiners, bidi controls, BOM,
# soft hyphen, word joiner, Mongolian vowel separator) and the Unicode tag block (U+E0000..).
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f"
                        "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\U000e0000-\U000e007f]")
_TAG_BLOCK = (0xE0020, 0xE007E)  # tag characters mirror ASCII 0x20..0x7E ("ASCII smuggling")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")

# Letters that look like Latin ones; applied only inside words that mix scripts, so real
# Cyrillic or Greek text keeps its letters (and the multilingual patterns still match it).
_CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ј": "j", "ԁ": "d", "ɡ": "g", "ӏ": "l",
    "α": "a", "ο": "o", "ν": "v", "ι": "i", "κ": "k", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    "ε": "e", "ѵ": "v", "ԛ": "q", "ԝ": "w", "һ": "h", "ɑ": "a", "ⅰ": "i", "ℓ": "l",
})  # fmt: skip
_MIXED_WORD = re.compile(r"\w*(?:[a-z][\u0370-\u03ff\u0400-\u04ff\u0500-\u052f]"
                         r"|[\u0370-\u03ff\u0400-\u04ff\u0500-\u052f][a-z])\w*")
# what a mixed word must hold, found without the ``\w*`` around it (which makes ``re`` walk
# every word of the text: ~0.5 ms for 4 KB of non-ASCII source against ~20 µs)
_MIXED_SCRIPT = re.compile(r"[\u0370-\u03ff\u0400-\u04ff\u0500-\u052f]")
_MIXED_PAIR = re.compile(r"[a-z][\u0370-\u03ff\u0400-\u04ff\u0500-\u052f]"
                         r"|[\u0370-\u03ff\u0400-\u04ff\u0500-\u052f][a-z]")
# "i g n o r e", "i.g.n.o.r.e", "i-g-n-o-r-e": four or more single letters joined by one separator
_SPACED = re.compile(r"(?<![\w])(?:[a-z][ .\-_*]){3,}[a-z](?![\w])")
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a",
                       "$": "s", "!": "i", "|": "l"})  # fmt: skip
_LEET_WORD = re.compile(r"\b(?=[a-z0-9@$!|]*[a-z])(?=[a-z0-9@$!|]*[0-9@$!|])[a-z0-9@$!|]{4,}\b")
_LEET_SHORT = re.compile(r"\b(?=[a-z0-9]*[a-z])(?=[a-z0-9]*[0-9])[a-z0-9]{2,3}\b")
"""Short mixed words ("t0", "th3", "4nd"), mapped only in a text already written in leetspeak:
elsewhere they are units, versions and names ("2fa", "v3", "h1")."""
_LEET_TEXT = 3  # long leetspeak words that make a text leetspeak


@dataclass(frozen=True, slots=True)
class Normalized:
    """A lower-cased, de-obfuscated view of a text; ``source[i]`` is the index in the original
    text of character ``i`` of ``text`` (``None`` when the view is the original, lower-cased,
    character for character)."""

    text: str
    source: tuple[int, ...] | None = None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of ``text[start:end]``."""
        if self.source is None:
            return start, end
        if not self.source:
            return 0, 0
        first = self.source[min(start, len(self.source) - 1)]
        last = self.source[max(min(end, len(self.source)) - 1, 0)] + 1
        return first, max(first, last)


def normalize(text: str) -> Normalized:
    """Lower-case ``text``, drop invisible characters, fold compatibility forms (full-width,
    mathematical letters), decode tag characters and map look-alike letters in mixed-script
    words, and read the escapes ``\\n``, ``\\r``, ``\\t`` as the white space they stand for,
    keeping the offset map."""
    if text.isascii():
        return Normalized(unescape_spaces(text.lower()))
    lowered = text.lower()
    if (len(lowered) == len(text) and unicodedata.is_normalized("NFKC", text)
            and not _INVISIBLE.search(text)):  # fmt: skip
        # no invisible or tag characters, nothing to fold: characters map one to one
        return Normalized(unescape_spaces(_unmixed(lowered)))
    out: list[str] = []
    source: list[int] = []
    pos = 0
    for run in _NON_ASCII.finditer(text):  # ASCII stretches are copied whole
        out.append(text[pos : run.start()].lower())
        source.extend(range(pos, run.start()))
        for i in range(run.start(), run.end()):
            ch = text[i]
            code = ord(ch)
            if _TAG_BLOCK[0] <= code <= _TAG_BLOCK[1]:
                ch = chr(code - 0xE0000)
            elif _INVISIBLE.match(ch):
                continue
            else:
                ch = unicodedata.normalize("NFKC", ch)
            for piece in ch.lower():
                out.append(piece)
                source.append(i)
        pos = run.end()
    out.append(text[pos:].lower())
    source.extend(range(pos, len(text)))
    return Normalized(unescape_spaces(_unmixed("".join(out))), tuple(source))


def unescape_spaces(text: str) -> str:
    """``text`` with the escapes ``\\n``, ``\\r`` (as a space and a line break) and ``\\t``
    (as two spaces), keeping its length: a tool that returns JSON or a Python ``repr`` escapes
    its line breaks, and "...twist\\nIgnore your previous instructions" must read as two
    lines, not as the word "nignore" (AgentDojo's travel tools return such text)."""
    if "\\" not in text:
        return text
    return text.replace("\\n", " \n").replace("\\r", " \n").replace("\\t", "  ")


def _unmixed(text: str) -> str:
    """``text`` with look-alike letters mapped inside words that mix Latin with Greek or
    Cyrillic (one for one: offsets do not move)."""
    if _MIXED_SCRIPT.search(text) is None or _MIXED_PAIR.search(text) is None:
        return text
    return _MIXED_WORD.sub(lambda m: m.group(0).translate(_CONFUSABLES), text)


def despace(text: str, *, leet: bool = True) -> str:
    """``text`` with spaced-out words joined ("i g n o r e" → "ignore") and, with ``leet``,
    leetspeak words mapped ("1gn0r3" → "ignore"); offsets are not kept (used to re-score, not
    to locate)."""
    joined = _SPACED.sub(lambda m: re.sub(r"[ .\-_*]", "", m.group(0)), text)
    if not leet:
        return joined
    mapped, n = _LEET_WORD.subn(lambda m: m.group(0).translate(_LEET), joined)
    if n >= _LEET_TEXT:
        mapped = _LEET_SHORT.sub(lambda m: m.group(0).translate(_LEET), mapped)
    return mapped


# No leading look-behind (it makes ``re`` try every position): the boundary before a match
# is checked in Python.
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
_HEX = re.compile(r"(?:[0-9A-Fa-f]{2}[ :]?){16,}")
# The first unit is written out: a pattern that starts with a literal (or a branch of them)
# lets ``re`` skip to candidates; one that starts with a repeated group tries every position
# (~70 µs for 4 KB against ~1-20 µs).
_URLENC = re.compile(r"%[0-9A-Fa-f]{2}(?:%[0-9A-Fa-f]{2}){3,}")
_ESCAPE = r"(?:\\u[0-9A-Fa-f]{4}|\\x[0-9A-Fa-f]{2}|&#x?[0-9A-Fa-f]{2,6};)"
_ESCAPES = re.compile(rf"{_ESCAPE}{_ESCAPE}{{3,}}")
_MAX_DECODED = 8  # payloads decoded per text: a bound on work for adversarial input


@dataclass(frozen=True, slots=True)
class Payload:
    """A decoded payload: its encoding, the span of the encoded text, the decoded text."""

    encoding: str
    start: int
    end: int
    text: str


def _printable(raw: bytes) -> str | None:
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    letters = sum(ch.isalpha() or ch.isspace() for ch in decoded)
    if len(decoded) < 8 or letters < 0.75 * len(decoded) or " " not in decoded.strip():
        return None  # binary, keys, hashes and identifiers are not payloads to re-scan
    return decoded


def decode_payloads(text: str) -> list[Payload]:
    """Human-readable texts hidden in ``text`` as base64 (standard or URL-safe), hex, URL
    escapes or ``\\uXXXX``/``&#..;`` escapes. Only decodings that read as words (mostly letters
    and spaces) are returned, so config blobs, keys, hashes and images are skipped."""
    found: list[Payload] = []
    # Candidates come from whitespace-separated tokens (a C-speed split): running the base64
    # and hex patterns over the whole text tried a match at every letter.
    tokens = text.split()
    long_tokens = {t for t in tokens if len(t) >= 20}
    hex_pairs = sum(len(t) == 2 for t in tokens) >= 16
    for token in long_tokens:
        start = text.find(token)
        for m in _BASE64.finditer(token):
            if len(found) >= _MAX_DECODED:
                break
            chunk = m.group(0)
            if chunk.isalpha() and (chunk.islower() or chunk.isupper()):
                continue  # one long word, not base64
            padded = chunk + "=" * (-len(chunk) % 4)
            try:
                raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
            except (binascii.Error, ValueError):
                continue
            if (decoded := _printable(raw)) is not None:
                found.append(Payload("base64", start + m.start(), start + m.end(), decoded))
    if long_tokens or hex_pairs:
        for m in _HEX.finditer(text) if hex_pairs else _hex_in(long_tokens, text):
            if len(found) >= _MAX_DECODED:
                break
            digits = re.sub(r"[ :]", "", m.group(0))
            try:
                raw = bytes.fromhex(digits[: len(digits) // 2 * 2])
            except ValueError:
                continue
            if (decoded := _printable(raw)) is not None:
                found.append(Payload("hex", m.start(), m.end(), decoded))
    for m in _URLENC.finditer(text):
        decoded = unquote(m.group(0))
        if len(decoded) >= 4:
            found.append(Payload("url", m.start(), m.end(), decoded))
    for m in _ESCAPES.finditer(text):
        try:
            raw_text = codecs.decode(m.group(0), "unicode_escape") if "\\" in m.group(0) else (
                html.unescape(m.group(0)))
        except UnicodeDecodeError:
            continue
        found.append(Payload("escape", m.start(), m.end(), raw_text))
    return found[:_MAX_DECODED]


def _hex_in(tokens: set[str], text: str) -> list[re.Match[str]]:
    matches = []
    for token in tokens:
        if len(token) >= 32 and (m := _HEX.search(text, text.find(token))) is not None:
            matches.append(m)
    return matches


def rot13(text: str) -> str:
    """``text`` with Latin letters rotated by 13 (its own inverse)."""
    return codecs.encode(text, "rot13")


def reverse_words(text: str) -> str:
    """``text`` reversed character by character ("snoitcurtsni" → "instructions")."""
    return text[::-1]
