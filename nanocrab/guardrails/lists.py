"""Allow and deny lists: keywords, regular expressions, topics and domains.

A *deny list* fires on what it names: a keyword (whole words, case-insensitive), a regular
expression, any keyword of a named topic, or a domain — in a URL, in an e-mail address or bare
in the text, subdomains included (``example.com`` covers ``api.example.com``; a leading ``*.``
means subdomains only). An *allow list* fires on what it does not name: each URL whose host is
outside ``domains``, and — when it lists keywords, regexes or topics — a text that mentions
none of them (an off-topic request).

Lists are compiled once when the configuration loads (:class:`CompiledList`), so a check is a
handful of regex scans.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from nanocrab.guardrails.model import Finding

_URL = re.compile(r"(?i)\b(?:[a-z][a-z0-9+.\-]*://|www\.)[^\s<>\"'`)\]}]+")


def _domain_pattern(domains: Sequence[str]) -> re.Pattern[str] | None:
    if not domains:
        return None
    parts = []
    for domain in domains:
        d = domain.lower().strip(".")
        if d.startswith("*."):
            parts.append(r"(?:[a-z0-9-]+\.)+" + re.escape(d[2:]))
        else:
            parts.append(r"(?:[a-z0-9-]+\.)*" + re.escape(d))
    return re.compile(r"(?i)(?<![a-z0-9.-])(?:" + "|".join(parts) + r")(?![a-z0-9-]|\.[a-z0-9])")


def host_allowed(host: str, domains: Sequence[str]) -> bool:
    """Whether ``host`` is one of ``domains`` or a subdomain (``*.x`` means subdomains only)."""
    host = host.lower().rstrip(".")
    for domain in domains:
        d = domain.lower().strip(".")
        if d.startswith("*."):
            if host.endswith("." + d[2:]):
                return True
        elif host == d or host.endswith("." + d):
            return True
    return False


def url_hosts(text: str) -> Iterator[tuple[str, int, int]]:
    """``(host, start, end)`` for each URL in ``text`` (``www.`` links included)."""
    for m in _URL.finditer(text):
        raw = m.group(0).rstrip(".,;:!?")
        url = raw if "://" in raw else "http://" + raw
        try:
            host = urlsplit(url).hostname
        except ValueError:
            continue
        if host:
            yield host, m.start(), m.start() + len(raw)


@dataclass(frozen=True, slots=True)
class CompiledList:
    """A compiled allow or deny list (see the module docstring for the semantics)."""

    mode: str  # "deny" | "allow"
    keywords: re.Pattern[str] | None
    regexes: tuple[re.Pattern[str], ...]
    topics: tuple[tuple[str, re.Pattern[str]], ...]
    domains: tuple[str, ...]
    domain_pattern: re.Pattern[str] | None

    @classmethod
    def build(cls, mode: str, *, keywords: Sequence[str] = (), regexes: Sequence[str] = (),
              topics: Mapping[str, Sequence[str]] | None = None, domains: Sequence[str] = (),
              ) -> CompiledList:  # fmt: skip
        """Compile a list; raises ``re.error`` for an invalid regular expression."""
        return cls(
            mode=mode,
            keywords=_words(keywords),
            regexes=tuple(re.compile(rx) for rx in regexes),
            topics=_topics(topics or {}),
            domains=tuple(domains),
            domain_pattern=_domain_pattern(domains),
        )

    def detect(self, text: str) -> list[Finding]:
        """Findings for ``text``: in a deny list, each listed thing found (score 1.0); in an
        allow list, each URL outside the domains and, if any content entries are listed, one
        whole-text finding when none of them occurs."""
        return self._deny(text) if self.mode == "deny" else self._allow(text)

    def _deny(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        if self.keywords is not None:
            found += [Finding("deny_list", "DENY_KEYWORD", "keyword", m.start(), m.end(), 1.0)
                      for m in self.keywords.finditer(text)]  # fmt: skip
        for rx in self.regexes:
            found += [Finding("deny_list", "DENY_REGEX", "regex", m.start(), m.end(), 1.0)
                      for m in rx.finditer(text) if m.end() > m.start()]  # fmt: skip
        for name, pattern in self.topics:
            found += [Finding("deny_list", "DENY_TOPIC", name, m.start(), m.end(), 1.0)
                      for m in pattern.finditer(text)]  # fmt: skip
        if self.domain_pattern is not None:
            found += [Finding("deny_list", "DENY_DOMAIN", "domain", m.start(), m.end(), 1.0)
                      for m in self.domain_pattern.finditer(text)]  # fmt: skip
        return sorted(found, key=lambda f: f.start)

    def _allow(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        if self.domains:
            found += [Finding("allow_list", "OFF_LIST_DOMAIN", "domain", start, end, 1.0)
                      for host, start, end in url_hosts(text)
                      if not host_allowed(host, self.domains)]  # fmt: skip
        content = [p for p in (self.keywords, *self.regexes) if p is not None]
        content += [p for _, p in self.topics]
        if content and text.strip() and not any(p.search(text) for p in content):
            found.append(Finding("allow_list", "OFF_TOPIC", "topic", 0, len(text), 1.0))
        return found


def _topics(topics: Mapping[str, Sequence[str]]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    compiled = ((name, _words(words)) for name, words in topics.items())
    return tuple((name, p) for name, p in compiled if p is not None)


def _words(words: Sequence[str]) -> re.Pattern[str] | None:
    if not words:
        return None
    alternation = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(rf"(?i)(?<!\w)(?:{alternation})(?!\w)")
