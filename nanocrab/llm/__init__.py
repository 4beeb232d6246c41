"""Model providers: the contract (:mod:`nanocrab.llm.base`) and its three implementations.

* ``anthropic`` — the real Messages API, streaming (:class:`AnthropicProvider`);
* ``scripted`` — a deterministic offline model from a YAML script (:class:`ScriptedProvider`);
* ``replay`` — a past run's recorded responses (:class:`ReplayProvider`).

:func:`make_provider` builds one by name, for configuration files and the CLI.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanocrab.llm.base import (
    DEFAULT_MODEL,
    DeltaSink,
    LlmConfigError,
    LlmError,
    LlmErrorKind,
    Message,
    ModelRequest,
    ModelResponse,
    Provider,
    ToolSpec,
)
from nanocrab.llm.pricing import Price, cost_usd, price_for
from nanocrab.llm.replay import ReplayProvider
from nanocrab.llm.scripted import Script, ScriptedProvider

if TYPE_CHECKING:
    from nanocrab.llm.anthropic import AnthropicProvider

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
CAPGEN_SCRIPT = SCRIPTS_DIR / "capgen.yaml"
"""The offline model's answers for capability generation (``nanocrab capabilities generate``)."""

__all__ = [
    "CAPGEN_SCRIPT",
    "DEFAULT_MODEL",
    "PROVIDERS",
    "SCRIPTS_DIR",
    "AnthropicProvider",
    "DeltaSink",
    "LlmConfigError",
    "LlmError",
    "LlmErrorKind",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "Price",
    "Provider",
    "ReplayProvider",
    "Script",
    "ScriptedProvider",
    "ToolSpec",
    "cost_usd",
    "make_provider",
    "price_for",
]


def _scripted(
    *,
    script: str | Path | None = None,
    text: str | None = None,
    scripts: list[Script] | None = None,
) -> ScriptedProvider:
    """Exactly one of ``script`` (a YAML file), ``text`` (YAML text) or ``scripts``."""
    given = [name for name, v in (("script", script), ("text", text), ("scripts", scripts)) if v]
    if len(given) != 1:
        raise LlmConfigError(
            "the scripted provider needs exactly one of script=PATH, text=YAML or scripts=[...]"
            + (f"; got {', '.join(given)}" if given else "")
        )
    if script:
        return ScriptedProvider.from_yaml(script)
    if text:
        return ScriptedProvider.from_text(text)
    return ScriptedProvider(scripts or [])


class _Lazy:
    """A factory imported on first use: the Anthropic SDK alone takes over a second to import,
    and most commands (``--help``, the offline model, replay) never need it. Its signature is
    the real factory's, so :func:`make_provider` still checks options against it."""

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr

    def load(self) -> Callable[..., Provider]:
        factory: Callable[..., Provider] = getattr(importlib.import_module(self.module), self.attr)
        return factory

    def __call__(self, **options: Any) -> Provider:
        return self.load()(**options)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.load())


def __getattr__(name: str) -> Any:
    if name == "AnthropicProvider":
        from nanocrab.llm.anthropic import AnthropicProvider

        return AnthropicProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PROVIDERS: dict[str, Callable[..., Provider]] = {
    "anthropic": _Lazy("nanocrab.llm.anthropic", "AnthropicProvider"),
    "scripted": _scripted,
    "replay": ReplayProvider,
}
"""Provider factories by name; their keyword arguments are the options :func:`make_provider`
accepts (``anthropic``: api_key, base_url, model, max_tokens, client; ``scripted``: script, text
or scripts; ``replay``: responses)."""


def make_provider(name: str, **options: Any) -> Provider:
    """Build the provider called ``name`` with ``options``.

    Raises :class:`LlmConfigError` for an unknown name, an option the provider does not take, or
    configuration the provider rejects, with a message that lists what is accepted.
    """
    factory = PROVIDERS.get(name)
    if factory is None:
        raise LlmConfigError(
            f"unknown model provider {name!r}; choose one of {', '.join(sorted(PROVIDERS))}"
        )
    signature = inspect.signature(factory)
    try:
        signature.bind(**options)
    except TypeError as exc:
        accepted = ", ".join(signature.parameters) or "none"
        raise LlmConfigError(
            f"bad options for the {name!r} provider: {exc}; it accepts: {accepted}"
        ) from exc
    return factory(**options)
