"""What ``nanocrab connectors list`` reports: every account and calendar of
``connectors.yaml``, the credential each names and whether it is set — never its value — and,
when asked, whether the servers accept it and the ICS files read."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from nanocrab.connectors.calendar import load_calendar
from nanocrab.connectors.config import Calendar, ConnectorsConfig, MailAccount
from nanocrab.connectors.credentials import CredentialError, Credentials, Secret
from nanocrab.connectors.mailio import imap_check, smtp_check
from nanocrab.tools.base import ToolError

CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Entry:
    """One account or calendar. ``ok`` is ``None`` when not checked."""

    kind: str  # "mail" | "calendar"
    name: str
    where: str
    credential: str | None
    credential_set: bool
    ok: bool | None = None
    detail: str = ""


async def entries(
    config: ConnectorsConfig, base: Path, credentials: Credentials, *, check: bool
) -> list[Entry]:
    """The accounts then the calendars; with ``check``, each one tried (in worker threads)."""
    mail = [await _mail(n, a, credentials, check) for n, a in sorted(config.mail.items())]
    cals = [await _calendar(n, c, base, check) for n, c in sorted(config.calendar.items())]
    return [*mail, *cals]


async def _mail(name: str, account: MailAccount, credentials: Credentials, check: bool) -> Entry:
    servers = {"imap": account.imap, "smtp": account.smtp}
    where = ", ".join(f"{k} {s.host}:{s.port} ({s.security})" for k, s in servers.items() if s)
    secret: Secret | None = None
    try:
        secret = credentials.get(account.password)
    except CredentialError as exc:
        problem = str(exc)
    entry = Entry("mail", name, where, account.password, secret is not None)
    if not check:
        return entry
    if secret is None:
        return dataclasses.replace(entry, ok=False, detail=problem)
    results, ok = [], True
    for label, probe in (("imap", imap_check), ("smtp", smtp_check)):
        if servers[label] is None:
            continue
        try:
            said = await asyncio.to_thread(probe, name, account, secret, CHECK_TIMEOUT_S)
        except ToolError as exc:
            ok, said = False, exc.message
        results.append(f"{label}: {said}")
    return dataclasses.replace(entry, ok=ok, detail="; ".join(results))


async def _calendar(name: str, calendar: Calendar, base: Path, check: bool) -> Entry:
    path = calendar.file(base)
    entry = Entry("calendar", name, str(path), None, True)
    if not check:
        return entry
    try:
        loaded = await asyncio.to_thread(load_calendar, path, name)
    except ToolError as exc:
        return dataclasses.replace(entry, ok=False, detail=exc.message)
    count = len(list(loaded.walk("VEVENT")))
    fresh = "" if path.exists() else " (no file yet: calendar.add creates it)"
    return dataclasses.replace(entry, ok=True, detail=f"{count} events{fresh}")
