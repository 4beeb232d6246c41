"""``nanocrab gateway`` (serve the HTTP gateway and web view) and ``nanocrab gateway token``
(create, list, revoke API tokens). Declares the commands only: FastAPI, uvicorn and the bus are
imported when one runs, so ``nanocrab --help`` stays fast (tests/test_cli_lazy.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit, setup

if TYPE_CHECKING:
    from fastapi import FastAPI

    from nanocrab.cli.host import BusSession
    from nanocrab.cli.settings import Settings
    from nanocrab.gateway import TokenStore
    from nanocrab.gateway.service import Backend

gateway_app = typer.Typer(
    help="The HTTP/SSE/WebSocket gateway and web view (docs/gateway.md); `token` manages its "
    "API tokens.",
    invoke_without_command=True,
)
token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)
gateway_app.add_typer(token_app, name="token")
app.add_typer(gateway_app, name="gateway")


def token_store(settings: Settings) -> TokenStore:
    """The data directory's tokens (``<home>/gateway.db``, hashed)."""
    from nanocrab.gateway import TokenStore

    return TokenStore(settings.home / "gateway.db")


@contextlib.asynccontextmanager
async def gateway_app_for(settings: Settings, bus: BusSession) -> AsyncIterator[FastAPI]:
    """The gateway's app on :func:`backend_for`'s backend."""
    from nanocrab.gateway.app import create_app

    async with backend_for(settings, bus) as backend:
        yield create_app(backend)


@contextlib.asynccontextmanager
async def backend_for(settings: Settings, bus: BusSession) -> AsyncIterator[Backend]:
    """The gateway's backend on ``bus`` (also the Telegram channel's): publishing as
    ``gateway``, answering approvals as ``approver`` with this data directory's approver key,
    reading the projections in ``settings.db_url`` (created and brought up to date here when no
    ``nanocrab up`` serves the data directory: one does that itself)."""
    from nanocrab.bus.permissions import APPROVER, GATEWAY
    from nanocrab.cli.host import RuntimeMarker, engine_for
    from nanocrab.gateway.service import Backend
    from nanocrab.projections import catch_up_projection
    from nanocrab.security import KeyRing

    log = await bus.open(GATEWAY)
    approver = await bus.open(APPROVER)
    engine = engine_for(settings.db_url)
    tokens = token_store(settings)
    try:
        if not RuntimeMarker(settings.home).alive():
            for name in ("run_timeline", "audit", "capabilities"):
                await catch_up_projection(log, engine, name)
        keypair = KeyRing(settings.keys_dir).keypair(APPROVER)
        yield Backend(log, approver, keypair, engine, tokens)
    finally:
        tokens.close()
        await engine.dispose()


@gateway_app.callback()
def gateway(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8787,
) -> None:
    """Serve the HTTP gateway and the web view until Ctrl-C (`nanocrab up` serves it too when
    NANOCRAB_GATEWAY=host:port is set). Tasks run when a `nanocrab up` serves the data dir."""
    if ctx.invoked_subcommand is not None:
        return
    from nanocrab.cli.common import until_signalled
    from nanocrab.cli.host import bus_connector
    from nanocrab.gateway.server import serving

    settings = settings_or_exit()
    setup(settings, "nanocrab-gateway")

    async def main() -> None:
        async with (
            bus_connector(settings.bus(), name="nanocrab-gateway", sync=settings.sync) as bus,
            gateway_app_for(settings, bus) as web,
            serving(web, host, port),
        ):
            console.print(f"[bold green]nanocrab gateway[/] on http://{host}:{port} · Ctrl-C stops")
            await until_signalled(_forever())
        console.print("[green]gateway stopped[/]")

    run_async(main())


async def _forever() -> None:
    import asyncio

    await asyncio.Event().wait()


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="Who it is for (recorded as the approver).")],
    scope: Annotated[
        list[str],
        typer.Option("--scope", "-s", help="submit, read, approve or admin (repeat for more)."),
    ],
    tenant: Annotated[str, typer.Option(help="The tenant its tasks and reads belong to.")] = (
        "default"
    ),
    rate: Annotated[
        str, typer.Option(help="Rate limit, e.g. '20/second;600/minute'.")
    ] = "20/second;600/minute",
    json_: JsonOpt = False,
) -> None:
    """Create a token; prints it once (only its hash is stored)."""
    import json

    from nanocrab.gateway import GatewayError

    store = token_store(settings_or_exit())
    try:
        token, secret = store.create(tenant=tenant, name=name, scopes=scope, rate=rate)
    except GatewayError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    finally:
        store.close()
    if json_:
        shown = {"id": token.id, "token": secret, "tenant": token.tenant, "name": token.name,
                 "scopes": list(token.scopes), "rate": token.rate}  # fmt: skip
        print(json.dumps(shown))
        return
    console.print(f"token [bold]{token.id}[/] for {name} (tenant {tenant}, "
                  f"{' '.join(token.scopes)}, {rate}) — shown once:")  # fmt: skip
    print(secret)


