"""Blocking IMAP and SMTP exchanges with the standard library, run in a worker thread.

Every function takes the account and its :class:`Secret` and returns plain data; a failure is
a :class:`~nanocrab.tools.base.ToolError` whose message names the account and the server, never
the password (messages are scrubbed of it in case a server echoes what it was sent).
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import imaplib
import re
import smtplib
import ssl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.message import EmailMessage

from nanocrab.connectors.config import MailAccount, Server
from nanocrab.connectors.credentials import Secret
from nanocrab.tools.base import ToolError

_UID = re.compile(rb"UID (\d+)")
_FLAGS = re.compile(rb"FLAGS \(([^)]*)\)")


@dataclass(frozen=True)
class Header:
    """One message as listed: its UID, whether it was read, and its main headers."""

    uid: int
    seen: bool
    date: str
    sender: str
    subject: str


def quote_mailbox(name: str) -> str:
    """``name`` as an IMAP quoted string."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextlib.contextmanager
def imap_session(
    name: str, account: MailAccount, secret: Secret, timeout: float
) -> Iterator[imaplib.IMAP4]:
    """A logged-in IMAP connection of account ``name``, logged out on exit."""
    server = account.imap
    if server is None:
        raise ToolError("failed", f"mail account {name!r} has no imap server in connectors.yaml")
    try:
        imap = _imap_connect(server, timeout)
    except (OSError, imaplib.IMAP4.error) as exc:
        raise _unavailable("IMAP", name, server, exc, secret) from None
    try:
        try:
            _imap_login(imap, name, account, secret)
        except imaplib.IMAP4.error as exc:
            raise ToolError(
                "failed",
                secret.scrub(
                    f"the IMAP server {server.host}:{server.port} refused the login of mail "
                    f"account {name!r} ({_reason(exc)}); its credential may be wrong or expired"
                ),
            ) from None
        yield imap
    except (OSError, imaplib.IMAP4.abort) as exc:
        raise _unavailable("IMAP", name, server, exc, secret) from None
    except imaplib.IMAP4.error as exc:
        raise ToolError("failed", secret.scrub(f"IMAP error on account {name!r}: {exc}")) from None
    finally:
        with contextlib.suppress(OSError, imaplib.IMAP4.error):
            imap.logout()


def _imap_login(imap: imaplib.IMAP4, name: str, account: MailAccount, secret: Secret) -> None:
    """``AUTHENTICATE PLAIN`` (UTF-8, RFC 4616) when the server offers it, else ``LOGIN``
    (whose quoted strings carry ASCII only)."""
    password = secret.reveal()
    if "AUTH=PLAIN" in imap.capabilities:
        token = f"\0{account.login}\0{password}".encode()
        imap.authenticate("PLAIN", lambda _challenge: token)
    elif password.isascii() and account.login.isascii():
        imap.login(account.login, password)
    else:
        raise ToolError(
            "failed",
            f"mail account {name!r}: the IMAP server offers only LOGIN, which cannot carry a "
            "non-ASCII user name or password",
        )


def _imap_connect(server: Server, timeout: float) -> imaplib.IMAP4:
    if server.security == "tls":
        context = ssl.create_default_context()
        return imaplib.IMAP4_SSL(server.host, server.port, ssl_context=context, timeout=timeout)
    imap = imaplib.IMAP4(server.host, server.port, timeout=timeout)
    if server.security == "starttls":
        imap.starttls(ssl.create_default_context())
    return imap


def select(imap: imaplib.IMAP4, name: str, mailbox: str) -> None:
    """Open ``mailbox`` read-only (EXAMINE): listing and reading never change flags."""
    typ, data = imap.select(quote_mailbox(mailbox), readonly=True)
    if typ != "OK":
        raise ToolError(
            "not_found", f"mail account {name!r} has no mailbox {mailbox!r} ({_text(data)})"
        )


def list_headers(imap: imaplib.IMAP4, *, unseen: bool, limit: int) -> tuple[list[Header], int]:
    """The newest ``limit`` messages (all, or only unseen), newest first; and how many match."""
    typ, data = imap.uid("SEARCH", "UNSEEN" if unseen else "ALL")
    if typ != "OK":
        raise ToolError("failed", f"IMAP SEARCH failed: {_text(data)}")
    uids = [int(u) for u in (data[0] or b"").split()]
    chosen = sorted(uids)[-limit:]
    if not chosen:
        return [], 0
    typ, data = imap.uid("FETCH", ",".join(map(str, chosen)), "(UID FLAGS BODY.PEEK[HEADER])")
    if typ != "OK":
        raise ToolError("failed", f"IMAP FETCH failed: {_text(data)}")
    headers: list[Header] = []
    for item in data:
        if not isinstance(item, tuple):
            continue
        meta, raw = item
        uid = _UID.search(meta)
        if uid is None:
            continue
        flags = _FLAGS.search(meta)
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        headers.append(
            Header(
                uid=int(uid.group(1)),
                seen=flags is not None and b"\\Seen" in flags.group(1),
                date=str(msg.get("Date", "")),
                sender=str(msg.get("From", "")),
                subject=str(msg.get("Subject", "")),
            )
        )
    headers.sort(key=lambda h: h.uid, reverse=True)
    return headers, len(uids)


