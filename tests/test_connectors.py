"""The mail and calendar connectors against servers on loopback (an IMAP fixture, aiosmtpd),
an ICS file in a temporary directory, the executor's credentials, and the policy's view of
their resources."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import icalendar
import pytest

from nanocrab.connectors import (
    ConnectorConfigError,
    CredentialError,
    Credentials,
    connectors_setup,
    load_connectors,
)
from nanocrab.events import TextBlock
from nanocrab.policy import Policy, Request, evaluate, load_policy
from nanocrab.tools import LocalOperations, ToolContext, ToolRegistry, ToolResult
from tests.connector_rig import (
    CREDENTIAL,
    PASSWORD,
    USER,
    ImapServer,
    Mail,
    SmtpServer,
    message,
    smtp_server,
    write_config,
)


class _NoArtifacts:
    async def put(self, name: str, data: bytes, **kwargs: Any) -> Any:
        raise AssertionError("no artifacts expected")


@pytest.fixture
async def imap() -> AsyncIterator[ImapServer]:
    server = ImapServer(
        boxes={
            "INBOX": [
                Mail(1, message(1, "alice@example.org", "Lunch?", "Shall we eat at noon?"), True),
                Mail(
                    2,
                    message(
                        2, "bob@partner.test", "Contract", "<b>Signed</b> copy attached", html=True
                    ),
                ),
            ],
            "Archive": [],
        }
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with smtp_server() as server:
        yield server


@pytest.fixture
def setup(tmp_path: Path, imap: ImapServer, smtp: SmtpServer) -> ToolRegistry:
    write_config(
        tmp_path / "conf", imap_port=imap.port, smtp_port=smtp.port,
        calendar=tmp_path / "cal" / "team.ics",
    )  # fmt: skip
    return ToolRegistry(connectors_setup(tmp_path / "conf", {}).tools)


def ctx(tmp_path: Path, call_id: str = "call-1") -> ToolContext:
    return ToolContext(
        workspace=tmp_path, ops=LocalOperations(), artifacts=_NoArtifacts(), call_id=call_id
    )


def text(result: ToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextBlock))


async def test_mail_list_and_read_over_imap_never_mark_read(
    setup: ToolRegistry, imap: ImapServer, tmp_path: Path
) -> None:
    listed = await setup.invoke("mail.list", {"account": "work"}, ctx(tmp_path))
    assert not listed.is_error, text(listed)
    lines = text(listed).splitlines()
    assert "2 of 2" in lines[0]
    assert lines[1].startswith("2\t[unread] ") and "Contract" in lines[1]  # newest first
    assert lines[2].startswith("1\t") and "Lunch?" in lines[2] and "[unread]" not in lines[2]
    read = await setup.invoke("mail.read", {"account": "work", "uid": 2}, ctx(tmp_path))
    assert not read.is_error, text(read)
    assert "From: bob@partner.test" in text(read) and "**Signed** copy attached" in text(read)
    # read-only: EXAMINE and BODY.PEEK, the password went to LOGIN only
    assert all(not c.startswith("SELECT") for c in imap.commands)
    assert any(c.startswith("EXAMINE") for c in imap.commands)
    assert all("PEEK" in c for c in imap.commands if c.startswith("UID FETCH"))
    assert not imap.boxes["INBOX"][1].seen
    assert PASSWORD not in text(listed) + text(read)


async def test_mail_errors_are_typed(setup: ToolRegistry, imap: ImapServer, tmp_path: Path) -> None:
    missing = await setup.invoke("mail.read", {"account": "work", "uid": 9}, ctx(tmp_path))
    assert missing.error_kind == "not_found"
    nobox = await setup.invoke("mail.list", {"account": "work", "mailbox": "Spam"}, ctx(tmp_path))
    assert nobox.error_kind == "not_found" and "Spam" in text(nobox)
    empty = await setup.invoke(
        "mail.list", {"account": "work", "mailbox": "Archive"}, ctx(tmp_path)
    )
    assert not empty.is_error and "no messages" in text(empty)
    nobody = await setup.invoke("mail.list", {"account": "home"}, ctx(tmp_path))
    assert nobody.error_kind == "not_found" and "work" in text(nobody)
    imap.password = "rotated"  # the server no longer accepts the stored credential
    refused = await setup.invoke("mail.list", {"account": "work"}, ctx(tmp_path))
    assert refused.error_kind == "failed" and "refused the login" in text(refused)
    assert PASSWORD not in text(refused)


async def test_mail_send_over_smtp_with_the_executors_credential(
    setup: ToolRegistry, smtp: SmtpServer, tmp_path: Path
) -> None:
    args = {"account": "work", "to": ["carol@example.org"], "cc": ["dan@Partner.TEST"],
            "subject": "Minutes", "body": "Attached are the minutes."}  # fmt: skip
    dry = await setup.invoke("mail.send", {**args, "dry_run": True}, ctx(tmp_path))
    assert not dry.is_error and text(dry).startswith("dry run: would send")
    assert smtp.received == [] and smtp.logins == []  # a dry run touches nothing
    sent = await setup.invoke("mail.send", args, ctx(tmp_path))
    assert not sent.is_error, text(sent)
    (envelope,) = smtp.received
    assert envelope.mail_from == USER
    assert sorted(envelope.rcpt_tos) == ["carol@example.org", "dan@Partner.TEST"]
    assert b"Subject: Minutes" in (envelope.original_content or b"")
    assert smtp.logins == [(USER, PASSWORD)]
    assert PASSWORD not in text(sent)


async def test_mail_send_refuses_header_injection_and_display_names(
    setup: ToolRegistry, tmp_path: Path
) -> None:
    base = {"account": "work", "subject": "x", "body": "y"}
    for to in (["a@b.org\r\nBcc: x@evil.test"], ["Eve <eve@evil.test>"], ["a@b.org, c@d.org"]):
        bad = await setup.invoke("mail.send", {**base, "to": to}, ctx(tmp_path))
        assert bad.error_kind == "invalid_arguments", to
    bad = await setup.invoke(
        "mail.send", {**base, "to": ["a@b.org"], "subject": "x\r\nBcc: e@evil.test"}, ctx(tmp_path)
    )
    assert bad.error_kind == "invalid_arguments"


async def test_unreachable_server_is_unavailable(tmp_path: Path) -> None:
    write_config(tmp_path, imap_port=1, smtp_port=1, calendar=tmp_path / "c.ics")
    reg = ToolRegistry(connectors_setup(tmp_path, {}).tools)
    down = await reg.invoke("mail.list", {"account": "work"}, ctx(tmp_path))
    assert down.error_kind == "unavailable" and "127.0.0.1:1" in text(down)


async def test_calendar_add_and_list_on_an_ics_file(setup: ToolRegistry, tmp_path: Path) -> None:
    ics = tmp_path / "cal" / "team.ics"
    args = {"calendar": "team", "title": "Design review", "start": "2026-06-03T14:00:00Z",
            "duration_minutes": 45, "location": "Room 2"}  # fmt: skip
    dry = await setup.invoke("calendar.add", {**args, "dry_run": True}, ctx(tmp_path))
    assert text(dry).startswith("dry run: would add") and not ics.exists()
    added = await setup.invoke("calendar.add", args, ctx(tmp_path, "call-7"))
    assert not added.is_error, text(added)
    again = await setup.invoke("calendar.add", args, ctx(tmp_path, "call-7"))
    assert text(again).startswith("already added")  # the same call run again adds nothing
    other = await setup.invoke(
        "calendar.add", {**args, "title": "Retro", "start": "2026-06-05T09:00:00+02:00",
                         "end": "2026-06-05T10:00:00+02:00"}, ctx(tmp_path, "call-8"),
    )  # fmt: skip
    assert not other.is_error
    cal = icalendar.Calendar.from_ical(ics.read_bytes())
    events = list(cal.walk("VEVENT"))
    assert [str(e["SUMMARY"]) for e in events] == ["Design review", "Retro"]
    assert events[0].decoded("DTEND") == datetime(2026, 6, 3, 14, 45, tzinfo=UTC)
    listed = await setup.invoke(
        "calendar.list", {"calendar": "team", "start": "2026-06-01", "days": 7}, ctx(tmp_path)
    )
    lines = text(listed).splitlines()
    assert "2 events" in lines[0]
    assert "2026-06-03 14:00 to 2026-06-03 14:45 UTC\tDesign review @ Room 2" in lines[1]
    assert lines[2].startswith("2026-06-05 07:00")  # +02:00 shown in UTC
    later = await setup.invoke(
        "calendar.list", {"calendar": "team", "start": "2026-07-01"}, ctx(tmp_path)
    )
    assert "no events" in text(later)
    bad = await setup.invoke("calendar.add", {**args, "end": "2026-06-03T13:00:00Z"}, ctx(tmp_path))
    assert bad.error_kind == "invalid_arguments" and "end must be after start" in text(bad)


async def test_concurrent_adds_keep_every_event(setup: ToolRegistry, tmp_path: Path) -> None:
    args = {"calendar": "team", "title": "t", "start": "2026-06-03T14:00:00Z"}
    results = await asyncio.gather(
        *(setup.invoke("calendar.add", args, ctx(tmp_path, f"c{i}")) for i in range(8))
    )
    assert not any(r.is_error for r in results)
    cal = icalendar.Calendar.from_ical((tmp_path / "cal" / "team.ics").read_bytes())
    assert len(list(cal.walk("VEVENT"))) == 8


# --- credentials --------------------------------------------------------------------------------


def test_credentials_from_environment_then_file(tmp_path: Path) -> None:
    file = tmp_path / "credentials.yaml"
    file.write_text("work-mail: from-file\n")
    file.chmod(0o600)
    creds = Credentials(file=file, environ={})
    assert creds.get("work-mail").reveal() == "from-file"
    env = Credentials(file=file, environ={"NANOCRAB_CREDENTIAL_WORK_MAIL": "from-env"})
    assert env.get("work-mail").reveal() == "from-env"
    secret = env.get("work-mail")
    assert "from-env" not in repr(secret) and "from-env" not in f"{secret}"
    with pytest.raises(CredentialError, match="NANOCRAB_CREDENTIAL_OTHER") as missing:
        creds.get("other")
    assert "from-file" not in str(missing.value)


def test_credentials_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "credentials.yaml"
    file.write_text("work-mail: s3cret\n")
    file.chmod(0o644)
    with pytest.raises(CredentialError, match="chmod 600"):
        Credentials(file=file, environ={}).get("work-mail")
    file.write_text("work-mail: [s3cret\n")
    file.chmod(0o600)
    with pytest.raises(CredentialError) as bad:
        Credentials(file=file, environ={}).get("work-mail")
    assert "s3cret" not in str(bad.value)


async def test_missing_credential_is_a_failed_call_naming_it(tmp_path: Path) -> None:
    write_config(tmp_path, imap_port=1, smtp_port=1, calendar=tmp_path / "c.ics", in_file=False)
    reg = ToolRegistry(connectors_setup(tmp_path, {}).tools)
    result = await reg.invoke("mail.list", {"account": "work"}, ctx(tmp_path))
    assert result.error_kind == "failed" and CREDENTIAL in text(result)
    dry = await reg.invoke("mail.list", {"account": "work", "dry_run": True}, ctx(tmp_path))
    assert not dry.is_error and "dry run" in text(dry)  # a dry run reads no credential


def test_bad_connectors_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "connectors.yaml"
    path.write_text(
        "version: 1\nmail:\n  work:\n    address: me@example.org\n    password: p\n"
        "    imap: {host: imap.example.org, port: 143, security: none}\n"
    )
    with pytest.raises(ConnectorConfigError, match=r"connectors.yaml:6: .*loopback"):
        load_connectors(path)


def test_the_credentials_file_is_protected_from_every_tool(tmp_path: Path) -> None:
    write_config(tmp_path, imap_port=1, smtp_port=1, calendar=tmp_path / "c.ics")
    setup = connectors_setup(tmp_path, {})
    assert tmp_path / "credentials.yaml" in setup.protected
    assert connectors_setup(tmp_path, {"NANOCRAB_CONNECTORS": "none"}).tools == []


# --- the policy's view ------------------------------------------------------------------------


def decide(policy: Policy, tool: str, arguments: dict[str, Any], tmp_path: Path) -> Any:
    write_config(tmp_path / "p", imap_port=1, smtp_port=1, calendar=tmp_path / "c.ics")
    setup = connectors_setup(tmp_path / "p", {})
    return evaluate(
        policy,
        Request(
            tool=tool, arguments=arguments, workspace=tmp_path,
            known_tools=frozenset(t.name for t in setup.tools),
            resources=setup.resources(tool, arguments),
        ),
    )  # fmt: skip


def test_default_policy_reads_send_asks_every_time_add_asks(tmp_path: Path) -> None:
    policy = load_policy()
    listed = decide(policy, "mail.list", {"account": "work"}, tmp_path)
    assert listed.tier == "safe" and listed.rule == "connectors-read"
    assert [(c.tool, c.resource, c.access) for c in listed.capabilities] == [
        ("mail.list", "mail:work/INBOX", "read")
    ]
    sent = decide(
        policy, "mail.send",
        {"account": "work", "to": ["a@Example.org", "b@example.org", "c@other.test"],
         "subject": "s", "body": "b"}, tmp_path,
    )  # fmt: skip
    assert sent.tier == "unsafe"
    assert [c.resource for c in sent.capabilities] == [
        "mail.from:work", "mail.to:example.org", "mail.to:other.test",
    ]  # fmt: skip
    added = decide(
        policy, "calendar.add", {"calendar": "team", "title": "t", "start": "2026-06-03T10:00"},
        tmp_path,
    )  # fmt: skip
    assert added.tier == "guarded" and [c.resource for c in added.capabilities] == ["calendar:team"]


def test_resource_rules_deny_on_any_allow_on_every(tmp_path: Path) -> None:
    policy = Policy.from_mapping(
        {
            "version": 1,
            "rules": [
                {"id": "no-rivals", "tools": ["mail.send"], "resources": ["mail.to:rival.test"],
                 "tier": "deny"},
                {"id": "inside", "tools": ["mail.send"],
                 "resources": ["mail.from:work", "mail.to:example.org"], "tier": "guarded"},
            ],
        }
    )  # fmt: skip
    base = {"account": "work", "subject": "s", "body": "b"}
    inside = decide(policy, "mail.send", {**base, "to": ["a@example.org"]}, tmp_path)
    assert inside.tier == "guarded" and inside.rule == "inside"
    rival = decide(policy, "mail.send", {**base, "to": ["a@example.org", "x@RIVAL.test"]}, tmp_path)
    assert rival.tier == "deny" and rival.rule == "no-rivals"
    outside = decide(
        policy, "mail.send", {**base, "to": ["a@example.org", "z@else.test"]}, tmp_path
    )
    assert outside.tier == "deny" and outside.rule is None
    assert (
        "resources: ['mail.from:work', 'mail.to:else.test', 'mail.to:example.org']"
        in outside.reason
    )


def test_task_budget_narrows_connector_calls(tmp_path: Path) -> None:
    from nanocrab.events.values import Capability

    write_config(tmp_path / "p", imap_port=1, smtp_port=1, calendar=tmp_path / "c.ics")
    setup = connectors_setup(tmp_path / "p", {})
    budget = [Capability(tool="mail.list", resource="mail:work/INBOX")]

    def tier(mailbox: str) -> str:
        arguments = {"account": "work", "mailbox": mailbox}
        return evaluate(
            load_policy(),
            Request(tool="mail.list", arguments=arguments, workspace=tmp_path,
                    known_tools=frozenset(t.name for t in setup.tools),
                    resources=setup.resources("mail.list", arguments)),
            budget=budget,
        ).tier  # fmt: skip

    assert tier("INBOX") == "safe"
    assert tier("Archive") == "deny"


def test_unreadable_connector_arguments_are_denied_by_the_policy_lookup(tmp_path: Path) -> None:
    write_config(tmp_path, imap_port=1, smtp_port=1, calendar=tmp_path / "c.ics")
    setup = connectors_setup(tmp_path, {})
    with pytest.raises(ValueError, match=r"invalid arguments for mail\.send"):
        setup.resources("mail.send", {"account": "work", "to": ["Eve <e@x.test>"],
                                      "subject": "s", "body": "b"})  # fmt: skip
    assert setup.resources("read", {"path": "x"}) is None


def test_resources_rule_is_refused_for_path_tools() -> None:
    from nanocrab.policy import PolicyError

    with pytest.raises(PolicyError, match="'resources' does not apply to read"):
        Policy.from_mapping(
            {"version": 1, "rules": [{"id": "r", "tools": ["read"], "resources": ["x:*"],
                                      "tier": "safe"}]}
        )  # fmt: skip


async def test_connectors_list_command_never_shows_a_secret(
    tmp_path: Path, imap: ImapServer, smtp: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from nanocrab.cli import app

    home = tmp_path / "home"
    write_config(home, imap_port=imap.port, smtp_port=smtp.port, calendar=tmp_path / "t.ics")
    monkeypatch.setenv("NANOCRAB_HOME", str(home))
    for name in ("NANOCRAB_CONFIG_DIR", "NANOCRAB_CONNECTORS"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()

    def invoke(*args: str) -> Any:  # the command runs its own event loop: off this one
        return asyncio.to_thread(runner.invoke, app, ["connectors", "list", *args])

    listed = await invoke("--json")
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in map(json.loads, listed.output.splitlines())}
    assert rows["work"]["credential"] == CREDENTIAL and rows["work"]["credential_set"]
    assert rows["team"]["kind"] == "calendar" and rows["team"]["ok"] is None
    checked = await invoke("--check")
    assert checked.exit_code == 0, checked.output
    assert "imap: INBOX: 2 messages; smtp: logged in" in checked.output
    assert "0 events (no file yet" in checked.output
    assert smtp.received == []  # a check sends nothing
    imap.password = "rotated"
    refused = await invoke("--check")
    assert refused.exit_code == 1 and "refused the login" in refused.output
    (home / "credentials.yaml").unlink()
    missing = await invoke()
    assert "credential work-mail: missing" in missing.output
    for result in (listed, checked, refused, missing):
        assert PASSWORD not in result.output


async def test_a_non_ascii_password_goes_through_authenticate_plain(
    tmp_path: Path, imap: ImapServer, smtp: SmtpServer
) -> None:
    word = "Pässwörd-çà-7"
    write_config(tmp_path, imap_port=imap.port, smtp_port=smtp.port, calendar=tmp_path / "c.ics")
    env = {"NANOCRAB_CREDENTIAL_WORK_MAIL": word}  # the environment wins over the file
    reg = ToolRegistry(connectors_setup(tmp_path, env).tools)
    imap.password = word
    refused = await reg.invoke("mail.list", {"account": "work"}, ctx(tmp_path))
    assert refused.error_kind == "failed" and "only LOGIN" in text(refused)
    assert not any(c.startswith("LOGIN") for c in imap.commands)  # never sent mangled
    imap.capabilities = "IMAP4rev1 AUTH=PLAIN"
    listed = await reg.invoke("mail.list", {"account": "work"}, ctx(tmp_path))
    assert not listed.is_error, text(listed)
    assert any(c.startswith("AUTHENTICATE PLAIN") for c in imap.commands)
    args = {"account": "work", "to": ["a@example.org"], "subject": "s", "body": "b"}
    unsent = await reg.invoke("mail.send", args, ctx(tmp_path))
    assert unsent.error_kind == "failed" and "non-ASCII" in text(unsent)
    assert smtp.received == []
    assert word not in text(refused) + text(listed) + text(unsent)