@token_app.command("list")
def token_list(json_: JsonOpt = False) -> None:
    """Every token (never the secret): id, tenant, name, scopes, rate, created, revoked."""
    import json

    from rich.table import Table

    store = token_store(settings_or_exit())
    try:
        tokens = store.list()
    finally:
        store.close()
    if json_:
        for t in tokens:
            row = {"id": t.id, "tenant": t.tenant, "name": t.name, "scopes": list(t.scopes),
                   "rate": t.rate, "created_at": t.created_at.isoformat(),
                   "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None}  # fmt: skip
            print(json.dumps(row))
        return
    table = Table(title="gateway tokens", title_justify="left")
    for col in ("id", "tenant", "name", "scopes", "rate", "created", "revoked"):
        table.add_column(col)
    for t in tokens:
        table.add_row(t.id, t.tenant, t.name, " ".join(t.scopes), t.rate,
                      f"{t.created_at:%Y-%m-%d %H:%M}",
                      f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "")  # fmt: skip
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(help="The token's id.")]) -> None:
    """Revoke a token: refused from the gateway's next request on."""
    store = token_store(settings_or_exit())
    try:
        done = store.revoke(token_id)
    finally:
        store.close()
    if not done:
        err.print(f"[red]no live token {token_id!r}[/]; see `nanocrab gateway token list`")
        raise typer.Exit(1)
    console.print(f"revoked {token_id}")


@gateway_app.command("telegram")
def telegram(
    user: Annotated[
        list[str],
        typer.Option("--user", "-u", help="A Telegram user id allowed to use the bot, as ID=NAME "
                     "(NAME is recorded in the log); repeat for more."),
    ],
    approver: Annotated[
        list[int] | None,
        typer.Option("--approver", "-a", help="A user id (of --user) whose button presses answer "
                     "approvals; repeat for more."),
    ] = None,
    tenant: Annotated[str, typer.Option(help="The tenant of the chats' tasks.")] = "default",
    base_url: Annotated[
        str | None, typer.Option(help="The Bot API base URL (a local Bot API server, a test fake).")
    ] = None,
) -> None:
    """Serve a Telegram bot until Ctrl-C: a chat is a session, a message a task, the reply
    streamed by editing, approvals as inline buttons. The bot token is read from
    TELEGRAM_BOT_TOKEN."""
    import os

    from nanocrab.cli.common import until_signalled
    from nanocrab.cli.host import bus_connector

    secret = os.environ.get("TELEGRAM_BOT_TOKEN", "")
    if not secret:
        err.print("[red]set TELEGRAM_BOT_TOKEN[/] to the token @BotFather gave you")
        raise typer.Exit(2)
    users: dict[int, str] = {}
    for item in user:
        ident, _, name = item.partition("=")
        if not ident.strip().lstrip("-").isdigit() or not name.strip():
            err.print(f"[red]--user {item!r}[/]: use ID=NAME, e.g. --user 123456789=alice")
            raise typer.Exit(2)
        users[int(ident)] = name.strip()
    approvers = frozenset(approver or ())
    if not approvers <= set(users):
        err.print("[red]every --approver must also be a --user[/]")
        raise typer.Exit(2)
    settings = settings_or_exit()
    setup(settings, "nanocrab-telegram")

    async def main() -> None:
        from telegram import Bot

        from nanocrab.channels.telegram import TelegramChannel, TelegramConfig

        config = TelegramConfig(tenant=tenant, users=users, approvers=approvers)
        bot = Bot(secret, base_url=base_url) if base_url else Bot(secret)
        async with (
            bus_connector(settings.bus(), name="nanocrab-telegram", sync=settings.sync) as bus,
            backend_for(settings, bus) as backend,
            bot,
        ):
            channel = TelegramChannel(bot, backend, config)
            console.print(f"[bold green]telegram channel[/] for {len(users)} users · Ctrl-C stops")
            await until_signalled(channel.run())
        console.print("[green]telegram channel stopped[/]")

    run_async(main())
