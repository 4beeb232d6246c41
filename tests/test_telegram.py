"""The Telegram channel against a fake Bot API server on loopback (no real network) and a real
``nanocrab up``: a chat's message becomes a task, the reply streams by editing one message, a
Guarded call is a message with inline buttons that only an approver's press answers (signed,
recorded as ``<name> (telegram)``), strangers are turned away, ``/new`` moves the chat to a new
session."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qsl

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nanocrab.bus.server import free_port
from tests.conftest import eventually
from tests.test_gateway import Gateway, running_gateway

BOT_TOKEN = "123456:fake-token"
ALICE, MALLORY, STRANGER = 1001, 2002, 3003
CHAT = 42


class FakeBotApi:
    """The Bot API methods the channel uses, kept in memory; records every call."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[int, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.update_ids = itertools.count(1)
        self.arrived = asyncio.Event()
        self.app = FastAPI()
        self.app.post("/bot{token}/{method}")(self.handle)

    def user(self, uid: int) -> dict[str, Any]:
        return {"id": uid, "is_bot": False, "first_name": f"user{uid}"}

    def say(self, uid: int, text: str) -> None:
        message = {"message_id": next(self.ids), "date": int(time.time()),
                   "chat": {"id": CHAT, "type": "private"}, "from": self.user(uid), "text": text}  # fmt: skip
        self._push({"message": message})

    def press(self, uid: int, message: dict[str, Any], data: str) -> None:
        self._push({"callback_query": {"id": str(next(self.ids)), "from": self.user(uid),
                                       "chat_instance": "c", "data": data, "message": message}})  # fmt: skip

    def _push(self, update: dict[str, Any]) -> None:
        self.updates.append({"update_id": next(self.update_ids), **update})
        self.arrived.set()

    def sent(self, method: str) -> list[dict[str, Any]]:
        return [p for m, p in self.calls if m == method]

    async def handle(self, token: str, method: str, request: Request) -> JSONResponse:
        assert token == BOT_TOKEN, token
        raw = (await request.body()).decode()
        params: dict[str, Any] = {}
        for k, v in parse_qsl(raw):
            try:
                params[k] = json.loads(v)
            except ValueError:
                params[k] = v
        self.calls.append((method, params))
        return JSONResponse({"ok": True, "result": await self.result(method, params)})

    async def result(self, method: str, p: dict[str, Any]) -> Any:
        if method == "getMe":
            return {"id": 1, "is_bot": True, "first_name": "crab", "username": "crab_bot"}
        if method == "getUpdates":
            offset = int(p.get("offset") or 0)
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
            if not self.updates:
                self.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), 0.5)
            return self.updates
        if method == "sendMessage":
            message = {"message_id": next(self.ids), "date": int(time.time()),
                       "chat": {"id": int(p["chat_id"]), "type": "private"},
                       "from": {"id": 1, "is_bot": True, "first_name": "crab"},
                       "text": p["text"]}  # fmt: skip
            if "reply_markup" in p:
                message["reply_markup"] = p["reply_markup"]
            self.messages[message["message_id"]] = message
            return message
        if method == "editMessageText":
            message = self.messages[int(p["message_id"])]
            message["text"] = p["text"]
            return message
        return True


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("telegram")) as gateway:
        yield gateway


@contextlib.asynccontextmanager
async def channel(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeBotApi]:
    from telegram import Bot

    from nanocrab.channels.telegram import TelegramChannel, TelegramConfig
    from nanocrab.cli.gateway import backend_for
    from nanocrab.cli.host import bus_connector
    from nanocrab.cli.settings import Settings
    from nanocrab.gateway.server import serving

    for k, v in gw.env.items():
        if k.startswith("NANOCRAB_"):
            monkeypatch.setenv(k, v)
    settings = Settings.from_env()
    fake = FakeBotApi()
    port = free_port()
    config = TelegramConfig(users={ALICE: "alice", MALLORY: "mallory"}, approvers=frozenset({ALICE}),
                            edit_interval_s=0.0, poll_timeout_s=1)  # fmt: skip
    async with (
        serving(fake.app, "127.0.0.1", port),
        bus_connector(settings.bus(), name="test-telegram", identity="gateway") as bus,
        backend_for(settings, bus) as backend,
        Bot(BOT_TOKEN, base_url=f"http://127.0.0.1:{port}/bot") as bot,
    ):
        tg = TelegramChannel(bot, backend, config)
        task = asyncio.create_task(tg.run())
        try:
            yield fake
        finally:
            tg.stop()
            await asyncio.wait_for(task, 10)


