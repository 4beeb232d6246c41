"""The HTTP API (FastAPI on uvicorn): tasks, runs, live events, messages, cancels, approvals,
audit, capabilities, health, OpenAPI at ``/openapi.json`` (docs at ``/docs``).

Every refusal is ``application/problem+json`` (RFC 9457) with the right status, and is decided
before anything is appended: authentication and scope (401/403), rate (429), body size (413),
content type (415), JSON syntax (400), schema (422), unknown or another tenant's run or
approval (404), a finished run or answered approval (409). docs/gateway.md lists them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any, Literal

import nats.errors
from fastapi import Depends, FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from nanocrab.branching import fork_json, tree_json
from nanocrab.bus import BusError
from nanocrab.gateway.auth import (
    COOKIE,
    SAFE_METHODS,
    Authenticator,
    bearer,
    cross_site,
    same_origin,
)
from nanocrab.gateway.bodies import MAX_TASK_BODY, read_body
from nanocrab.gateway.errors import Problem, not_found
from nanocrab.gateway.filters import parse_since
from nanocrab.gateway.live import Position, feed, history, sse
from nanocrab.gateway.service import Backend, body_hash
from nanocrab.gateway.tokens import Scope, Token
from nanocrab.projections.audit import STATUSES

KEEPALIVE_S = 15.0
MAX_IMAGE_BASE64 = 5 * 1024 * 1024  # characters of one task image (about 3.75 MiB of file)
log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="An API token: `nanocrab gateway token create`")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class ImageIn(_Body):
    name: str = Field(default="image", pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    data: str = Field(
        min_length=1, max_length=MAX_IMAGE_BASE64,
        description="A PNG, JPEG, GIF or WebP file, base64-encoded (scaled down when large).",
    )  # fmt: skip


class TaskIn(_Body):
    text: str = Field(min_length=1, max_length=32_000, description="The task, in plain words.")
    images: list[ImageIn] = Field(
        default=[], max_length=4,
        description="Images for the model, stored in the object store (the task names them).",
    )  # fmt: skip
    agent: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    session_id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_-]{1,128}$",
        description="Continue this session (its history); a new one when absent.",
    )  # fmt: skip


class MessageIn(_Body):
    text: str = Field(min_length=1, max_length=32_000)
    mode: Literal["steer", "follow_up"] = "follow_up"


class CancelIn(_Body):
    reason: str = Field(default="cancelled over the gateway", max_length=2000)


class BranchIn(_Body):
    at: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$",
        description="The event to fork at: its id, or a unique prefix or suffix of it.",
    )  # fmt: skip


_RUN = Field(
    default=None, pattern=r"^[A-Za-z0-9_-]{1,128}$",
    description="The run that asked, if known: found in its log at once, not via the audit.",
)  # fmt: skip


class ApproveIn(_Body):
    remember: Literal["once", "session"] = "once"
    run_id: str | None = _RUN


class DenyIn(_Body):
    reason: str = Field(default="", max_length=2000)
    run_id: str | None = _RUN


def problem_response(exc: Problem, instance: str = "") -> JSONResponse:
    return JSONResponse(
        exc.body(instance), status_code=exc.status, headers=exc.headers,
        media_type="application/problem+json",
    )  # fmt: skip


def _doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body read by :func:`read_body` (not by FastAPI, which would parse it
    before authenticating the request)."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _presented(request: Request, creds: HTTPAuthorizationCredentials | None) -> str | None:
    if creds is not None:
        return creds.credentials
    cookie = request.cookies.get(COOKIE)
    if cookie and request.method not in SAFE_METHODS and not same_origin(request.headers):
        raise cross_site(request.headers)  # another page made the browser send the cookie
    return cookie


def needs(*scopes: Scope) -> Callable[..., Awaitable[Token]]:
    """A dependency: the caller's token, holding the first of ``scopes`` it has (and under its
    rate); 401/403/429 otherwise."""

    async def dependency(
        request: Request,
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Token:
        auth: Authenticator = request.app.state.auth
        token = auth.token(_presented(request, creds))
        held = next((s for s in scopes if token.allows(s)), scopes[0])
        return await auth.check(token, held)

    return dependency


Submitter = Annotated[Token, Depends(needs("submit"))]
Reader = Annotated[Token, Depends(needs("read"))]
Approver = Annotated[Token, Depends(needs("approve"))]
ApprovalsReader = Annotated[Token, Depends(needs("approve", "read"))]


def _plain(row: Any) -> dict[str, Any]:
    out = asdict(row)
    for k, v in out.items():
        if isinstance(v, datetime):
            out[k] = v.isoformat()
    return out


def create_app(backend: Backend, *, web: bool = True) -> FastAPI:
    """The gateway for ``backend``. ``web``: also serve the web view (nanocrab/gateway/web.py)."""
    app = FastAPI(
        title="nanocrab gateway",
        version="1",
        description="Tasks, runs, live events, approvals and the audit of a nanocrab runtime. "
        "See docs/gateway.md.",
    )
    app.state.backend = backend
    app.state.auth = Authenticator(backend.tokens)

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> Response:
        return problem_response(exc, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(
            Problem(exc.status_code, kind, str(exc.detail), headers=dict(exc.headers or {})),
            request.url.path,
        )

    @app.exception_handler(BusError)
    @app.exception_handler(nats.errors.Error)  # a closed or draining connection, untranslated
    async def _bus(request: Request, exc: Exception) -> Response:
        """NATS unreachable, a stream full, a refused publish: the request may not have been
        stored; the client retries (with its Idempotency-Key for tasks)."""
        log.warning("gateway: %s %s failed on the bus: %r", request.method, request.url.path, exc)
        return problem_response(
            Problem(503, "bus-unavailable", "The event bus did not take the request",
                    f"{type(exc).__name__}: {exc}", headers={"Retry-After": "1"}),
            request.url.path,
        )  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        )
        return problem_response(
            Problem(422, "invalid-request", "The request's parameters are invalid", detail),
            request.url.path,
        )

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        """200 while the gateway is connected to NATS, else 503 (no token needed)."""
        up = backend.log.nc.is_connected and backend.approver.nc.is_connected
        return JSONResponse(
            {"status": "ok" if up else "unavailable", "nats": up}, status_code=200 if up else 503
        )

    @app.post("/v1/tasks", status_code=202, tags=["runs"], openapi_extra=_doc(TaskIn))
    async def submit(request: Request, token: Submitter) -> JSONResponse:
        """Publish a task; returns its run id at once (follow it with ``/events``).

        ``Idempotency-Key`` (any string up to 200 chars): a retry with the same key and body
        returns the same run (``replayed: true``) instead of starting another."""
        body = await read_body(request, TaskIn, limit=MAX_TASK_BODY)
        key = request.headers.get("idempotency-key")
        if key is not None and not (0 < len(key) <= 200):
            raise Problem(400, "bad-idempotency-key", "Bad Idempotency-Key", "1-200 characters")
        done = await backend.submit(
            token, text=body.text, agent=body.agent, session_id=body.session_id,
            idempotency_key=key, request_hash=body_hash(body.model_dump()),
            images=[(i.name, _base64(i.data)) for i in body.images],
        )  # fmt: skip
        return JSONResponse(
            {"run_id": done.run_id, "session_id": done.session_id or None, "seq": done.seq,
             "replayed": done.replayed, "events": f"/v1/runs/{done.run_id}/events"},
            status_code=200 if done.replayed else 202,
            headers={"Location": f"/v1/runs/{done.run_id}"},
        )  # fmt: skip

    @app.get("/v1/runs", tags=["runs"])
    async def runs(
        token: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 50
    ) -> dict[str, Any]:
        """The tenant's newest runs (from the timeline projection)."""
        return {"runs": await backend.runs(token.tenant, limit)}

    @app.get("/v1/runs/{run_id}", tags=["runs"])
    async def run(run_id: str, token: Reader) -> dict[str, Any]:
        """A run's state, reply, usage, open approvals and timeline, folded from the log."""
        view = await backend.run(token.tenant, run_id)
        out = asdict(view)
        out.pop("trace")
        out["submitted_at"] = view.submitted_at.isoformat()
        return out

    @app.get(
        "/v1/runs/{run_id}/events",
        tags=["runs"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def events(
        request: Request,
        run_id: str,
        token: Reader,
        after: Annotated[str | None, Query(description="Resume after <seq>[.<delta seq>]")] = None,
        deltas: bool = True,
    ) -> StreamingResponse:
        """Server-Sent Events: the run's events from the start (or after ``after`` /
        ``Last-Event-ID``), then live ones including model text deltas, until the run ends."""
        at = Position.parse(request.headers.get("last-event-id") or after)
        known = await history(backend.log, token.tenant, run_id)
        if not known:
            raise not_found("run", run_id)

        async def stream() -> AsyncIterator[bytes]:
            items = feed(backend.log, token.tenant, run_id, at, known=known, deltas=deltas)
            nxt = asyncio.ensure_future(anext(items, None))
            try:
                while True:
                    done, _ = await asyncio.wait({nxt}, timeout=KEEPALIVE_S)
                    if not done:
                        yield b": keepalive\n\n"
                        continue
                    item = nxt.result()
                    if item is None:
                        return
                    yield sse(item)
                    nxt = asyncio.ensure_future(anext(items, None))
            finally:
                nxt.cancel()  # the client went away, or the feed ended
                with contextlib.suppress(asyncio.CancelledError):
                    await nxt
                await items.aclose()

        return StreamingResponse(
            stream(), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )  # fmt: skip

    @app.websocket("/v1/runs/{run_id}/ws")
    async def websocket(
        ws: WebSocket, run_id: str, after: str | None = None, deltas: bool = True
    ) -> None:
        """The same feed as ``/events`` as JSON text frames (``{"position", "type", "event"}``);
        the server closes with 1000 after the terminal event. Token: header, cookie or
        ``?token=``."""
        auth: Authenticator = ws.app.state.auth
        try:
            presented = bearer(ws.headers.get("authorization")) or ws.query_params.get("token")
            if not presented and ws.cookies.get(COOKIE):
                if not same_origin(ws.headers):
                    raise cross_site(ws.headers)  # another page opening the feed with the cookie
                presented = ws.cookies.get(COOKIE)
            token = await auth.check(auth.token(presented), "read")
            at = Position.parse(after)
            known = await history(backend.log, token.tenant, run_id)
            if not known:
                raise not_found("run", run_id)
        except Problem as exc:
            await ws.send_denial_response(problem_response(exc, ws.url.path))
            return
        await ws.accept()
        try:
            async for item in feed(backend.log, token.tenant, run_id, at, known=known,
                                   deltas=deltas):  # fmt: skip
                await ws.send_text(
                    f'{{"position":"{item.position}","type":"{item.type}","event":{item.data}}}'
                )
            await ws.close(1000)
        except WebSocketDisconnect:
            return

    @app.post("/v1/runs/{run_id}/messages", status_code=202, tags=["runs"],
              openapi_extra=_doc(MessageIn))  # fmt: skip
    async def message(request: Request, run_id: str, token: Submitter) -> dict[str, Any]:
        """Steer (after the current tool call) or follow up (after the turn) a live run."""
        body = await read_body(request, MessageIn)
        appended = await backend.message(token, run_id, body.text, body.mode)
        return {"run_id": run_id, "event_id": appended.event_id, "seq": appended.seq}

    @app.post("/v1/runs/{run_id}/branch", status_code=201, tags=["runs"],
              openapi_extra=_doc(BranchIn))  # fmt: skip
    async def branch(request: Request, run_id: str, token: Submitter) -> dict[str, Any]:
        """Start a new session from any event of the run: it shares the run's history up to
        and including that event. Continue it with ``POST /v1/tasks`` and its ``session_id``."""
        body = await read_body(request, BranchIn)
        branched, appended = await backend.branch(token, run_id, body.at)
        return {"event_id": appended.event_id, "seq": appended.seq, **fork_json(branched)}

    @app.get("/v1/runs/{run_id}/tree", tags=["runs"])
    async def tree(run_id: str, token: Reader) -> dict[str, Any]:
        """Where the run sits in the session tree: the forks that led to its session (oldest
        first) and the branches forked from it, with their runs."""
        return tree_json(await backend.tree(token.tenant, run_id))

    @app.post("/v1/runs/{run_id}/cancel", status_code=202, tags=["runs"],
              openapi_extra=_doc(CancelIn))  # fmt: skip
    async def cancel(request: Request, run_id: str, token: Submitter) -> dict[str, Any]:
        """Cancel a live run (its in-flight tool is aborted). The body may be empty."""
        if request.headers.get("content-length") in (None, "0"):
            body = CancelIn()
        else:
            body = await read_body(request, CancelIn)
        appended = await backend.cancel(token, run_id, body.reason)
        return {"run_id": run_id, "event_id": appended.event_id, "seq": appended.seq}

    @app.get("/v1/approvals", tags=["approvals"])
    async def approvals(token: ApprovalsReader) -> dict[str, Any]:
        """Calls of the tenant's runs waiting for a person (from the audit projection)."""
        return {"approvals": [_plain(r) for r in await backend.approvals(token.tenant)]}

    @app.post("/v1/approvals/{approval_id}/approve", tags=["approvals"],
              openapi_extra=_doc(ApproveIn))  # fmt: skip
    async def approve(request: Request, approval_id: str, token: Approver) -> dict[str, Any]:
        """Approve one call, as the token's holder, signed with the approver key."""
        has_body = request.headers.get("content-length") not in (None, "0")
        body = await read_body(request, ApproveIn) if has_body else ApproveIn()
        answer = await backend.answer(
            token, approval_id, grant=True, remember=body.remember, run_id=body.run_id
        )
        return {"approval_id": answer.approval_id, "result": "granted", "event_id": answer.id,
                "approver": answer.approver, "signer": answer.signer}  # fmt: skip

    @app.post("/v1/approvals/{approval_id}/deny", tags=["approvals"],
              openapi_extra=_doc(DenyIn))  # fmt: skip
    async def deny(request: Request, approval_id: str, token: Approver) -> dict[str, Any]:
        """Deny one call; the agent is told it was refused and why."""
        has_body = request.headers.get("content-length") not in (None, "0")
        body = await read_body(request, DenyIn) if has_body else DenyIn()
        answer = await backend.answer(
            token, approval_id, grant=False, reason=body.reason, run_id=body.run_id
        )
        return {"approval_id": answer.approval_id, "result": "denied", "event_id": answer.id,
                "approver": answer.approver, "signer": answer.signer}  # fmt: skip

    @app.get("/v1/audit", tags=["audit"])
    async def audit(
        token: Reader,
        run: str | None = None,
        call: str | None = None,
        tool: str | None = None,
        status: str | None = None,
        since: str | None = None,
        violations: bool = False,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        """The audit with ``nanocrab audit``'s filters: ``run``, ``call``, ``tool``, ``status``,
        ``since`` (10m, 2h, 1d or an ISO time), ``limit`` (the newest); ``violations=true``
        lists refused forgeries instead."""
        when = _since(since)
        if violations:
            rows: list[Any] = await backend.violations(token.tenant, run_id=run, since=when)
            return {"violations": [_plain(r) for r in rows]}
        if status is not None and status not in STATUSES:
            raise Problem(422, "invalid-request", "Unknown status", f"use {', '.join(STATUSES)}")
        rows = await backend.audit(
            token.tenant, run_id=run, call_id=call, tool=tool, status=status, since=when,
            limit=limit,
        )  # fmt: skip
        return {"calls": [{**_plain(r), "duration_ms": r.duration_ms} for r in rows]}

    @app.get("/v1/capabilities", tags=["capabilities"])
    async def capabilities(token: Reader) -> dict[str, Any]:
        """The registry of generated capabilities (name, version, enabled, safety level)."""
        return {"capabilities": [_plain(r) for r in await backend.capabilities()]}

    if web:
        from nanocrab.gateway.web import mount

        mount(app, backend)
    return app


def _base64(data: str) -> bytes:
    """A task image's bytes; 422 when ``data`` is not base64."""
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise Problem(422, "bad-image", "An image is not base64", str(exc)) from exc


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_since(text)
    except ValueError:
        raise Problem(
            422, "invalid-request", "Bad 'since'", f"{text!r}: use 10m, 2h, 1d or an ISO time"
        ) from None

