"""The Telegram channel (python-telegram-bot's ``Bot``, long polling ``getUpdates``).

A chat is a session; a message is a task in it; the reply streams into one message, edited as
the model's text and tool calls arrive; an approval is a message with Approve / Deny inline
buttons, answered — signed with the approver key, as ``<name> (telegram)`` — only when the person
pressing is one of :attr:`TelegramConfig.approvers`. ``/new`` starts a fresh session (the
orchestrator archives the old one and names the next), ``/help`` is answered by the
orchestrator like any command. People not in :attr:`TelegramConfig.users` are told so and
nothing reaches the bus.

Tested against a fake Bot API server on loopback (tests/test_telegram.py): ``base_url`` points
the library at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from telegram import Bot, CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message
from telegram.error import BadRequest, TelegramError

from nanocrab.bus import read
from nanocrab.events import SessionArchived, new_event_id
from nanocrab.gateway.errors import Problem
from nanocrab.gateway.live import Position, feed, history
from nanocrab.gateway.service import Backend
from nanocrab.gateway.tokens import Scope, Token

log = logging.getLogger(__name__)

MAX_TEXT = 4000
"""Telegram refuses messages over 4096 characters; the streamed reply keeps its tail."""


@dataclass(frozen=True, kw_only=True)
class TelegramConfig:
    """Who may use the bot. ``users``: Telegram user id → the name recorded in the log;
    ``approvers``: those of them whose button presses answer approvals."""

    tenant: str = "default"
    users: Mapping[int, str]
    approvers: frozenset[int] = frozenset()
    edit_interval_s: float = 1.0
    """At most one edit of the streamed reply per this many seconds (Telegram rate-limits
    edits); the final text is always written."""
    poll_timeout_s: int = 20


@dataclass
class _Reply:
    """The message a run's answer streams into."""

    message: Message
    shown: str = ""
    lines: list[str] = field(default_factory=list)
    text: str = ""
    edited_at: float = 0.0


