"""The web view in a real headless Chromium (Debian's ``chromium``, driven by Playwright; no
browser download): a task submitted over HTTP is watched live in the page, its Guarded call is
approved by clicking, and the audit page shows the row with the approver. Screenshots of the
pages go to a temporary directory, or to ``$NANOCRAB_SCREENSHOTS`` (the ones in docs/img/ were
taken with ``NANOCRAB_SCREENSHOTS=docs/img``): a test run leaves the tree as it was."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_gateway import Gateway, running_gateway, submit

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
IMG = Path(os.environ.get("NANOCRAB_SCREENSHOTS") or tempfile.mkdtemp(prefix="nanocrab-web-"))

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make install does)"
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("web")) as gateway:
        yield gateway


async def test_watch_a_run_live_approve_by_clicking_and_read_the_audit(gw: Gateway) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{gw.url}/")
            assert page.url.endswith("/login"), "pages need a token"
            await page.fill("#token", "ncg_wrongwrongwr_" + "x" * 40)
            await page.click("#login button")
            await expect(page.locator("#login-error")).to_contain_text("unknown")
            await page.fill("#token", gw.tokens["alice"])
            await page.click("#login button")
            await page.wait_for_url(f"{gw.url}/")

            async with gw.client("alice") as c:
                run_id = await submit(c, "please write a note")
            await page.goto(f"{gw.url}/runs/{run_id}")
            approve = page.locator(".approval button.approve")
            await expect(approve).to_be_visible(timeout=30_000)
            # the whole call next to the button: what approving would run
            await expect(page.locator(".approval pre.arguments")).to_contain_text(
                '"content": "hello from the gateway"'
            )
            await expect(page.locator("#run-status")).to_have_text("awaiting_approval")
            await page.screenshot(path=str(IMG / "web-run-approval.png"), full_page=True)
            before = await page.locator("#timeline tbody tr").count()

            await approve.click()
            # everything from here on happens after the click: it can only arrive live (SSE)
            await expect(page.locator('#timeline tr[data-type="run.completed"]')).to_have_count(
                1, timeout=30_000
            )
            await expect(page.locator("#run-status")).to_have_text("completed")
            await expect(page.locator(".approval")).to_contain_text("approved")
            assert int(await page.locator("#turns").inner_text()) == 2, "counted live"
            await expect(page.locator("#reply")).to_have_text("Wrote note.txt.")
            assert await page.locator('#timeline tr[data-type="approval.granted"]').count() == 1
            assert await page.locator("#timeline tbody tr").count() > before
            assert (gw.home.parent / "note.txt").read_text() == "hello from the gateway"
            await page.screenshot(path=str(IMG / "web-run.png"), full_page=True)
            live_rows = await page.locator("#timeline tbody tr").count()
            await page.reload()  # the same run, all of it rendered by the server this time
            await expect(page.locator("#run-status")).to_have_text("completed")
            assert await page.locator("#timeline tbody tr").count() >= live_rows
            await expect(page.locator('#timeline tr[data-type="run.started"]')).to_have_count(1)

            row = page.locator(f'#audit tr[data-run="{run_id}"][data-tool="write"]')
            for _ in range(60):  # the audit projection catches up within moments
                await page.goto(f"{gw.url}/audit?run={run_id}&tool=write")
                if await row.count() and "completed" in await row.locator(".status").inner_text():
                    break
                await page.wait_for_timeout(500)
            await expect(row.locator(".approval-result")).to_have_text("granted")
            await expect(row.locator(".approver")).to_contain_text("alice (gateway)")
            await expect(row.locator(".status")).to_have_text("completed")
            await page.screenshot(path=str(IMG / "web-audit.png"), full_page=True)

            await page.goto(f"{gw.url}/")
            await expect(page.locator(f'#runs tr[data-run="{run_id}"]')).to_be_visible()
            await page.screenshot(path=str(IMG / "web-runs.png"), full_page=True)
            await page.goto(f"{gw.url}/capabilities")
            await expect(page.locator("h1")).to_have_text("Capability registry")
            await page.goto(f"{gw.url}/approvals")
            await expect(page.locator("h1")).to_have_text("Approvals waiting")
        finally:
            await browser.close()
