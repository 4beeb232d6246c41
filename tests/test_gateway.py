"""The HTTP gateway against a real ``nanocrab up`` (embedded nats-server, every handler, the
projections, the offline model) serving it on loopback: every endpoint's good and bad paths.

A refused request must leave nothing on the bus: checked on the log stream itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from nanocrab.bus import BusConfig
from nanocrab.bus.server import free_port
from nanocrab.gateway.bodies import MAX_TASK_BODY
from tests.conftest import eventually

NANOCRAB = [sys.executable, "-m", "nanocrab"]
FAST = "1000/second"

SCRIPT = textwrap.dedent(
    """
    scripts:
      - name: write-note
        match: "note"
        turns:
          - text: "Writing the note you asked for into note.txt, as a file of the workspace."
            tool_calls:
              - {name: write, input: {path: note.txt, content: "hello from the gateway"}}
          - text: "Wrote note.txt."
      - name: echo
        turns:
          - text: "(offline model) I received your task: {task}"
    """
)


def user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANOCRAB_", "ANTHROPIC_"))}
    env.update({"NANOCRAB_HOME": str(home), "COLUMNS": "160", **extra})
    return env


@dataclass
class Gateway:
    """A running ``nanocrab up`` with its gateway, and tokens for each kind of caller."""

    home: Path
    url: str
    env: dict[str, str]
    tokens: dict[str, str]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*NANOCRAB, *args], cwd=self.home.parent, env=self.env, capture_output=True,
            text=True, timeout=90, check=False,
        )  # fmt: skip

    def token(self, name: str, *scopes: str, tenant: str = "default", rate: str = "") -> str:
        args = ["gateway", "token", "create", name, "--tenant", tenant, "--json"]
        for s in scopes:
            args += ["--scope", s]
        if rate:
            args += ["--rate", rate]
        done = self.cli(*args)
        assert done.returncode == 0, done.stderr
        secret: str = json.loads(done.stdout)["token"]
        return secret

    def client(self, who: str | None = None, **kw: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **kw)


@contextlib.contextmanager
def running_gateway(tmp: Path) -> Iterator[Gateway]:
    home = tmp / "home"
    script = tmp / "script.yaml"
    script.write_text(SCRIPT)
    port = free_port()
    # No guardrails chain: these tests are about the front door, and the bundled chain's
    # injection classifier flagged benign task texts here ("via the standalone gateway"), which
    # would make them about the classifier (tests/test_guardrails_* cover it).
    env = user_env(home, NANOCRAB_SCRIPT=str(script), NANOCRAB_GATEWAY=f"127.0.0.1:{port}",
                   NANOCRAB_GUARDRAILS="none")  # fmt: skip
    up = subprocess.Popen(
        [*NANOCRAB, "up"], cwd=tmp, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        banner = up.stdout.readline()
        assert "nanocrab up" in banner, banner + (up.stderr.read() if up.poll() is not None else "")
        gw = Gateway(home, f"http://127.0.0.1:{port}", env, {})
        gw.tokens = {
            # the tests poll: rates well above what they use (the 429 test makes its own token)
            "alice": gw.token("alice", "submit", "read", "approve", rate=FAST),
            "reader": gw.token("reader", "read", rate=FAST),
            "submitter": gw.token("bob", "submit", rate=FAST),
            "admin": gw.token("root", "admin", rate=FAST),
            "other": gw.token("eve", "submit", "read", "approve", tenant="other", rate=FAST),
        }
        yield gw
    finally:
        up.send_signal(signal.SIGINT)
        try:
            _, err = up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            _, err = up.communicate()
        if "Traceback" in err:  # shown with the failing test's output
            print(f"nanocrab up's stderr:\n{err[-8000:]}", file=sys.stderr)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway")) as gateway:
        yield gateway


async def sse_events(client: httpx.AsyncClient, path: str, **headers: str) -> list[dict[str, Any]]:
    """Every SSE message of ``path`` until the server ends the stream."""
    out: list[dict[str, Any]] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        message: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                message["id"] = line[4:]
            elif line.startswith("event: "):
                message["event"] = line[7:]
            elif line.startswith("data: "):
                message["data"] = json.loads(line[6:])
            elif line == "" and message:
                out.append(message)
                message = {}
    return out


async def submit(client: httpx.AsyncClient, text: str, **headers: str) -> str:
    r = await client.post("/v1/tasks", json={"text": text}, headers=headers)
    assert r.status_code == 202, r.text
    run_id: str = r.json()["run_id"]
    return run_id


async def run_state(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/runs/{run_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def until_status(client: httpx.AsyncClient, run_id: str, *statuses: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        state = await run_state(client, run_id)
        return state if state["status"] in statuses else None

    found: dict[str, Any] = await eventually(check, timeout=30)
    return found


async def pending_approval(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run's approval once the audit projection lists it."""

    async def listed() -> dict[str, Any] | None:
        r = await client.get("/v1/approvals")
        assert r.status_code == 200, r.text
        return next((a for a in r.json()["approvals"] if a["run_id"] == run_id), None)

    found: dict[str, Any] = await eventually(listed, timeout=30)
    return found


