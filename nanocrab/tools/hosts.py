"""Host allow-lists for network tools: exact hosts and ``*.example.com`` suffix patterns.

Hosts are compared in one normal form: lower case, IDNA (punycode) for non-ASCII labels, no
trailing dot, no port, IPv6 without brackets.
"""

from __future__ import annotations

from collections.abc import Iterable


def normalise_host(host: str) -> str:
    """``host`` in normal form. Raises ``ValueError`` for an empty or unencodable host."""
    h = host.strip()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            raise ValueError(f"malformed host {host!r}")
        return h[1:end].lower()
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    elif h.count(":") > 1:
        return h.lower()
    h = h.rstrip(".").lower()
    if not h:
        raise ValueError(f"empty host in {host!r}")
    try:
        return h.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"host {host!r} is not a valid domain name: {exc}") from exc


class HostAllowList:
    """Which hosts a tool may contact.

    ``example.com`` allows exactly that host; ``*.example.com`` allows every host below it
    (``a.example.com``, ``a.b.example.com``) but not ``example.com`` itself. Patterns are
    validated when the list is built (``ValueError`` names the bad one).
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        self._exact: set[str] = set()
        self._suffixes: list[str] = []
        for pattern in self.patterns:
            if pattern.startswith("*."):
                self._suffixes.append("." + normalise_host(pattern[2:]))
            elif "*" in pattern:
                raise ValueError(
                    f"allow-list pattern {pattern!r}: '*' is only allowed as a leading '*.' label"
                )
            else:
                self._exact.add(normalise_host(pattern))

    def allows(self, host: str) -> bool:
        """Whether ``host`` (any spelling) is on the list; malformed hosts are not."""
        try:
            h = normalise_host(host)
        except ValueError:
            return False
        return h in self._exact or any(h.endswith(s) for s in self._suffixes)
