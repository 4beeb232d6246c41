"""Another page cannot act through the web view's cookie.

``SameSite=Strict`` does not tell ports apart: a page on another port of the gateway's host is
same-site, and the browser sends it the cookie. An adversarial pass had such a page approve a
signed-in user's pending call (``fetch`` in ``no-cors`` mode, no body, approval-id prefixes
guessed) and the call ran. Now a cookie authenticates a request that changes something, or a
WebSocket, only from the gateway's own pages, and approvals are found by their exact id."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from nanocrab.bus.server import free_port
from nanocrab.gateway.auth import COOKIE, same_origin

from .test_gateway import Gateway, pending_approval, problem, run_state, submit, until_status
from .test_web import CHROMIUM
from .test_web import gw as web_gw

gw = web_gw  # one `nanocrab up` with a gateway for this module (the fixture's own)


def cookie_client(gw: Gateway, who: str = "alice") -> httpx.AsyncClient:
    """A client authenticated as the web view is: by the cookie alone."""
    return httpx.AsyncClient(base_url=gw.url, cookies={COOKIE: gw.tokens[who]}, timeout=30)


def host_of(gw: Gateway) -> str:
    return gw.url.removeprefix("http://")


@pytest.mark.parametrize(
    ("headers", "same"),
    [
        ({}, True),  # not a browser: no page made it send anything
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, True),
        ({"host": "127.0.0.1:8080", "origin": "https://127.0.0.1:8080"}, True),
        ({"host": "127.0.0.1:8080", "sec-fetch-site": "same-origin"}, True),
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8081"}, False),
        ({"host": "127.0.0.1:8080", "origin": "null"}, False),
        ({"host": "127.0.0.1:8080", "sec-fetch-site": "same-site"}, False),
        ({"host": "127.0.0.1:8080", "sec-fetch-site": "cross-site"}, False),
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080",
          "sec-fetch-site": "same-site"}, False),
    ],
)  # fmt: skip
def test_same_origin_reads_what_the_browser_says(headers: dict[str, str], same: bool) -> None:
    assert same_origin(headers) is same


async def test_a_cookie_request_from_another_page_changes_nothing(gw: Gateway) -> None:
    other = f"http://127.0.0.1:{free_port()}"
    async with gw.client("alice") as c, cookie_client(gw) as browser:
        run_id = await submit(c, "write a note please")
        pending = await pending_approval(c, run_id)
        approve = f"/v1/approvals/{pending['approval_id']}/approve"
        for headers in (
            {"Origin": other, "Sec-Fetch-Site": "same-site"},
            {"Origin": other},
            {"Sec-Fetch-Site": "cross-site"},
            {"Origin": "null"},
        ):
            problem(await browser.post(approve, headers=headers), 403, "cross-site")
            problem(await browser.post(f"/v1/runs/{run_id}/cancel", headers=headers), 403,
                    "cross-site")  # fmt: skip
            problem(await browser.post("/v1/tasks", json={"text": "x"}, headers=headers), 403,
                    "cross-site")  # fmt: skip
        assert (await run_state(c, run_id))["status"] == "awaiting_approval"
        assert (await pending_approval(c, run_id))["status"] == "pending"

        # a bearer token says nothing about the page: any origin may use one
        theirs = await c.post(f"/v1/runs/{run_id}/messages", headers={"Origin": other},
                              json={"text": "still there?", "mode": "follow_up"})  # fmt: skip
        assert theirs.status_code == 202, theirs.text
        # the web view's own page, as the browser sends it
        own = {"Origin": gw.url, "Sec-Fetch-Site": "same-origin"}
        ok = await browser.post(approve, headers=own)
        assert ok.status_code == 200, ok.text
        await until_status(c, run_id, "completed")


async def test_approvals_are_answered_by_their_exact_id(gw: Gateway) -> None:
    async with gw.client("alice") as c:
        run_id = await submit(c, "write a note please")
        pending = await pending_approval(c, run_id)
        full: str = pending["approval_id"]
        for prefix in (full[:1], full[:12], full[:-1]):
            problem(await c.post(f"/v1/approvals/{prefix}/approve", json={}), 404, "not-found")
        assert (await pending_approval(c, run_id))["status"] == "pending"
        ok = await c.post(f"/v1/approvals/{full}/deny", json={"reason": "no"})
        assert ok.status_code == 200, ok.text
        await until_status(c, run_id, "completed", "failed")


async def test_a_websocket_opened_with_the_cookie_needs_the_gateways_own_page(gw: Gateway) -> None:
    async with gw.client("alice") as c:
        run_id = await submit(c, "over a websocket")
        await until_status(c, run_id, "completed")
    url = gw.url.replace("http", "ws") + f"/v1/runs/{run_id}/ws?deltas=false"
    cookie = {"Cookie": f"{COOKIE}={gw.tokens['alice']}"}
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, origin=f"http://127.0.0.1:{free_port()}",  # type: ignore[arg-type]
                                      additional_headers=cookie):  # fmt: skip
            pass
    assert refused.value.response.status_code == 403
    async with websockets.connect(url, origin=gw.url, additional_headers=cookie) as ws:  # type: ignore[arg-type]
        frames = [frame async for frame in ws]
    assert '"type":"run.completed"' in str(frames[-1])


ATTACKER = """<!doctype html><html><body><pre id=log></pre><script>
(async () => {
  const log = (s) => document.getElementById("log").textContent += s + "\\n";
  const r = await fetch("%(gw)s/v1/approvals/%(approval)s/approve",
                        {method: "POST", mode: "no-cors", credentials: "include"});
  log("approve sent: " + r.type);
  await new Promise((done) => {
    const ws = new WebSocket("%(ws)s/v1/runs/%(run)s/ws?deltas=false");
    ws.onmessage = () => { log("ws: read"); ws.close(); done(); };
    ws.onerror = () => { log("ws: refused"); done(); };
  });
  log("done");
})();
</script></body></html>"""


@pytest.fixture
def attacker_site() -> Iterator[tuple[str, dict[str, str]]]:
    """A page server on another port of the same host; fill in ``page["html"]``."""
    page: dict[str, str] = {"html": ""}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page["html"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", page
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                    reason="Debian's chromium is not installed (make install does)")  # fmt: skip
async def test_a_page_on_another_port_cannot_approve_or_read_in_a_real_browser(
    gw: Gateway, attacker_site: tuple[str, dict[str, str]]
) -> None:
    """Signed in to the web view, the user visits another local page that knows the exact
    approval id and the run id (the worst case): it can neither approve nor read the feed."""
    from playwright.async_api import async_playwright

    site, page_html = attacker_site
    async with gw.client("alice") as c:
        run_id = await submit(c, "write a note please")
        pending = await pending_approval(c, run_id)
        page_html["html"] = ATTACKER % {
            "gw": gw.url, "ws": gw.url.replace("http", "ws"), "run": run_id,
            "approval": pending["approval_id"],
        }  # fmt: skip
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = await browser.new_page()
                await page.goto(f"{gw.url}/login")
                await page.fill("#token", gw.tokens["alice"])
                await page.click("#login button")
                await page.wait_for_url(f"{gw.url}/")
                await page.goto(site)
                await page.wait_for_function(
                    "document.getElementById('log').textContent.includes('done')", timeout=30_000
                )
                log = await page.text_content("#log") or ""
            finally:
                await browser.close()
        assert "approve sent: opaque" in log and "ws: refused" in log, log
        assert (await pending_approval(c, run_id))["status"] == "pending"
        assert (await run_state(c, run_id))["status"] == "awaiting_approval"
        deny = await c.post(f"/v1/approvals/{pending['approval_id']}/deny", json={})
        assert deny.status_code == 200, deny.text