async def test_a_chat_runs_tasks_streams_replies_and_approves_with_buttons(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with channel(gw, monkeypatch) as tg:
        tg.say(STRANGER, "please write a note")

        async def turned_away() -> bool:
            return any("not allowed" in p["text"] for p in tg.sent("sendMessage"))

        await eventually(turned_away, timeout=15)

        tg.say(ALICE, "please write a note")

        async def buttons() -> dict[str, Any] | None:
            return next((m for m in tg.messages.values() if "reply_markup" in m), None)

        ask = await eventually(buttons, timeout=60)
        keyboard = ask["reply_markup"]["inline_keyboard"][0]
        assert [b["text"] for b in keyboard] == ["Approve", "Deny"]
        assert "write" in ask["text"] and "guarded" in ask["text"]
        approve = keyboard[0]["callback_data"]

        tg.press(MALLORY, ask, approve)  # a user, but not an approver

        async def refused() -> bool:
            return any("may not" in str(p.get("text")) for p in tg.sent("answerCallbackQuery"))

        await eventually(refused, timeout=15)
        tg.press(ALICE, ask, approve)
        reply_ids = [m["message_id"] for m in tg.messages.values() if m["text"] != ask["text"]]

        async def answered() -> dict[str, Any] | None:
            return next((tg.messages[i] for i in reply_ids
                         if tg.messages[i]["text"] == "Wrote note.txt."), None)  # fmt: skip

        reply = await eventually(answered, timeout=60)
        edits = [p for p in tg.sent("editMessageText") if p["message_id"] == reply["message_id"]]
        assert len(edits) >= 2, "the reply streamed: edited as the run went, then the answer"
        assert any("→ write" in e["text"] for e in edits), "tool calls shown while running"
        assert "approved by alice (telegram)" in tg.messages[ask["message_id"]]["text"]
        assert (gw.home.parent / "note.txt").read_text() == "hello from the gateway"

        async with gw.client("alice") as c:

            async def audited() -> dict[str, Any] | None:
                rows = (await c.get("/v1/audit", params={"tool": "write"})).json()["calls"]
                return next((r for r in rows if r["approver"]
                             and r["approver"].startswith("alice (telegram)")), None)  # fmt: skip

            row = await eventually(audited, timeout=60)
        assert row["approval_result"] == "granted"


async def test_new_moves_the_chat_to_a_fresh_session(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanocrab.gateway import TokenStore

    store = TokenStore(gw.home / "gateway.db")
    key = f"telegram:default:{CHAT}"
    async with channel(gw, monkeypatch) as tg:
        tg.say(ALICE, "hello crab")

        async def first_session() -> str | None:
            return store.session(key)

        before = await eventually(first_session, timeout=15)
        tg.say(ALICE, "/new")

        async def moved() -> str | None:
            now = store.session(key)
            return now if now and now != before else None

        after = await eventually(moved, timeout=60)
    store.close()
    assert after != before


async def test_the_telegram_command_serves_a_bot(gw: Gateway) -> None:
    """``nanocrab gateway telegram`` as a user starts it, beside ``nanocrab up``."""
    import signal
    import sys

    from nanocrab.gateway.server import serving

    fake = FakeBotApi()
    port = free_port()
    async with serving(fake.app, "127.0.0.1", port):
        bad = await asyncio.to_thread(gw.cli, "gateway", "telegram", "--user", "x")
        assert bad.returncode == 2 and "TELEGRAM_BOT_TOKEN" in bad.stderr
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nanocrab", "gateway", "telegram", "--user", f"{ALICE}=alice",
            "--approver", str(ALICE), "--base-url", f"http://127.0.0.1:{port}/bot",
            cwd=gw.home.parent, env={**gw.env, "TELEGRAM_BOT_TOKEN": BOT_TOKEN},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        fake.say(ALICE, "hello from telegram")

        async def answered() -> bool:
            if proc.returncode is not None:
                return True  # it died: the assertions below say why
            return any("I received your task: hello from telegram" in m["text"]
                       for m in fake.messages.values())  # fmt: skip

        try:
            await eventually(answered, timeout=90)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "telegram channel stopped" in out.decode()
    assert any("I received your task" in m["text"] for m in fake.messages.values()), err.decode()
