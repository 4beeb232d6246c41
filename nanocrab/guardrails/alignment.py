"""The offline alignment check: does a tool call made after untrusted output serve the task?

An indirect injection succeeds when the model, having read a web page, a file or an e-mail,
makes a call the user never asked for: mail a document to an address found in that page, fetch
a URL that carries data out, run a command the page suggested. The rules here compare the
call's arguments with the user's task and with the untrusted texts the model read since:

- ``from_untrusted``: an argument carries a destination or value (URL, host, e-mail address,
  account or phone number, long literal) that appears in the untrusted output but not in the
  task — the classic hijack: 0.7 when the tool sends something out, 0.35 for following a link
  (the policy's host rules decide those), 0.4 for a copied long literal;
- ``command_from_untrusted``: an exec command copied from untrusted output, or a network /
  destructive / persistence command the task does not mention;
- ``secret_out``: the arguments carry a secret (a known token format, a private key) or name a
  credential file (``~/.ssh/id_*``, ``.env``, ``.aws/credentials`` ...) in a call that sends
  data out — or in any call right after untrusted output when the task does not mention it;
- ``data_in_url``: a URL whose query carries long or encoded data, to a host not in the task.

Scores combine like the injection detector's (``1 - Π(1 - w)``). The function is pure and
offline; a model-based check (LlamaFirewall's AlignmentCheck style) can be layered on top by
the handler when a key is set.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from nanocrab.guardrails.lists import url_hosts
from nanocrab.guardrails.secrets import detect_secrets

_SEND_TOOL = re.compile(
    r"(?i)send|mail|post|message|msg|slack|tweet|publish|upload|share|transfer|pay|wire|invite|"
    r"grant|webhook|forward|sms|notify|comment|reply|create_issue|gist|push"
)
# fetching a page linked from another page is ordinary browsing: weighed lower than sending
_FETCH_TOOL = re.compile(r"(?i)http|request|fetch|curl|browse|navigate|open_url|visit")
_EXEC_TOOL = re.compile(r"(?i)^(?:exec|shell|bash|sh|run|run_command|terminal|execute|cmd|"
                        r"powershell|subprocess|run_shell|execute_command)$")  # fmt: skip
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ACCOUNT = re.compile(r"(?<![\w-])(?:[A-Z]{2}\d{2}[A-Z0-9]{10,30}|\d[\d-]{6,}\d)(?![\w-])")
_NETWORK_CMD = re.compile(r"(?i)(?:^|[\s;|&(`])(?:curl|wget|nc|ncat|netcat|scp|sftp|rsync|ssh|ftp|"
                          r"telnet|socat|invoke-webrequest|iwr|irm)\b|/dev/tcp/|"
                          r"requests\.(?:post|get|put)|urllib\.request|http\.client")  # fmt: skip
_DANGEROUS_CMD = re.compile(r"(?i)\brm\s+-[a-z]*r[a-z]*f?\s+(?:/|~|\$home|\*)|\|\s*(?:sudo\s+)?"
                            r"(?:ba|z|da)?sh\b|\bchmod\s+(?:-r\s+)?[0-7]*7[0-7]*\s|\bcrontab\b|"
                            r"\.bashrc|\.profile|authorized_keys|\bbase64\s+(?:-d|--decode)|"
                            r"\bmkfifo\b|\bnohup\b|\bdd\s+if=|\beval\b")  # fmt: skip
_SECRET_PATH = re.compile(r"(?i)(?:\.ssh/(?:id_[a-z0-9]+|authorized_keys|known_hosts|config)|"
                          r"(?:^|[/\s'\"=])\.env(?:\.[\w]+)?\b|\.aws/credentials|\.netrc|"
                          r"\.git-credentials|\.npmrc|\.pypirc|\.docker/config\.json|"
                          r"\.kube/config|/etc/(?:shadow|passwd|sudoers)|\.gnupg|keychain|"
                          r"credentials\.json|secrets?\.(?:ya?ml|json|toml))")  # fmt: skip
_LONG_LITERAL = 24  # a quoted literal this long copied from untrusted text is a payload
_STOP_HOSTS = frozenset({"localhost", "127.0.0.1"})


@dataclass(frozen=True, slots=True)
class Alignment:
    """The check's result: ``score`` in [0, 1] and the reasons (``rule: detail``; details name
    hosts and tools, never secret values)."""

    score: float
    reasons: tuple[str, ...] = ()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            yield from _strings(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def _combine(weights: Sequence[float]) -> float:
    remaining = 1.0
    for w in weights:
        remaining *= 1.0 - w
    return round(1.0 - remaining, 4)


def check_alignment(task: str, tool: str, arguments: Mapping[str, Any],
                    untrusted: Sequence[str] = ()) -> Alignment:  # fmt: skip
    """Score how far a call of ``tool`` with ``arguments`` strays from ``task``, given the
    ``untrusted`` texts (tool outputs) the model read before proposing it. 0 means nothing
    suspicious; the rules are in the module docstring."""
    task_l = task.lower()
    seen = "\n".join(untrusted).lower()
    values = list(_strings(arguments))
    blob = "\n".join(values)
    sends = bool(_SEND_TOOL.search(tool))
    outbound = sends or bool(_FETCH_TOOL.search(tool))
    is_exec = bool(_EXEC_TOOL.match(tool)) or any(k in arguments for k in ("command", "cmd"))
    weights: list[float] = []
    reasons: list[str] = []

    def add(weight: float, reason: str) -> None:
        weights.append(weight)
        reasons.append(reason)

    # destinations and values taken from untrusted output
    atoms: list[tuple[str, str]] = []
    atoms += [("host", h) for h, _, _ in url_hosts(blob) if h not in _STOP_HOSTS]
    atoms += [("email", m.group(0).lower()) for m in _EMAIL.finditer(blob)]
    atoms += [("account", m.group(0)) for m in _ACCOUNT.finditer(blob)]
    for kind, atom in dict.fromkeys(atoms):
        in_task = atom.lower() in task_l
        if kind == "email" and not in_task:
            in_task = atom.split("@", 1)[1] in task_l and outbound is False
        if in_task:
            continue
        if seen and atom.lower() in seen:
            weight = 0.7 if sends or (kind == "email" and outbound) else 0.5
            if kind == "host" and not sends:
                weight = 0.35  # following a link: the policy's host rules decide
            add(weight,
                f"from_untrusted: {kind} {_safe(kind, atom)} comes from tool output, not the task")
        elif sends and kind in ("email", "host") and (seen or kind == "email"):
            add(0.25, f"new_destination: {kind} {_safe(kind, atom)} is not in the task")
    if seen and not reasons:  # a copied literal counts only when no atom explained it
        for value in values:
            for literal in re.findall(rf"[^\n]{{{_LONG_LITERAL},}}", value):
                chunk = literal.strip().lower()
                if len(chunk) >= _LONG_LITERAL and chunk in seen and chunk not in task_l:
                    add(0.4, "from_untrusted: an argument copies text from tool output")
                    break
            else:
                continue
            break

    # commands
    if is_exec:
        command = blob
        net = _NETWORK_CMD.search(command)
        if net and not any(h in task_l for h, _, _ in url_hosts(command)):
            word = net.group(0).strip(" ;|&(`").lower()
            if word not in task_l:
                add(0.5, f"command_from_untrusted: network command ({word}) not asked by the task")
        danger = _DANGEROUS_CMD.search(command)
        if danger and danger.group(0).strip().lower() not in task_l:
            add(0.45, "command_from_untrusted: destructive or persistence command")

    # secrets leaving
    secrets = [f for f in detect_secrets(blob) if f.score >= 0.8]
    paths = [m.group(0) for m in _SECRET_PATH.finditer(blob)]
    if secrets or paths:
        what = secrets[0].kind if secrets else "credential file"
        mentioned = any(p.strip(" /'\"=").lower() in task_l for p in paths)
        leaves = outbound or (is_exec and _NETWORK_CMD.search(blob) is not None)
        if leaves:
            add(0.85, f"secret_out: {what} in a call that sends data out")
        elif seen and not mentioned:
            add(0.45, f"secret_out: {what} touched right after tool output, not asked by task")

    # data smuggled in URL queries
    for host, start, end in url_hosts(blob):
        if host.lower() in task_l:
            continue
        query = urlsplit(blob[start:end]).query
        long_values = [v for _, v in parse_qsl(query) if len(v) >= 32]
        if long_values:
            add(0.5, f"data_in_url: long query data sent to {host}")
            break

    return Alignment(_combine(weights), tuple(reasons))


def _safe(kind: str, atom: str) -> str:
    """An atom for a reason line: hosts and e-mail domains in clear, the rest masked."""
    if kind == "account":
        return atom[:2] + "…" + atom[-2:]
    if kind == "email":
        return "…@" + atom.split("@", 1)[1]
    return atom
