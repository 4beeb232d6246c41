"""Branching in the web view, in a real headless Chromium: "Branch" on a finished run's timeline
row starts a new session from that event, the task box continues it, and the new run's page
shows the session tree with a link back to the parent run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_gateway import Gateway, running_gateway, submit, until_status
from tests.test_web import CHROMIUM

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    pytest.mark.timeout(240),
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("web-branch")) as gateway:
        yield gateway


async def test_branch_from_a_timeline_row_and_continue_the_branch(gw: Gateway) -> None:
    from playwright.async_api import async_playwright, expect

    async with gw.client("alice") as c:
        parent = await submit(c, "remember the word otter")
        state = await until_status(c, parent, "completed")
    (reply,) = [t for t in state["timeline"] if t["type"] == "reply.sent"]

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.goto(f"{gw.url}/login")
            await page.fill("#token", gw.tokens["alice"])
            await page.click("#login button")
            await page.wait_for_url(f"{gw.url}/")

            await page.goto(f"{gw.url}/runs/{parent}")
            await page.click('#timeline tr[data-type="reply.sent"] button.branch')
            await page.wait_for_url(f"{gw.url}/?session=*")
            await expect(page.locator("#branch-note")).to_contain_text(parent)
            session = await page.locator("#task-session").input_value()
            assert session

            await page.fill("#task-text", "which word was it?")
            await page.click("#submit-task button")
            await page.wait_for_url(f"{gw.url}/runs/*")
            child = page.url.rsplit("/", 1)[1]
            assert child != parent
            async with gw.client("alice") as c:
                done = await until_status(c, child, "completed")
                tree = (await c.get(f"/v1/runs/{child}/tree")).json()
            assert done["session_id"] == session, "the task went to the branch's session"
            assert [(f["parent_run_id"], f["at_event_id"]) for f in tree["lineage"]] == [
                (parent, reply["id"])
            ]
            await page.goto(f"{gw.url}/runs/{child}")
            await expect(page.locator("#session-tree")).to_contain_text(reply["id"])
            await expect(page.locator(f'#session-tree a[href="/runs/{parent}"]')).to_have_count(1)
        finally:
            await browser.close()
