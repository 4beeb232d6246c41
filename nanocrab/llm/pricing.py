"""What a model call cost, in US dollars, from the token counts the provider reported.

Prices are USD per million tokens from Anthropic's public price list (checked again 2026-11:
Opus 4.5/4.6 $5/$25, Sonnet 4.x $3/$15, Haiku 4.5 $1/$5 — all matched by the family prefixes
below; Sonnet 5's launch rate was reported lower, introductory, by third parties only, so it
is priced at the Sonnet family rate until the official list says otherwise). The
Messages API reports ``input_tokens`` *excluding* cached tokens, so the four counts are priced
separately and simply added. Not modelled: the 1-hour cache-write rate (all cache writes are
priced at the 5-minute rate, 1.25x input), the long-context premium some models charge above
200k input tokens, batch discounts and server-tool fees. A model this table does not know
(no Claude family in its name, e.g. the scripted or replay models) costs 0.0: an unknown price
is reported as free rather than guessed, so usage reports stay honest about what they know.
"""

from __future__ import annotations

import msgspec

from nanocrab.events import Usage


class Price(msgspec.Struct, frozen=True, kw_only=True):
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float


OPUS = Price(input=5.0, output=25.0, cache_read=0.50, cache_write=6.25)  # Opus 4.5 and later
OPUS_LEGACY = Price(input=15.0, output=75.0, cache_read=1.50, cache_write=18.75)  # Opus 3, 4, 4.1
SONNET = Price(input=3.0, output=15.0, cache_read=0.30, cache_write=3.75)  # Sonnet 3.7, 4, 4.5
HAIKU = Price(input=1.0, output=5.0, cache_read=0.10, cache_write=1.25)  # Haiku 4.5
HAIKU_3_5 = Price(input=0.80, output=4.0, cache_read=0.08, cache_write=1.0)
HAIKU_3 = Price(input=0.25, output=1.25, cache_read=0.03, cache_write=0.30)

PRICES: tuple[tuple[str, Price], ...] = (
    ("claude-opus-4-0", OPUS_LEGACY),
    ("claude-opus-4-1", OPUS_LEGACY),
    ("claude-opus-4-2025", OPUS_LEGACY),
    ("claude-3-opus", OPUS_LEGACY),
    ("claude-3-5-haiku", HAIKU_3_5),
    ("claude-3-haiku", HAIKU_3),
    ("claude-3-5-sonnet", SONNET),
    ("claude-3-7-sonnet", SONNET),
    ("claude-opus", OPUS),
    ("claude-sonnet", SONNET),
    ("claude-haiku", HAIKU),
)
"""Model-name prefixes, most specific first; the first that matches wins. A version newer than
the table (``claude-sonnet-5``) is priced at its family's latest known rate."""


def price_for(model: str, table: tuple[tuple[str, Price], ...] = PRICES) -> Price | None:
    """The price of ``model``, or ``None`` when no prefix in ``table`` matches it."""
    for prefix, price in table:
        if model.startswith(prefix):
            return price
    return None


def cost_usd(model: str, usage: Usage, table: tuple[tuple[str, Price], ...] = PRICES) -> float:
    """The cost of one call; 0.0 for a model the table does not know (see the module docstring)."""
    price = price_for(model, table)
    if price is None:
        return 0.0
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_write_tokens * price.cache_write
    ) / 1_000_000
