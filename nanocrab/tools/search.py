"""The ``web_search`` tool: a query to a search provider's HTTP API, behind the web allow-list.

The provider is pluggable (:class:`SearchProvider`); :class:`BraveSearch` and
:class:`TavilySearch` speak two real APIs. The API key is the provider's, given by whoever
builds it (the CLI reads it from the environment); it goes into request headers only, never into
a tool result or an event.

The provider's API host is the call's network resource, exactly as a ``web_fetch`` URL's host
is: it must be on the tool's allow-list (``NANOCRAB_WEB_ALLOW``) and, when the call's grant
names hosts, among them; the policy decides ``web_search`` on that host (its ``hosts`` rules fit
``web_search`` as they fit ``web_fetch``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, Protocol

import httpx
import msgspec
from pydantic import Field

from nanocrab.events import WebSearchDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.hosts import HostAllowList

MAX_RESULTS = 20
_SNIPPET_CHARS = 400


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    """One result: where it is, what it is called, a short extract."""

    title: str
    url: str
    snippet: str = ""


class SearchProvider(Protocol):
    """A search API. ``endpoint`` is the URL it calls (its host is the call's resource);
    ``search`` sends one query with ``client`` and returns at most ``count`` hits. Raises
    ``httpx.HTTPError`` for transport failures and :class:`ToolError` for an answer it cannot
    use (``failed``)."""

    name: str
    endpoint: httpx.URL

    async def search(
        self, client: httpx.AsyncClient, query: str, count: int
    ) -> list[SearchHit]: ...


class BraveSearch:
    """Brave's Web Search API: ``GET <endpoint>?q=…&count=…`` with ``X-Subscription-Token``."""

    name = "brave"
    DEFAULT_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"

    def __init__(self, api_key: str, *, endpoint: str = DEFAULT_ENDPOINT) -> None:
        self._key = api_key
        self.endpoint = httpx.URL(endpoint)

    def __repr__(self) -> str:  # never the key
        return f"BraveSearch(endpoint={str(self.endpoint)!r})"

    async def search(self, client: httpx.AsyncClient, query: str, count: int) -> list[SearchHit]:
        response = await client.get(
            self.endpoint,
            params={"q": query, "count": count},
            headers={"Accept": "application/json", "X-Subscription-Token": self._key},
        )
        body = _json(response, self.name)
        web = body.get("web") if isinstance(body, dict) else None
        results = web.get("results", []) if isinstance(web, dict) else []
        return [
            SearchHit(title=str(r.get("title", "")), url=str(r["url"]),
                      snippet=str(r.get("description", "")))
            for r in results if isinstance(r, dict) and r.get("url")
        ][:count]  # fmt: skip


class TavilySearch:
    """Tavily's search API: ``POST <endpoint>`` with a JSON query and a bearer key."""

    name = "tavily"
    DEFAULT_ENDPOINT = "https://api.tavily.com/search"

    def __init__(self, api_key: str, *, endpoint: str = DEFAULT_ENDPOINT) -> None:
        self._key = api_key
        self.endpoint = httpx.URL(endpoint)

    def __repr__(self) -> str:  # never the key
        return f"TavilySearch(endpoint={str(self.endpoint)!r})"

    async def search(self, client: httpx.AsyncClient, query: str, count: int) -> list[SearchHit]:
        response = await client.post(
            self.endpoint,
            json={"query": query, "max_results": count},
            headers={"Authorization": f"Bearer {self._key}"},
        )
        body = _json(response, self.name)
        results = body.get("results", []) if isinstance(body, dict) else []
        return [
            SearchHit(title=str(r.get("title", "")), url=str(r["url"]),
                      snippet=str(r.get("content", "")))
            for r in results if isinstance(r, dict) and r.get("url")
        ][:count]  # fmt: skip


PROVIDERS: dict[str, type[BraveSearch] | type[TavilySearch]] = {
    "brave": BraveSearch,
    "tavily": TavilySearch,
}


def make_search_provider(name: str, api_key: str, *, endpoint: str | None = None) -> SearchProvider:
    """The provider called ``name`` (``brave``, ``tavily``); ``ValueError`` naming the known
    ones otherwise. ``endpoint`` overrides its API URL (a proxy, a test server)."""
    cls = PROVIDERS.get(name)
    if cls is None:
        raise ValueError(f"unknown search provider {name!r}: use {', '.join(sorted(PROVIDERS))}")
    return cls(api_key, endpoint=endpoint) if endpoint else cls(api_key)


def _json(response: httpx.Response, provider: str) -> Any:
    if not response.is_success:
        # the body may echo the request; a status and reason are enough for the model
        raise ToolError(
            "failed",
            f"The {provider} search API answered HTTP {response.status_code} "
            f"{response.reason_phrase}.",
        )
    try:
        return response.json()
    except ValueError as exc:
        raise ToolError("failed", f"The {provider} search API did not answer JSON.") from exc


class WebSearchArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=400, description="What to search the web for.")
    count: int = Field(default=5, ge=1, le=MAX_RESULTS, description="How many results to return.")