@contextlib.asynccontextmanager
async def bus_of(gw: Gateway) -> AsyncIterator[Any]:
    """The running server's log, read as ``cli`` (the test's own view of what was appended)."""
    from nanocrab.cli.host import bus_session

    async with bus_session(BusConfig(data_dir=gw.home), name="test") as (log, server):
        assert server is None or not server.owned, "the test must meet up's server"
        yield log


async def stored_under(gw: Gateway, subject: str) -> int:
    async with bus_of(gw) as log:
        info = await log.js.stream_info(log.cfg.log_stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())


def problem(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json", r.headers
    body: dict[str, Any] = r.json()
    assert body["type"] == f"/problems/{kind}" and body["status"] == status, body
    assert body["title"]
    return body


# --- good paths -------------------------------------------------------------------------------


async def test_health_and_openapi(gw: Gateway) -> None:
    async with gw.client() as c:
        health = await c.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok", "nats": True}
        spec = (await c.get("/openapi.json")).json()
    paths = set(spec["paths"])
    assert {"/v1/tasks", "/v1/runs/{run_id}", "/v1/runs/{run_id}/events",
            "/v1/runs/{run_id}/messages", "/v1/runs/{run_id}/cancel", "/v1/approvals",
            "/v1/approvals/{approval_id}/approve", "/v1/approvals/{approval_id}/deny",
            "/v1/audit", "/v1/capabilities", "/healthz"} <= paths  # fmt: skip
    task_body = spec["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]
    assert "text" in task_body["schema"]["properties"]


async def test_a_task_submitted_over_http_is_followed_live_over_sse(gw: Gateway) -> None:
    """The feed opened while the run is live (it waits for a person: a one-turn run can end
    before any client connects, and a feed opened after the end carries no deltas) has every
    log event once, in order, and the model's text deltas of both turns."""
    async with gw.client("alice") as c:
        run_id = await submit(c, "please write a note over http")
        pending = await pending_approval(c, run_id)
        following = asyncio.create_task(sse_events(c, f"/v1/runs/{run_id}/events"))
        ok = await c.post(f"/v1/approvals/{pending['approval_id']}/approve")
        assert ok.status_code == 200, ok.text
        events = await asyncio.wait_for(following, timeout=60)
        state = await until_status(c, run_id, "completed")  # the projection, after the log
    types = [e["event"] for e in events]
    assert types[0] == "task.submitted" and types[-1] == "run.completed"
    assert "llm.delta" in types, "model text deltas are part of the live feed"
    log_events = [e for e in events if e["event"] != "llm.delta"]
    seqs = [e["data"]["seq"] for e in log_events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(e["data"]["specversion"] == "1.0" for e in events)
    assert all(e["data"]["runid"] == run_id for e in log_events)
    assert events[0]["data"]["tenant"] == "default" and events[0]["data"]["source"] == "gateway"
    deltas = "".join(e["data"]["data"]["text"] for e in events if e["event"] == "llm.delta")
    assert "Writing the note you asked for" in deltas, "the first turn's, sent before the feed"
    assert "Wrote note.txt." in deltas
    assert state["status"] == "completed"
    assert state["reply"] == "Wrote note.txt."
    assert state["usage"]["turns"] == 2 and state["usage"]["output_tokens"] > 0
    # the same events as the feed, which ends at run.completed (the run's grant is revoked
    # after it: a later event of the run's timeline)
    timeline = state["timeline"]
    assert [t["seq"] for t in timeline if t["seq"] <= seqs[-1]] == seqs
    assert {t["type"] for t in timeline if t["seq"] > seqs[-1]} <= {"grant.revoked"}


async def test_the_feed_resumes_from_a_position_without_gaps_or_repeats(gw: Gateway) -> None:
    async with gw.client("reader") as reader, gw.client("alice") as c:
        run_id = await submit(c, "resume me")
        full = await sse_events(reader, f"/v1/runs/{run_id}/events?deltas=false")
        cut = full[2]["id"]
        rest = await sse_events(reader, f"/v1/runs/{run_id}/events?deltas=false",
                                **{"Last-Event-ID": cut})  # fmt: skip
        by_query = await sse_events(reader, f"/v1/runs/{run_id}/events?deltas=false&after={cut}")
        after_end = await sse_events(
            reader, f"/v1/runs/{run_id}/events?after={full[-1]['id']}"
        )
    assert [e["id"] for e in rest] == [e["id"] for e in full[3:]]
    assert [e["id"] for e in by_query] == [e["id"] for e in full[3:]]
    assert after_end == [], "resumed after the terminal event: nothing more, the stream ends"


async def test_a_client_dropped_mid_run_resumes_where_it_was(gw: Gateway) -> None:
    """Disconnect while the run waits for a person, answer, reconnect with Last-Event-ID: the
    two halves are the whole run, each event once, in order."""
    async with gw.client("alice") as c:
        run_id = await submit(c, "write a note while I reconnect")
        first: list[dict[str, Any]] = []
        async with c.stream("GET", f"/v1/runs/{run_id}/events") as response:
            message: dict[str, Any] = {}
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    message["id"] = line[4:]
                elif line.startswith("event: "):
                    message["event"] = line[7:]
                elif line == "" and message:
                    first.append(message)
                    message = {}
                    kinds = {m["event"] for m in first}
                    # the client goes away mid-run, once it has the first turn's deltas (a
                    # feed opened while the run is live has them, live or from the ephemeral
                    # stream, in either order with the log events: waiting for both does not
                    # race the run on a loaded machine)
                    if {"approval.requested", "llm.delta"} <= kinds:
                        break
        pending = await pending_approval(c, run_id)
        assert (await c.post(f"/v1/approvals/{pending['approval_id']}/approve")).status_code == 200
        rest = await sse_events(c, f"/v1/runs/{run_id}/events", **{"Last-Event-ID": first[-1]["id"]})
        whole = await sse_events(c, f"/v1/runs/{run_id}/events")
    logged = [e["id"].split(".")[0] for e in first + rest if e["event"] != "llm.delta"]
    assert logged == [e["id"].split(".")[0] for e in whole if e["event"] != "llm.delta"]
    assert rest[-1]["event"] == "run.completed"
    delta_seqs = [int(e["id"].split(".")[1]) for e in first + rest if e["event"] == "llm.delta"]
    # deltas only while the run is live: a resume after its end gets none (docs/gateway.md)
    assert delta_seqs and delta_seqs == sorted(set(delta_seqs)), "deltas once each"


async def test_the_websocket_carries_the_same_feed(gw: Gateway) -> None:
    async with gw.client("alice") as c:
        run_id = await submit(c, "over a websocket")
        sse = await sse_events(c, f"/v1/runs/{run_id}/events?deltas=false")
    ws_url = gw.url.replace("http", "ws") + f"/v1/runs/{run_id}/ws?deltas=false"
    frames = []
    async with websockets.connect(
        ws_url, additional_headers={"Authorization": f"Bearer {gw.tokens['reader']}"}
    ) as ws:
        async for frame in ws:
            frames.append(json.loads(frame))
    assert [f["position"] for f in frames] == [e["id"] for e in sse]
    assert [f["event"]["seq"] for f in frames] == [e["data"]["seq"] for e in sse]
    assert frames[-1]["type"] == "run.completed"
    # the browser form: the token as a query parameter, resuming from a position
    resumed = []
    async with websockets.connect(
        f"{ws_url}&token={gw.tokens['reader']}&after={frames[1]['position']}"
    ) as ws:
        async for frame in ws:
            resumed.append(json.loads(frame)["position"])
    assert resumed == [f["position"] for f in frames[2:]]


async def test_idempotency_key_returns_the_same_run(gw: Gateway) -> None:
    async with gw.client("alice") as c:
        key = {"Idempotency-Key": f"order-{os.getpid()}-{id(gw)}"}
        first = await c.post("/v1/tasks", json={"text": "only once"}, headers=key)
        again = await c.post("/v1/tasks", json={"text": "only once"}, headers=key)
        other = await c.post("/v1/tasks", json={"text": "something else"}, headers=key)
        assert first.status_code == 202 and again.status_code == 200
        run_id = first.json()["run_id"]
        assert again.json()["run_id"] == run_id and again.json()["replayed"] is True
        problem(other, 422, "idempotency-key-reused")
        state = await until_status(c, run_id, "completed")
    assert [t["type"] for t in state["timeline"]].count("task.submitted") == 1
    # another tenant's identical key is its own
    async with gw.client("other") as o:
        theirs = await o.post("/v1/tasks", json={"text": "only once"}, headers=key)
        assert theirs.status_code == 202 and theirs.json()["run_id"] != run_id


async def test_approve_over_http_signs_as_the_approver_and_shows_in_the_audit(gw: Gateway) -> None:
    async with gw.client("alice") as c, gw.client("reader") as reader:
        run_id = await submit(c, "write a note please")
        pending = await pending_approval(c, run_id)
        assert pending["tool"] == "write" and pending["tier"] == "guarded"
        assert (await run_state(c, run_id))["status"] == "awaiting_approval"
        denied = await reader.post(f"/v1/approvals/{pending['approval_id']}/approve", json={})
        problem(denied, 403, "forbidden")
        ok = await c.post(f"/v1/approvals/{pending['approval_id']}/approve", json={})
        assert ok.status_code == 200, ok.text
        assert ok.json()["approver"] == "alice (gateway)" and ok.json()["signer"].startswith("U")
        twice = await c.post(f"/v1/approvals/{pending['approval_id']}/approve", json={})
        problem(twice, 409, "conflict")
        state = await until_status(c, run_id, "completed")
        assert state["reply"] == "Wrote note.txt."
        assert (gw.home.parent / "note.txt").read_text() == "hello from the gateway"

        async def audited() -> dict[str, Any] | None:
            r = await reader.get("/v1/audit", params={"run": run_id, "tool": "write"})
            assert r.status_code == 200, r.text
            rows = [x for x in r.json()["calls"] if x["status"] == "completed"]
            return rows[0] if rows else None

        row = await eventually(audited, timeout=30)
    assert row["approval_result"] == "granted" and row["approver"].startswith("alice (gateway)")
    assert row["approval_required"] is True and row["tier"] == "guarded"


async def test_deny_cancel_and_messages(gw: Gateway) -> None:
    async with gw.client("alice") as c:
        refused = await submit(c, "write a note, to be refused")
        # straight from the run's log, with its run id: no wait for the audit projection
        state = await until_status(c, refused, "awaiting_approval")
        aid = state["pending_approvals"][0]["approval_id"]
        wrong_run = await c.post(f"/v1/approvals/{aid}/deny", json={"run_id": "no-such-run"})
        problem(wrong_run, 404, "not-found")
        no = await c.post(f"/v1/approvals/{aid}/deny",
                          json={"reason": "not today", "run_id": refused})  # fmt: skip
        assert no.status_code == 200 and no.json()["result"] == "denied"
        await until_status(c, refused, "completed", "failed")

        live = await submit(c, "write a note, then be cancelled")
        await pending_approval(c, live)
        said = await c.post(f"/v1/runs/{live}/messages", json={"text": "also: hi", "mode": "steer"})
        assert said.status_code == 202, said.text
        cancelled = await c.post(f"/v1/runs/{live}/cancel", json={"reason": "changed my mind"})
        assert cancelled.status_code == 202, cancelled.text
        state = await until_status(c, live, "cancelled")
        assert state["error"] == "changed my mind"
        types = [t["type"] for t in state["timeline"]]
        assert "message.queued" in types and "run.cancelled" in types
        problem(await c.post(f"/v1/runs/{live}/cancel"), 409, "conflict")
        problem(await c.post(f"/v1/runs/{live}/messages", json={"text": "late"}), 409, "conflict")

        audit = await c.get("/v1/audit", params={"run": refused})
        rows = audit.json()["calls"]
        assert rows and rows[0]["approval_result"] == "denied"


async def test_lists_and_filters(gw: Gateway) -> None:
    async with gw.client("alice") as c:
        run_id = await submit(c, "listed run")
        await until_status(c, run_id, "completed")

        async def listed() -> bool:
            runs = (await c.get("/v1/runs")).json()["runs"]
            return any(r["run_id"] == run_id and r["status"] == "completed" for r in runs)

        await eventually(listed, timeout=30)
        problem(await c.get("/v1/audit", params={"since": "yesterday-ish"}), 422, "invalid-request")
        problem(await c.get("/v1/audit", params={"status": "bogus"}), 422, "invalid-request")
        assert (await c.get("/v1/audit", params={"since": "1h"})).status_code == 200
        assert (await c.get("/v1/audit", params={"violations": "true"})).json() == {
            "violations": []
        }
        assert (await c.get("/v1/capabilities")).json() == {"capabilities": []}
        problem(await c.get("/v1/runs", params={"limit": 0}), 422, "invalid-request")


async def test_another_tenant_sees_nothing_of_this_one(gw: Gateway) -> None:
    async with gw.client("alice") as c, gw.client("other") as o:
        run_id = await submit(c, "write a note for the default tenant")
        pending = await pending_approval(c, run_id)
        problem(await o.get(f"/v1/runs/{run_id}"), 404, "not-found")
        problem(await o.get(f"/v1/runs/{run_id}/events"), 404, "not-found")
        problem(await o.post(f"/v1/runs/{run_id}/cancel"), 404, "not-found")
        problem(await o.post(f"/v1/approvals/{pending['approval_id']}/approve"), 404, "not-found")
        assert all(a["run_id"] != run_id for a in (await o.get("/v1/approvals")).json()["approvals"])
        assert all(r["run_id"] != run_id for r in (await o.get("/v1/runs")).json()["runs"])
        assert (await o.get("/v1/audit", params={"run": run_id})).json() == {"calls": []}
        await c.post(f"/v1/runs/{run_id}/cancel")


# --- bad paths: the right status, a problem body, nothing on the bus --------------------------


async def test_refused_requests_leave_nothing_on_the_bus(gw: Gateway) -> None:
    tenant = f"bad{os.getpid()}"
    token = gw.token("mallory", "read", tenant=tenant)
    submitter = gw.token("mallet", "submit", tenant=tenant, rate="3/hour")
    other_submitter = gw.token("mallet2", "submit", tenant=tenant)
    revoked = gw.token("gone", "submit", tenant=tenant)
    assert gw.cli("gateway", "token", "revoke", revoked.split("_")[1]).returncode == 0
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        task = {"text": "must not run"}
        problem(await c.post("/v1/tasks", json=task), 401, "unauthorized")
        r = await c.post("/v1/tasks", json=task, headers={"Authorization": "Bearer nope"})
        assert problem(r, 401, "unauthorized") and r.headers["www-authenticate"].startswith("Bearer")
        bad_secret = submitter[:-4] + "AAAA"
        problem(await c.post("/v1/tasks", json=task, headers=_auth(bad_secret)), 401,
                "unauthorized")  # fmt: skip
        problem(await c.post("/v1/tasks", json=task, headers=_auth(revoked)), 401, "unauthorized")
        problem(await c.post("/v1/tasks", json=task, headers=_auth(token)), 403, "forbidden")
        h = _auth(submitter)
        problem(await c.post("/v1/tasks", content=b"{not json", headers={**h, "Content-Type": "application/json"}), 400, "bad-json")  # fmt: skip
        for _ in range(2):  # the 2nd and 3rd requests of this hour (the 1st was the bad JSON)
            problem(await c.post("/v1/tasks", json={"text": ""}, headers=h), 422, "invalid-body")
        limited = await c.post("/v1/tasks", json={"text": ""}, headers=h)
        body = problem(limited, 429, "rate-limited")
        assert int(limited.headers["retry-after"]) >= 1 and "3 per 1 hour" in body["detail"]
        h2 = _auth(other_submitter)
        problem(await c.post("/v1/tasks", json={"text": ""}, headers=h2), 422, "invalid-body")
        problem(await c.post("/v1/tasks", json={"txt": "typo"}, headers=h2), 422, "invalid-body")
        # a task body may carry images (base64): its limit is MAX_TASK_BODY, not MAX_BODY
        problem(await c.post("/v1/tasks", json={"text": "x" * (MAX_TASK_BODY + 1)}, headers=h2),
                413, "too-large")  # fmt: skip
        problem(await c.post("/v1/tasks", content=b"text=hi", headers={**h2, "Content-Type": "application/x-www-form-urlencoded"}), 415, "unsupported-media-type")  # fmt: skip
        reader = _auth(token)
        for path in ("/v1/runs/no-such-run", "/v1/runs/no-such-run/events"):
            problem(await c.get(path, headers=reader), 404, "not-found")
        problem(await c.post("/v1/approvals/no-such-approval/approve",
                             headers=_auth(gw.tokens["admin"])), 404, "not-found")  # fmt: skip
        problem(await c.post("/v1/runs/no-such-run/cancel", headers=_auth(gw.tokens["admin"])),
                404, "not-found")  # fmt: skip
        problem(await c.post("/v1/runs/no-such-run/messages", json={"text": "hi"},
                             headers=_auth(gw.tokens["admin"])), 404, "not-found")  # fmt: skip
        problem(await c.get("/v1/nothing-here"), 404, "not-found")
        problem(await c.get("/v1/runs/x/events?after=abc", headers=reader), 400, "bad-position")
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(gw.url.replace("http", "ws") + "/v1/runs/x/ws"):
            pass
    assert refused.value.response.status_code == 401
    assert await stored_under(gw, f"*.{tenant}.>") == 0
    assert await stored_under(gw, "*.*.run.no-such-run.>") == 0


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_token_cli_lists_hashed_tokens_and_revokes(gw: Gateway) -> None:
    secret = gw.token("carol", "read", tenant="t2")
    listed = [json.loads(x) for x in gw.cli("gateway", "token", "list", "--json").stdout.splitlines()]
    mine = [t for t in listed if t["name"] == "carol"]
    assert len(mine) == 1 and mine[0]["scopes"] == ["read"] and "token" not in mine[0]
    assert secret.split("_", 2)[2] not in (gw.home / "gateway.db").read_bytes().decode("latin-1")
    assert gw.cli("gateway", "token", "revoke", mine[0]["id"]).returncode == 0
    again = gw.cli("gateway", "token", "revoke", mine[0]["id"])
    assert again.returncode == 1 and "no live token" in again.stderr
    bad = gw.cli("gateway", "token", "create", "x", "--scope", "root")
    assert bad.returncode == 2 and "unknown scope" in bad.stderr
    asyncio.run(_still_refused(gw, secret))


async def _still_refused(gw: Gateway, secret: str) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as c:
        problem(await c.get("/v1/runs", headers=_auth(secret)), 401, "unauthorized")


def test_the_gateway_command_serves_beside_up(gw: Gateway) -> None:
    """``nanocrab gateway`` in its own process, next to the ``nanocrab up`` of its data dir."""
    port = free_port()
    proc = subprocess.Popen(
        [*NANOCRAB, "gateway", "--port", str(port)], cwd=gw.home.parent, env=gw.env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line, line + (proc.stderr.read() if proc.stderr else "")
        headers = {"Authorization": f"Bearer {gw.tokens['alice']}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as c:
            run_id = c.post("/v1/tasks", json={"text": "via the standalone gateway"}).json()["run_id"]
            with c.stream("GET", f"/v1/runs/{run_id}/events?deltas=false") as events:
                types = [line[7:] for line in events.iter_lines() if line.startswith("event: ")]
        assert types[0] == "task.submitted" and types[-1] == "run.completed", types
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "gateway stopped" in out


async def test_a_lost_bus_is_a_503_and_healthz_says_so(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's app in this process, on its own connections to up's server; once they are
    closed, a task is refused with 503 (retry later) and /healthz turns 503."""
    from nanocrab.cli.gateway import gateway_app_for
    from nanocrab.cli.host import bus_connector
    from nanocrab.cli.settings import Settings

    for k, v in gw.env.items():
        if k.startswith("NANOCRAB_"):
            monkeypatch.setenv(k, v)
    settings = Settings.from_env()
    async with (
        bus_connector(settings.bus(), name="test-lost-bus", identity="gateway") as bus,
        gateway_app_for(settings, bus) as app,
    ):
        backend = app.state.backend
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                     headers=_auth(gw.tokens["alice"])) as c:  # fmt: skip
            assert (await c.get("/healthz")).status_code == 200
            await backend.log.nc.close()
            problem(await c.post("/v1/tasks", json={"text": "into the void"}), 503,
                    "bus-unavailable")  # fmt: skip
            health = await c.get("/healthz")
            assert health.status_code == 503 and health.json()["nats"] is False
