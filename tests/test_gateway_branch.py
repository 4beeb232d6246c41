"""Branching over the gateway: ``POST /v1/runs/{id}/branch`` against a real ``nanocrab up``; a
task on the branch continues from the fork, ``GET /v1/runs/{id}/tree`` and the run page show
the tree, and an unknown event or another tenant's run is refused with nothing appended."""

from __future__ import annotations

import pytest

from nanocrab.gateway.auth import COOKIE
from tests.test_gateway import Gateway, gw, run_state, stored_under, until_status  # noqa: F401

pytestmark = pytest.mark.timeout(180)


async def test_a_branch_over_http_continues_from_the_fork_and_shows_in_the_tree(
    gw: Gateway,  # noqa: F811
) -> None:
    async with gw.client("alice") as alice:
        r = await alice.post("/v1/tasks", json={"text": "remember the word otter"})
        parent, session = r.json()["run_id"], r.json()["session_id"]
        state = await until_status(alice, parent, "completed")
        (fork,) = [t for t in state["timeline"] if t["type"] == "reply.sent"]

        r = await alice.post(f"/v1/runs/{parent}/branch", json={"at": fork["id"]})
        assert r.status_code == 201, r.text
        branch = r.json()
        assert branch["parent_run_id"] == parent and branch["parent_session_id"] == session
        assert (branch["at_event_id"], branch["at_seq"], branch["at_type"]) == (
            fork["id"], fork["seq"], "reply.sent",
        )  # fmt: skip
        assert branch["by"] == "alice" and branch["session_id"] != session

        r = await alice.post(
            "/v1/tasks", json={"text": "which word?", "session_id": branch["session_id"]}
        )
        child = r.json()["run_id"]
        await until_status(alice, child, "completed")

        tree = (await alice.get(f"/v1/runs/{parent}/tree")).json()
        assert tree["lineage"] == []
        assert [(b["session_id"], b["runs"]) for b in tree["branches"]] == [
            (branch["session_id"], [child])
        ]
        lineage = (await alice.get(f"/v1/runs/{child}/tree")).json()["lineage"]
        assert [b["at_event_id"] for b in lineage] == [fork["id"]]

    async with gw.client(cookies={COOKIE: gw.tokens["alice"]}) as browser:
        page = await browser.get(f"/runs/{child}")
        assert page.status_code == 200 and "Session tree" in page.text
        assert f'href="/runs/{parent}"' in page.text and fork["id"] in page.text
        page = await browser.get(f"/runs/{parent}")
        assert f'href="/runs/{child}"' in page.text, "the parent's page lists the branch's runs"


async def test_an_unknown_event_or_run_is_refused_and_leaves_nothing(
    gw: Gateway,  # noqa: F811
) -> None:
    async with gw.client("alice") as alice, gw.client("other") as eve:
        r = await alice.post("/v1/tasks", json={"text": "hello there"})
        run_id = r.json()["run_id"]
        await until_status(alice, run_id, "completed")
        before = await stored_under(gw, "nanocrab.*.session.*.session.branched")

        r = await alice.post(f"/v1/runs/{run_id}/branch", json={"at": "NOPENOPENOPE"})
        assert r.status_code == 404 and "has no event 'NOPENOPENOPE'" in r.json()["detail"]
        r = await alice.post("/v1/runs/no-such-run/branch", json={"at": "NOPENOPENOPE"})
        assert r.status_code == 404
        state = await run_state(alice, run_id)
        r = await eve.post(f"/v1/runs/{run_id}/branch", json={"at": state["timeline"][0]["id"]})
        assert r.status_code == 404, "another tenant's run is not there for eve"
        r = await alice.post(f"/v1/runs/{run_id}/branch", json={"at": "x y"})
        assert r.status_code == 422
        assert await stored_under(gw, "nanocrab.*.session.*.session.branched") == before