class WebSearchTool:
    """Sends ``query`` to ``provider`` when the provider's host is on the allow-list (and, when
    ``ctx.allowed_hosts`` is set, on it too); returns the hits as a numbered list of title, URL
    and snippet. A hit whose host ``web_fetch`` could not reach (off the allow-list) is marked so,
    so the model does not try. A host off a list is ``denied``, a transport failure ``failed``, a
    slow API ``timeout``. Pass ``client`` (owned by the caller) or ``transport`` to control HTTP.
    """

    name: ClassVar[str] = "web_search"
    group: ClassVar[str] = "web"
    description: ClassVar[str] = (
        "Search the web and return the top results (title, URL, snippet). Fetch a result with "
        "web_fetch when its host is allowed."
    )
    args_model: ClassVar[type[ToolArgs]] = WebSearchArgs
    idempotent: ClassVar[bool] = False  # a network call whose answer changes: not repeatable

    def __init__(
        self,
        provider: SearchProvider,
        allow: Sequence[str] | HostAllowList = (),
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 20.0,
    ) -> None:
        self.provider = provider
        self.allow = allow if isinstance(allow, HostAllowList) else HostAllowList(allow)
        self._client = client
        self._transport = transport
        self.timeout_s = timeout_s

    @property
    def host(self) -> str:
        """The provider's API host: the resource the policy decides a call on."""
        return self.provider.endpoint.host

    async def run(self, args: WebSearchArgs, ctx: ToolContext) -> ToolResult:
        self._check(ctx)
        async with self._session() as client:
            try:
                hits = await self.provider.search(client, args.query, args.count)
            except httpx.TimeoutException as exc:
                raise ToolError("timeout", f"The {self.provider.name} search timed out.") from exc
            except httpx.HTTPError as exc:
                raise ToolError(
                    "failed", f"Could not reach the {self.provider.name} search API: {exc!r}."
                ) from exc
        details = WebSearchDetails(
            provider=self.provider.name, host=self.host, query=args.query, results=len(hits),
            urls=[h.url for h in hits],
        )  # fmt: skip
        if not hits:
            return ToolResult.text(f"No results for {args.query!r}.", details=details)
        return ToolResult.text(self._render(args.query, hits), details=details)

    def _check(self, ctx: ToolContext) -> None:
        host = self.host
        if not self.allow.allows(host):
            raise ToolError(
                "denied",
                f"The search API host {host!r} is not on the web allow-list. Do not retry; ask "
                f"the operator to add {host!r} to the web allow-list to enable web_search.",
            )
        granted = ctx.allowed_hosts
        if granted is not None and not granted.allows(host):
            raise ToolError(
                "denied",
                f"The search API host {host!r} is not among the hosts granted for this call "
                f"(granted: {', '.join(granted.patterns) or 'none'}). Do not retry.",
            )

    def _render(self, query: str, hits: list[SearchHit]) -> str:
        lines = [f"Results for {query!r} ({self.provider.name}):"]
        for i, hit in enumerate(hits, 1):
            host = _host_of(hit.url)
            mark = "" if host and self.allow.allows(host) else " [not fetchable: host not allowed]"
            lines.append(f"{i}. {hit.title or '(untitled)'}\n   {hit.url}{mark}")
            snippet = " ".join(hit.snippet.split())
            if snippet:
                cut = snippet if len(snippet) <= _SNIPPET_CHARS else snippet[:_SNIPPET_CHARS] + "…"
                lines.append(f"   {cut}")
        return "\n".join(lines)

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._client is not None:
            yield self._client
            return
        async with httpx.AsyncClient(
            transport=self._transport, timeout=self.timeout_s, follow_redirects=False
        ) as client:
            yield client


def _host_of(url: str) -> str:
    """The host of an http(s) ``url``; empty for anything else."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return ""
    return parsed.host if parsed.scheme in ("http", "https") else ""