def fetch_message(imap: imaplib.IMAP4, uid: int) -> EmailMessage | None:
    """Message ``uid`` whole (BODY.PEEK: not marked read), or ``None`` when there is none."""
    typ, data = imap.uid("FETCH", str(uid), "(UID BODY.PEEK[])")
    if typ != "OK":
        raise ToolError("failed", f"IMAP FETCH failed: {_text(data)}")
    for item in data:
        if isinstance(item, tuple):
            msg = email.message_from_bytes(item[1], policy=email.policy.default)
            assert isinstance(msg, EmailMessage)
            return msg
    return None


def imap_check(name: str, account: MailAccount, secret: Secret, timeout: float) -> str:
    """Log in and open INBOX read-only: what an operator's check reports."""
    with imap_session(name, account, secret, timeout) as imap:
        typ, data = imap.select(quote_mailbox("INBOX"), readonly=True)
    return f"INBOX: {_text(data)} messages" if typ == "OK" else f"logged in ({_text(data)})"


def smtp_check(name: str, account: MailAccount, secret: Secret, timeout: float) -> str:
    """Connect and log in, sending nothing."""
    server = account.smtp
    if server is None:
        raise ToolError("failed", f"mail account {name!r} has no smtp server in connectors.yaml")
    try:
        smtp = _smtp_connect(server, timeout)
    except (OSError, smtplib.SMTPException) as exc:
        raise _unavailable("SMTP", name, server, exc, secret) from None
    try:
        _smtp_login(smtp, name, account, secret)
    except smtplib.SMTPAuthenticationError as exc:
        raise ToolError(
            "failed",
            f"the SMTP server refused the login of mail account {name!r} ({exc.smtp_code})",
        ) from None
    except (smtplib.SMTPException, OSError) as exc:
        raise _unavailable("SMTP", name, server, exc, secret) from None
    finally:
        with contextlib.suppress(OSError, smtplib.SMTPException):
            smtp.quit()
    return "logged in"


def smtp_send(
    name: str, account: MailAccount, secret: Secret, message: EmailMessage, timeout: float
) -> None:
    """Send ``message`` through the account's SMTP server, logging in with its credential."""
    server = account.smtp
    if server is None:
        raise ToolError("failed", f"mail account {name!r} has no smtp server in connectors.yaml")
    try:
        smtp = _smtp_connect(server, timeout)
    except (OSError, smtplib.SMTPException) as exc:
        raise _unavailable("SMTP", name, server, exc, secret) from None
    try:
        _smtp_login(smtp, name, account, secret)
        refused = smtp.send_message(message)
    except smtplib.SMTPAuthenticationError as exc:
        raise ToolError(
            "failed",
            secret.scrub(
                f"the SMTP server {server.host}:{server.port} refused the login of mail account "
                f"{name!r} ({exc.smtp_code}); its credential may be wrong or expired"
            ),
        ) from None
    except smtplib.SMTPRecipientsRefused as exc:
        who = ", ".join(sorted(exc.recipients))
        raise ToolError("failed", f"the SMTP server refused every recipient: {who}") from None
    except (smtplib.SMTPServerDisconnected, OSError) as exc:
        raise _unavailable("SMTP", name, server, exc, secret) from None
    except smtplib.SMTPException as exc:
        raise ToolError("failed", secret.scrub(f"SMTP error on account {name!r}: {exc}")) from None
    finally:
        with contextlib.suppress(OSError, smtplib.SMTPException):
            smtp.quit()
    if refused:
        who = ", ".join(sorted(refused))
        raise ToolError("failed", f"sent, but the SMTP server refused: {who}")


def _smtp_login(smtp: smtplib.SMTP, name: str, account: MailAccount, secret: Secret) -> None:
    try:
        smtp.login(account.login, secret.reveal())
    except UnicodeEncodeError:  # smtplib encodes AUTH responses as ASCII
        raise ToolError(
            "failed",
            f"mail account {name!r}: SMTP login cannot carry a non-ASCII user name or password "
            "(a limit of Python's smtplib); use an ASCII app password",
        ) from None


def _smtp_connect(server: Server, timeout: float) -> smtplib.SMTP:
    if server.security == "tls":
        context = ssl.create_default_context()
        return smtplib.SMTP_SSL(server.host, server.port, timeout=timeout, context=context)
    smtp = smtplib.SMTP(server.host, server.port, timeout=timeout)
    if server.security == "starttls":
        smtp.starttls(context=ssl.create_default_context())
    return smtp


def _unavailable(
    protocol: str, name: str, server: Server, exc: BaseException, secret: Secret
) -> ToolError:
    return ToolError(
        "unavailable",
        secret.scrub(
            f"cannot reach the {protocol} server {server.host}:{server.port} of mail account "
            f"{name!r}: {type(exc).__name__}: {exc}"
        ),
    )


def _reason(exc: imaplib.IMAP4.error) -> str:
    return str(exc).strip("b'\"") or type(exc).__name__


def _text(data: Sequence[object]) -> str:
    parts = [d.decode(errors="replace") if isinstance(d, bytes) else str(d) for d in data]
    return " ".join(parts)[:200]