class TelegramChannel:
    """Polls ``bot`` for updates and serves them through ``backend`` until :meth:`stop`."""

    def __init__(self, bot: Bot, backend: Backend, config: TelegramConfig) -> None:
        self.bot = bot
        self.backend = backend
        self.config = config
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: dict[str, str] = {}
        """approval id → the run that asked (a press is answered from the run's log at once;
        the audit projection, which may lag a moment, is the fallback after a restart)."""

    def principal(self, user_id: int) -> Token | None:
        name = self.config.users.get(user_id)
        if name is None:
            return None
        scopes: tuple[Scope, ...] = ("submit", "read")
        if user_id in self.config.approvers:
            scopes = (*scopes, "approve")
        return Token(
            id=f"telegram:{user_id}", tenant=self.config.tenant, name=name, scopes=scopes,
            rate="", created_at=datetime.now(UTC), revoked_at=None,
        )  # fmt: skip

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Long-poll updates; each is handled in its own task (a run being followed never holds
        up the next message or a button press)."""
        offset: int | None = None
        while not self._stop.is_set():
            try:
                updates = await self.bot.get_updates(
                    offset=offset, timeout=self.config.poll_timeout_s,
                    allowed_updates=["message", "callback_query"],
                )  # fmt: skip
            except TelegramError as exc:
                log.warning("telegram getUpdates failed (retrying): %s", exc)
                await asyncio.sleep(1.0)
                continue
            for update in updates:
                offset = update.update_id + 1
                if update.message is not None and update.message.text:
                    self._spawn(self.on_message(update.message))
                elif update.callback_query is not None:
                    self._spawn(self.on_button(update.callback_query))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("telegram handler failed", exc_info=task.exception())

    def _channel(self, chat_id: int) -> str:
        return f"telegram:{self.config.tenant}:{chat_id}"

    def session(self, chat_id: int) -> str:
        """The chat's session, created on first use and kept in the token store."""
        key = self._channel(chat_id)
        current = self.backend.tokens.session(key)
        if current is None:
            current = new_event_id()
            self.backend.tokens.set_session(key, current)
        return current

    async def on_message(self, message: Message) -> None:
        user = message.from_user
        who = self.principal(user.id) if user is not None else None
        if who is None:
            await message.reply_text("You are not allowed to use this bot.")
            return
        text = (message.text or "").strip()
        session = self.session(message.chat_id)
        done = await self.backend.submit(
            who, text=text, agent="default", session_id=session, idempotency_key=None,
            request_hash="",
        )  # fmt: skip
        reply = _Reply(await message.reply_text("…"))
        await self.follow(who, done.run_id, reply)
        if text.split()[0] == "/new":
            await self._move_session(message.chat_id, session)

    async def _move_session(self, chat_id: int, old: str) -> None:
        subject = self.backend.log.subjects.session(old, tenant=self.config.tenant)
        async for s in read(self.backend.log, subject):
            if isinstance(s.event, SessionArchived) and s.event.next_session_id:
                self.backend.tokens.set_session(self._channel(chat_id), s.event.next_session_id)

    async def follow(self, who: Token, run_id: str, reply: _Reply) -> None:
        """Stream the run into ``reply`` until it ends; approvals become button messages."""
        known = await history(self.backend.log, who.tenant, run_id)
        async for item in feed(self.backend.log, who.tenant, run_id, Position(), known=known):
            data = _data(item.data)
            match item.type:
                case "llm.requested":
                    reply.text = ""
                case "llm.delta":
                    reply.text += str(data.get("text", ""))
                case "llm.responded" | "agent.responded":
                    said = " ".join(
                        str(b.get("text", "")) for b in data.get("content", [])
                        if b.get("type") == "text"
                    )  # fmt: skip
                    if said.strip():
                        reply.lines.append(said.strip())
                    reply.text = ""
                case "tool.requested":
                    reply.lines.append(f"→ {data.get('tool')}")
                case "approval.requested":
                    self._runs[str(data.get("approval_id"))] = run_id
                    await self._ask(reply.message, data)
                case "run.completed":
                    await self._edit(reply, str(data.get("reply", "")), final=True)
                    return
                case "run.failed":
                    await self._edit(reply, f"The run failed ({data.get('kind')}): "
                                            f"{data.get('reason')}", final=True)  # fmt: skip
                    return
                case "run.cancelled":
                    await self._edit(reply, f"Cancelled: {data.get('reason')}", final=True)
                    return
                case _:
                    continue
            await self._edit(reply, "\n".join([*reply.lines, reply.text]).strip() or "…")

    async def _edit(self, reply: _Reply, text: str, *, final: bool = False) -> None:
        text = text[-MAX_TEXT:] or "…"
        now = time.monotonic()
        soon = now - reply.edited_at < self.config.edit_interval_s
        if text == reply.shown or (soon and not final):
            return
        with contextlib.suppress(BadRequest):  # "message is not modified": nothing to do
            await reply.message.edit_text(text)
        reply.shown, reply.edited_at = text, now

    async def _ask(self, message: Message, data: dict[str, Any]) -> None:
        approval = str(data.get("approval_id"))
        buttons = InlineKeyboardMarkup([[
            InlineKeyboardButton("Approve", callback_data=f"ap:{approval}"),
            InlineKeyboardButton("Deny", callback_data=f"dn:{approval}"),
        ]])  # fmt: skip
        await message.reply_text(
            f"Needs approval ({data.get('tier')}): {data.get('tool')} {data.get('arguments')}\n"
            f"{data.get('reason')}",
            reply_markup=buttons,
        )

    async def on_button(self, query: CallbackQuery) -> None:
        verb, _, approval = (query.data or "").partition(":")
        who = self.principal(query.from_user.id)
        if who is None or "approve" not in who.scopes or verb not in ("ap", "dn"):
            await query.answer("You may not answer approvals.", show_alert=True)
            return
        try:
            answer = await self.backend.answer(
                who, approval, grant=verb == "ap", reason="denied in Telegram", via="telegram",
                run_id=self._runs.get(approval),
            )  # fmt: skip
        except Problem as exc:
            await query.answer(exc.detail or exc.title, show_alert=True)
            return
        result = "approved" if verb == "ap" else "denied"
        await query.answer(result)
        if isinstance(query.message, Message):
            with contextlib.suppress(BadRequest):
                note = f"{result} by {answer.approver}"
                await query.message.edit_text(f"{query.message.text}\n\n{note}")


def _data(wire: str) -> dict[str, Any]:
    """The ``data`` member of a CloudEvents item."""
    import json

    value = json.loads(wire)
    data = value.get("data") if isinstance(value, dict) else None
    return data if isinstance(data, dict) else {}
