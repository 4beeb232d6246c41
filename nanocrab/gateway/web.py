"""The web view: server-rendered pages (jinja2) over the same backend as the API, plus one
small script (static/app.js) for the live parts — no build toolchain.

Pages: runs (with a submit box), a run's timeline (live over SSE, approve/deny buttons on its
open approvals), approvals waiting, the audit with ``nanocrab audit``'s filters, the capability
registry. A browser signs in by pasting an API token once (``/login``): the gateway checks it
and keeps it in an ``HttpOnly``, ``SameSite=Strict`` cookie, which the API accepts like a bearer
token. Buttons call the JSON API with ``fetch``; a cross-site page can neither read the cookie
nor send it with a JSON request.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from nanocrab.gateway.auth import COOKIE, Authenticator
from nanocrab.gateway.bodies import read_body
from nanocrab.gateway.errors import Problem
from nanocrab.gateway.filters import parse_since
from nanocrab.gateway.service import Backend
from nanocrab.gateway.tokens import Token
from nanocrab.projections.audit import STATUSES

_IDENT = re.compile(r"[A-Za-z0-9_-]{1,128}")


class LoginIn(BaseModel):
    token: str = Field(max_length=200)


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("nanocrab.gateway", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    undefined=jinja2.StrictUndefined,
)


def _render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(name).render(**context), status_code=status)


def _ident(value: str | None) -> str | None:
    """An id from a query string, or ``None`` when absent or not shaped like one."""
    return value if value and _IDENT.fullmatch(value) else None


def mount(app: FastAPI, backend: Backend) -> None:
    """Add the pages and ``/static`` to ``app``."""
    app.mount("/static", StaticFiles(packages=[("nanocrab.gateway", "static")]), name="static")

    async def who(request: Request) -> Token | None:
        auth: Authenticator = request.app.state.auth
        presented = request.cookies.get(COOKIE)
        if not presented:
            return None
        try:
            return await auth.check(auth.token(presented), "read")
        except Problem as exc:
            if exc.status == 401:
                return None
            raise

    def page(request: Request, name: str, token: Token, **context: Any) -> HTMLResponse:
        return _render(name, token=token, path=request.url.path, **context)

    @app.get("/login", include_in_schema=False)
    async def login_page(request: Request) -> HTMLResponse:
        return _render("login.html", token=None, path="/login", error="")

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        auth: Authenticator = request.app.state.auth
        try:
            presented = (await read_body(request, LoginIn)).token
            token = await auth.check(auth.token(presented), "read")
        except Problem as exc:
            return JSONResponse(exc.body("/login"), status_code=exc.status,
                                media_type="application/problem+json")  # fmt: skip
        response = JSONResponse({"name": token.name, "tenant": token.tenant})
        response.set_cookie(COOKIE, presented, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/")  # fmt: skip
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/", include_in_schema=False)
    async def runs_page(request: Request) -> Response:
        token = await who(request)
        if token is None:
            return RedirectResponse("/login", status_code=303)
        # ?session=…&from=…: after "Branch" on a run's timeline, the next task continues it
        session, origin = (_ident(request.query_params.get(k)) for k in ("session", "from"))
        return page(request, "runs.html", token, runs=await backend.runs(token.tenant, 100),
                    session=session, branched_from=origin)  # fmt: skip

    @app.get("/runs/{run_id}", include_in_schema=False)
    async def run_page(request: Request, run_id: str) -> Response:
        token = await who(request)
        if token is None:
            return RedirectResponse("/login", status_code=303)
        view = await backend.run(token.tenant, run_id)
        tree = await backend.tree(token.tenant, run_id)
        return page(request, "run.html", token, run=view, tree=tree)

    @app.get("/approvals", include_in_schema=False)
    async def approvals_page(request: Request) -> Response:
        token = await who(request)
        if token is None:
            return RedirectResponse("/login", status_code=303)
        rows = [asdict(r) for r in await backend.approvals(token.tenant)]
        return page(request, "approvals.html", token, approvals=rows)

    @app.get("/audit", include_in_schema=False)
    async def audit_page(request: Request) -> Response:
        token = await who(request)
        if token is None:
            return RedirectResponse("/login", status_code=303)
        q = {k: (request.query_params.get(k) or None) for k in ("run", "tool", "status", "since")}
        error = ""
        try:
            since = parse_since(q["since"]) if q["since"] else None
        except ValueError:
            since, error = None, f"since {q['since']!r}: use 10m, 2h, 1d or an ISO time"
        status = q["status"] if q["status"] in STATUSES else None
        rows = await backend.audit(
            token.tenant, run_id=q["run"], call_id=None, tool=q["tool"], status=status,
            since=since, limit=500,
        )  # fmt: skip
        return page(request, "audit.html", token, rows=rows, q=q, statuses=STATUSES, error=error)

    @app.get("/capabilities", include_in_schema=False)
    async def capabilities_page(request: Request) -> Response:
        token = await who(request)
        if token is None:
            return RedirectResponse("/login", status_code=303)
        return page(request, "capabilities.html", token, rows=await backend.capabilities())
