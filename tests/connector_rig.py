"""Servers on loopback for the connector tests: a minimal IMAP4rev1 server written here with
asyncio (CAPABILITY, LOGIN, SELECT/EXAMINE, UID SEARCH, UID FETCH, NOOP, LOGOUT), a real SMTP
server (aiosmtpd) with AUTH, and the connectors.yaml / credentials.yaml that point at them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

USER = "me@example.org"
PASSWORD = "pa55-Word-never-logged-7f3a"  # the secret: must appear in no event, row or log
CREDENTIAL = "work-mail"
_TOKEN = re.compile(r'"((?:\\.|[^"\\])*)"|(\S+)')


def message(uid: int, sender: str, subject: str, body: str, *, html: bool = False) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = USER
    msg["Subject"] = subject
    msg["Date"] = f"Mon, 0{uid} Jun 2026 09:00:00 +0000"
    if html:
        msg.set_content(f"<p>{body}</p>", subtype="html")
    else:
        msg.set_content(body)
    return bytes(msg)


@dataclass
class Mail:
    uid: int
    raw: bytes
    seen: bool = False


@dataclass
class ImapServer:
    """A mailbox server: ``boxes`` (name → messages); ``commands`` as received."""

    boxes: dict[str, list[Mail]]
    password: str = PASSWORD
    capabilities: str = "IMAP4rev1"  # "IMAP4rev1 AUTH=PLAIN": AUTHENTICATE PLAIN as well
    commands: list[str] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        selected: list[Mail] | None = None
        authed = False

        def send(text: str | bytes) -> None:
            writer.write(text.encode() if isinstance(text, str) else text)

        send("* OK fixture ready\r\n")
        try:
            while line := (await reader.readline()).decode().rstrip("\r\n"):
                tag, _, rest = line.partition(" ")
                command, _, args = rest.partition(" ")
                command = command.upper()
                self.commands.append(f"{command} {args}".strip())
                words = [q if q is not None and w == "" else w for q, w in _TOKEN.findall(args)]
                if command == "CAPABILITY":
                    send(f"* CAPABILITY {self.capabilities}\r\n{tag} OK done\r\n")
                elif command == "NOOP":
                    send(f"{tag} OK done\r\n")
                elif command == "LOGOUT":
                    send(f"* BYE bye\r\n{tag} OK done\r\n")
                    break
                elif command == "LOGIN":
                    authed = words == [USER, self.password]
                    send(
                        f"{tag} OK logged in\r\n"
                        if authed
                        else f"{tag} NO [AUTHENTICATIONFAILED] bad\r\n"
                    )
                elif command == "AUTHENTICATE" and "AUTH=PLAIN" in self.capabilities:
                    send("+ \r\n")
                    await writer.drain()
                    answer = base64.b64decode(await reader.readline())
                    _, user, password = answer.decode().split("\0")
                    authed = user == USER and password == self.password
                    send(
                        f"{tag} OK in\r\n" if authed else f"{tag} NO [AUTHENTICATIONFAILED] bad\r\n"
                    )
                elif not authed:
                    send(f"{tag} BAD log in first\r\n")
                elif command in ("SELECT", "EXAMINE"):
                    box = self.boxes.get(words[0]) if words else None
                    if box is None:
                        send(f"{tag} NO no such mailbox\r\n")
                        continue
                    selected = box
                    send(
                        f"* {len(box)} EXISTS\r\n* FLAGS (\\Seen)\r\n{tag} OK [READ-ONLY] done\r\n"
                    )
                elif command == "UID" and selected is not None:
                    send(self._uid(tag, words, selected))
                else:
                    send(f"{tag} BAD unsupported\r\n")
                await writer.drain()
        finally:
            writer.close()

    def _uid(self, tag: str, words: list[str], box: list[Mail]) -> bytes:
        sub = words[0].upper()
        if sub == "SEARCH":
            unseen = len(words) > 1 and words[1].upper() == "UNSEEN"
            found = [str(m.uid) for m in box if not (unseen and m.seen)]
            return f"* SEARCH {' '.join(found)}\r\n{tag} OK done\r\n".encode()
        if sub == "FETCH":
            wanted = _uid_set(words[1])
            items = " ".join(words[2:]).upper()
            out = b""
            for seq, mail in enumerate(box, 1):
                if mail.uid not in wanted:
                    continue
                if "HEADER" in items:
                    part, data = "BODY[HEADER]", mail.raw.split(b"\n\n", 1)[0] + b"\n\n"
                else:
                    part, data = "BODY[]", mail.raw
                flags = "\\Seen" if mail.seen else ""
                head = f"* {seq} FETCH (UID {mail.uid} FLAGS ({flags}) {part} {{{len(data)}}}\r\n"
                out += head.encode() + data + b")\r\n"
            return out + f"{tag} OK done\r\n".encode()
        return f"{tag} BAD unsupported\r\n".encode()


def _uid_set(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition(":")
        out.update(range(int(low), int(high or low) + 1))
    return out


@dataclass
class SmtpServer:
    """What the SMTP server received: envelopes, and the logins it was offered."""

    received: list[Envelope] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    port: int = 0

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.received.append(envelope)
        return "250 OK"

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        login, password = data.login.decode(), data.password.decode()
        self.logins.append((login, password))
        return AuthResult(success=login == USER and password == PASSWORD)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def smtp_server() -> Iterator[SmtpServer]:
    state = SmtpServer(port=free_port())
    controller = Controller(
        state, hostname="127.0.0.1", port=state.port, authenticator=state.authenticate,
        auth_require_tls=False,
    )  # fmt: skip
    controller.start()
    try:
        yield state
    finally:
        controller.stop()


def write_config(
    home: Path, *, imap_port: int, smtp_port: int, calendar: Path, in_file: bool = True
) -> Path:
    """connectors.yaml (and, with ``in_file``, credentials.yaml mode 600) in ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "connectors.yaml"
    path.write_text(
        f"""version: 1
mail:
  work:
    address: {USER}
    password: {CREDENTIAL}
    imap: {{host: 127.0.0.1, port: {imap_port}, security: none}}
    smtp: {{host: 127.0.0.1, port: {smtp_port}, security: none}}
calendar:
  team:
    path: {calendar}
"""
    )
    if in_file:
        secrets = home / "credentials.yaml"
        secrets.write_text(f'{CREDENTIAL}: "{PASSWORD}"\n')
        secrets.chmod(0o600)
    return path
