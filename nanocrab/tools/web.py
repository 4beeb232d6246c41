"""The ``web_fetch`` tool: GET a URL on an allowed host and return it as text."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import ClassVar

import html2text
import httpx
from pydantic import Field

from nanocrab.events import WebFetchDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.hosts import HostAllowList

MAX_FETCH_BYTES = 5_000_000
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript")
_TEXT_SUFFIXES = ("+json", "+xml")


class WebFetchArgs(ToolArgs):
    url: str = Field(description="http:// or https:// URL to fetch.")
    max_bytes: int = Field(
        default=200_000,
        ge=1,
        le=MAX_FETCH_BYTES,
        description="Stop downloading after this many bytes of the body.",
    )


class WebFetchTool:
    """GETs ``url`` when its host is on the allow-list, following redirects only to allowed
    hosts (at most ``max_redirects``); when ``ctx.allowed_hosts`` is set (the hosts the call's
    grant covers), the URL and every redirect hop must be on it too. HTML becomes Markdown-ish
    text (html2text); other text types are returned as they are; binary types fail. The body is
    cut at ``max_bytes``. A host off the list is ``denied``, a non-2xx status ``failed``, a slow
    server ``timeout``.

    Pass ``client`` (owned by the caller) or ``transport`` to control HTTP, e.g. in tests.
    """

    name: ClassVar[str] = "web_fetch"
    group: ClassVar[str] = "web"
    description: ClassVar[str] = (
        "Fetch a web page or text resource over HTTP(S) from an allowed host and return it as "
        "text (HTML converted to Markdown). Only hosts on the runtime's allow-list can be reached."
    )
    args_model: ClassVar[type[ToolArgs]] = WebFetchArgs
    idempotent: ClassVar[bool] = False  # fetches over the network: not assumed repeatable

    def __init__(
        self,
        allow: Sequence[str] | HostAllowList = (),
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
        max_redirects: int = 5,
    ) -> None:
        self.allow = allow if isinstance(allow, HostAllowList) else HostAllowList(allow)
        self._client = client
        self._transport = transport
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects

    async def run(self, args: WebFetchArgs, ctx: ToolContext) -> ToolResult:
        url = self._check(args.url, ctx, what="URL")
        async with self._session() as client:
            for _ in range(self.max_redirects + 1):
                try:
                    async with client.stream("GET", url, follow_redirects=False) as response:
                        if response.has_redirect_location:
                            location = response.headers["location"]
                            url = self._check(location, ctx, base=url, what="redirect target")
                            continue
                        return await self._result(response, args.max_bytes)
                except httpx.TimeoutException as exc:
                    raise ToolError("timeout", f"Fetching {url} timed out ({exc!r}).") from exc
                except httpx.HTTPError as exc:
                    raise ToolError("failed", f"Could not fetch {url}: {exc!r}.") from exc
        raise ToolError(
            "failed", f"Too many redirects (more than {self.max_redirects}) from {args.url}."
        )

    def _check(
        self, raw: str, ctx: ToolContext, *, what: str, base: httpx.URL | None = None
    ) -> httpx.URL:
        """``raw`` (relative to ``base`` if given) as a URL this tool may fetch: on the tool's
        allow-list and, when the call's grant restricts hosts (``ctx.allowed_hosts``), on that."""
        try:
            url = base.join(raw) if base is not None else httpx.URL(raw)
        except httpx.InvalidURL as exc:
            raise ToolError("invalid_arguments", f"Invalid {what} {raw!r}: {exc}.") from exc
        if url.scheme not in ("http", "https"):
            raise ToolError(
                "invalid_arguments", f"Only http and https URLs can be fetched, not {raw!r}."
            )
        if not url.host:
            raise ToolError("invalid_arguments", f"The {what} {raw!r} has no host.")
        if not self.allow.allows(url.host):
            allowed = ", ".join(self.allow.patterns) or "none"
            raise ToolError(
                "denied",
                f"The {what} host {url.host!r} is not on the web allow-list (allowed: {allowed}). "
                f"Do not retry; ask the operator to add {url.host!r} (or a '*.' pattern covering "
                "it) to the web allow-list if it is needed.",
            )
        granted = ctx.allowed_hosts
        if granted is not None and not granted.allows(url.host):
            raise ToolError(
                "denied",
                f"The {what} host {url.host!r} is not among the hosts granted for this call "
                f"(granted: {', '.join(granted.patterns) or 'none'}); it was not fetched. Do not "
                f"retry; request {url.host!r} in a separate call if it is needed.",
            )
        return url

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._client is not None:
            yield self._client
            return
        async with httpx.AsyncClient(
            transport=self._transport, timeout=self.timeout_s, follow_redirects=False
        ) as client:
            yield client

    async def _result(self, response: httpx.Response, max_bytes: int) -> ToolResult:
        data, truncated = await _read_capped(response, max_bytes)
        media_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        details = WebFetchDetails(
            url=str(response.url), status=response.status_code, content_type=media_type,
            bytes=len(data), truncated=truncated,
        )  # fmt: skip
        text = _decode(data, response.charset_encoding)
        if not response.is_success:
            snippet = text[:500].strip()
            return ToolResult.error(
                "failed",
                f"HTTP {response.status_code} {response.reason_phrase} for {response.url}."
                + (f"\n\n{snippet}" if snippet else ""),
                details=details,
            )
        if media_type in _HTML_TYPES:
            text = _html_to_text(text, base_url=str(response.url))
        elif media_type and not _is_text(media_type):
            return ToolResult.error(
                "failed",
                f"{response.url} is {media_type} ({len(data)} bytes), not text; web_fetch "
                "returns text and HTML only.",
                details=details,
            )
        if truncated:
            text += f"\n\n[… cut at {max_bytes} bytes; pass a larger max_bytes to see more]"
        return ToolResult.text(text, details=details)


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    buf = bytearray()
    async for chunk in response.aiter_bytes():
        buf += chunk
        if len(buf) > max_bytes:
            return bytes(buf[:max_bytes]), True
    return bytes(buf), False


def _decode(data: bytes, charset: str | None) -> str:
    try:
        return data.decode(charset or "utf-8", errors="replace")
    except LookupError:
        return data.decode("utf-8", errors="replace")


def _is_text(media_type: str) -> bool:
    return media_type.startswith(_TEXT_TYPES) or media_type.endswith(_TEXT_SUFFIXES)


def _html_to_text(html: str, *, base_url: str) -> str:
    """Markdown-ish text; relative links made absolute so the model can fetch them."""
    converter = html2text.HTML2Text(baseurl=base_url)
    converter.body_width = 0
    converter.ignore_images = True
    return converter.handle(html).strip()
