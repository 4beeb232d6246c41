"""web_fetch against respx-mocked HTTP: the allow-list, redirects, HTML to text, failures."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import respx

from nanocrab.events import TextBlock, WebFetchDetails
from nanocrab.tools import (
    HostAllowList,
    ToolContext,
    ToolRegistry,
    ToolResult,
    WebFetchTool,
    normalise_host,
)
from tests.test_tools_support import make_ctx


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def fetch(
    ctx: ToolContext, url: str, allow: list[str] | None = None, **arguments: object
) -> ToolResult:
    registry = ToolRegistry([WebFetchTool(allow if allow is not None else ["example.com"])])
    return await registry.invoke("web_fetch", {"url": url, **arguments}, ctx)


@respx.mock
async def test_fetches_text_from_an_allowed_host(ctx: ToolContext) -> None:
    respx.get("https://example.com/notes.txt").respond(
        200, text="plain notes\n", headers={"content-type": "text/plain; charset=utf-8"}
    )
    result = await fetch(ctx, "https://example.com/notes.txt")
    assert not result.is_error
    assert text_of(result) == "plain notes\n"
    assert result.details == WebFetchDetails(
        url="https://example.com/notes.txt", status=200, content_type="text/plain", bytes=12
    )


@respx.mock
async def test_html_becomes_text(ctx: ToolContext) -> None:
    html = (
        "<html><head><title>T</title><style>p {color: red}</style></head><body>"
        "<h1>Welcome</h1><p>Hello <b>world</b>, see <a href='/docs'>the docs</a>.</p>"
        "<img src='x.png' alt='pic'></body></html>"
    )
    respx.get("https://example.com/").respond(200, html=html)
    text = text_of(await fetch(ctx, "https://example.com/"))
    assert "# Welcome" in text
    assert "Hello **world**" in text
    assert "[the docs](https://example.com/docs)" in text
    assert "<p>" not in text and "color: red" not in text and "x.png" not in text


async def test_host_off_the_list_is_denied_without_a_request(ctx: ToolContext) -> None:
    with respx.mock(assert_all_called=False) as router:
        route = router.get("https://evil.test/").respond(200, text="should not be fetched")
        result = await fetch(ctx, "https://evil.test/")
    assert result.error_kind == "denied"
    assert "'evil.test'" in text_of(result) and "allow-list" in text_of(result)
    assert not route.called


@pytest.mark.parametrize(
    ("allow", "url", "allowed"),
    [
        (["*.example.com"], "https://docs.example.com/", True),
        (["*.example.com"], "https://a.b.example.com/", True),
        (["*.example.com"], "https://example.com/", False),
        (["*.example.com"], "https://evilexample.com/", False),
        (["example.com"], "https://EXAMPLE.com:8443/x", True),
        (["example.com"], "https://example.com.evil.test/", False),
        (["Example.COM:443"], "http://example.com./", True),
        (["bücher.de"], "https://xn--bcher-kva.de/", True),
        (["xn--bcher-kva.de"], "https://BÜCHER.de/", True),
        ([], "https://example.com/", False),
    ],
)
async def test_allow_list_matching(
    ctx: ToolContext, allow: list[str], url: str, allowed: bool
) -> None:
    with respx.mock(assert_all_called=False) as router:
        router.get(url=httpx.URL(url)).respond(200, text="ok")
        result = await fetch(ctx, url, allow=allow)
    assert (result.error_kind != "denied") is allowed, result
    if allowed:
        assert text_of(result) == "ok"


def test_normalise_host() -> None:
    assert normalise_host("WWW.Example.COM.:8080") == "www.example.com"
    assert normalise_host("[::1]:80") == "::1"
    assert normalise_host("Bücher.de") == "xn--bcher-kva.de"


@pytest.mark.parametrize("pattern", ["ex*ample.com", "*example.com", "", "a..b"])
def test_bad_allow_list_patterns_are_rejected_at_construction(pattern: str) -> None:
    with pytest.raises(ValueError):
        HostAllowList([pattern])


async def test_redirect_to_an_allowed_host_is_followed(ctx: ToolContext) -> None:
    with respx.mock() as router:
        router.get("https://example.com/old").respond(301, headers={"location": "/new"})
        router.get("https://example.com/new").respond(
            302, headers={"location": "https://cdn.example.org/final"}
        )
        router.get("https://cdn.example.org/final").respond(200, text="arrived")
        result = await fetch(ctx, "https://example.com/old", allow=["example.com", "*.example.org"])
    assert text_of(result) == "arrived"
    assert isinstance(result.details, WebFetchDetails)
    assert result.details.url == "https://cdn.example.org/final"


async def test_redirect_to_a_disallowed_host_is_denied(ctx: ToolContext) -> None:
    with respx.mock(assert_all_called=False) as router:
        router.get("https://example.com/go").respond(
            302, headers={"location": "https://evil.test/x"}
        )
        evil = router.get("https://evil.test/x").respond(200, text="stolen")
        result = await fetch(ctx, "https://example.com/go")
    assert result.error_kind == "denied"
    assert "redirect target" in text_of(result) and "'evil.test'" in text_of(result)
    assert not evil.called


@respx.mock
async def test_redirect_loop_stops(ctx: ToolContext) -> None:
    respx.get("https://example.com/loop").respond(302, headers={"location": "/loop"})
    result = await fetch(ctx, "https://example.com/loop")
    assert result.error_kind == "failed" and "Too many redirects" in text_of(result)


@respx.mock
async def test_non_2xx_is_failed(ctx: ToolContext) -> None:
    respx.get("https://example.com/missing").respond(404, text="no such page")
    result = await fetch(ctx, "https://example.com/missing")
    assert result.error_kind == "failed"
    assert text_of(result).startswith("HTTP 404 Not Found") and "no such page" in text_of(result)
    assert isinstance(result.details, WebFetchDetails) and result.details.status == 404


@respx.mock
async def test_body_is_cut_at_max_bytes(ctx: ToolContext) -> None:
    respx.get("https://example.com/big").respond(200, text="a" * 5000)
    result = await fetch(ctx, "https://example.com/big", max_bytes=100)
    assert text_of(result).startswith("a" * 100 + "\n\n[… cut at 100 bytes")
    assert result.details == WebFetchDetails(
        url="https://example.com/big", status=200, content_type="text/plain", bytes=100,
        truncated=True,
    )  # fmt: skip


@respx.mock
async def test_binary_content_is_refused(ctx: ToolContext) -> None:
    respx.get("https://example.com/logo.png").respond(
        200, content=b"\x89PNG\r\n", headers={"content-type": "image/png"}
    )
    result = await fetch(ctx, "https://example.com/logo.png")
    assert result.error_kind == "failed" and "image/png" in text_of(result)


@respx.mock
async def test_json_is_returned_as_text(ctx: ToolContext) -> None:
    respx.get("https://example.com/api").respond(200, json={"ok": True})
    assert text_of(await fetch(ctx, "https://example.com/api")) == '{"ok":true}'


@respx.mock
async def test_transport_errors_are_typed(ctx: ToolContext) -> None:
    respx.get("https://example.com/slow").mock(side_effect=httpx.ConnectTimeout("slow"))
    respx.get("https://example.com/down").mock(side_effect=httpx.ConnectError("refused"))
    assert (await fetch(ctx, "https://example.com/slow")).error_kind == "timeout"
    down = await fetch(ctx, "https://example.com/down")
    assert down.error_kind == "failed" and "refused" in text_of(down)


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/x", "example.com", "http://"]
)
async def test_only_http_urls(ctx: ToolContext, url: str) -> None:
    assert (await fetch(ctx, url)).error_kind == "invalid_arguments"


async def test_caller_supplied_client_never_follows_redirects_itself(ctx: ToolContext) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "example.com":
            return httpx.Response(302, headers={"location": "https://evil.test/"})
        return httpx.Response(200, text="stolen")

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(handler), follow_redirects=True
    ) as client:
        tool = WebFetchTool(["example.com"], client=client)
        result = await ToolRegistry([tool]).invoke(
            "web_fetch", {"url": "https://example.com/"}, ctx
        )
    assert result.error_kind == "denied"
