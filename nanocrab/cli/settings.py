"""Settings from the environment — the only place nanocrab reads it."""

from __future__ import annotations

import getpass
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, SecretStr

from nanocrab import demo
from nanocrab.bus import BusConfig
from nanocrab.bus.tracing import TraceExporter
from nanocrab.projections import default_url


def default_home(cwd: Path, environ: Mapping[str, str]) -> Path:
    """The data directory for a working directory: ``<state>/nanocrab/<name>-<hash>``.

    ``<state>`` is ``$XDG_STATE_HOME`` or ``~/.local/state``. One per working directory, so
    ``nanocrab up`` and ``nanocrab publish`` started in the same project meet, and two projects
    never share sessions. It is deliberately *outside* the working directory, which is the
    agent's default workspace: the signing keys, the log and the database must not sit in a tree
    the agent's tools may read (docs/security.md).
    """
    cwd = cwd.resolve()
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    digest = hashlib.sha256(str(cwd).encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", cwd.name)[:40] or "root"
    return Path(state).resolve() / "nanocrab" / f"{name}-{digest}"


class Settings(BaseModel):
    """Everything the CLI wires. Environment variables:

    ``NANOCRAB_HOME``      data directory: server store, SQLite, traces, keys (default: one per
                           working directory under ``$XDG_STATE_HOME/nanocrab``, see
                           :func:`default_home` — never inside the agent's workspace)
    ``NANOCRAB_NATS_URL``  an external NATS server/cluster; unset starts the embedded server
    ``NANOCRAB_NATS_AUTH`` ``nkeys``: connect as per-identity nkey users (seeds in
                           ``<home>/keys``); ``none``: one unauthenticated connection. Default
                           ``nkeys`` for the embedded server, ``none`` with NANOCRAB_NATS_URL
    ``NANOCRAB_DB_URL``    SQLAlchemy URL for projections (default SQLite in the data directory),
                           e.g. ``postgresql+asyncpg://user@127.0.0.1:5432/nanocrab``
    ``NANOCRAB_TRACES``    ``console`` (to ``<home>/traces.jsonl``, default), ``otlp``, ``none``
    ``NANOCRAB_SYNC``      JetStream fsync policy of the embedded server: ``default`` or ``always``
    ``ANTHROPIC_API_KEY``  use Claude; without it the offline scripted model answers
    ``NANOCRAB_PROVIDER``  force ``anthropic`` or ``scripted``
    ``NANOCRAB_MODEL``     the Claude model (default: the provider's)
    ``NANOCRAB_SCRIPT``    the scripted model's YAML script (default: the bundled demo script)
    ``NANOCRAB_WEB_ALLOW`` comma-separated hosts ``web_fetch`` and ``web_search`` may reach
                           (default: none)
    ``NANOCRAB_SEARCH_API_KEY`` the search provider's key: with it the agent gets ``web_search``
                           (its API host must also be on NANOCRAB_WEB_ALLOW and allowed by a
                           policy rule; docs/agent.md)
    ``NANOCRAB_SEARCH_PROVIDER`` ``brave`` (default) or ``tavily``
    ``NANOCRAB_SEARCH_URL`` the provider's API URL (default: its public endpoint)
    ``NANOCRAB_POLICY``    the capability policy (default ``<home>/policy.yaml`` if it exists,
                           else the bundled secure default; see docs/security.md)
    ``NANOCRAB_GUARDRAILS`` the guardrails chain (default ``<home>/guardrails.yaml`` if it
                           exists, else the bundled default; ``none``: no guardrails at all;
                           see docs/guardrails.md)
    ``NANOCRAB_ALERT_WEBHOOK`` a URL every ``alert.raised`` is POSTed to (JSON, retried)
    ``NANOCRAB_GATEWAY``   ``host:port`` where ``nanocrab up`` also serves the HTTP gateway and
                           web view (default: not served; ``nanocrab gateway`` serves it alone;
                           see docs/gateway.md)
    ``NANOCRAB_STREAM_REPLICAS`` copies of each stream (default 1; 3 on a three-node cluster,
                           docs/scaling.md)
    ``NANOCRAB_STREAM_PLACEMENT`` ``cluster`` or ``cluster:tag,tag``: where the replicas go
    """

    model_config = ConfigDict(frozen=True)

    home: Path
    nats_url: str | None
    nats_auth: bool | None = None  # None: broker permissions iff the server is embedded
    db_url: str
    traces: TraceExporter
    sync: str
    provider: Literal["anthropic", "scripted"]
    anthropic_api_key: SecretStr | None = None
    model: str = ""
    script: Path
    web_allow: tuple[str, ...] = ()
    search_provider: str = "brave"  # NANOCRAB_SEARCH_PROVIDER
    search_api_key: SecretStr | None = None  # None: no web_search tool
    search_url: str | None = None  # None: the provider's public endpoint
    user_skills: Path
    user: str = "cli"  # who cancels or approves from this CLI (recorded in the log)
    policy_file: Path | None = None  # None: the bundled default policy
    guardrails_file: Path | None = None  # None: the bundled default chain
    guardrails: bool = True  # False (NANOCRAB_GUARDRAILS=none): no guardrails handler at all
    alert_webhook: str | None = None  # alert.raised events are POSTed here (JSON)
    gateway: tuple[str, int] | None = None  # (host, port): `up` serves the gateway there
    stream_replicas: int = 1  # NANOCRAB_STREAM_REPLICAS
    stream_placement: tuple[str | None, tuple[str, ...]] = (None, ())  # (cluster, tags)

    @property
    def keys_dir(self) -> Path:
        """Where this data directory's Ed25519 identities live (owner-only)."""
        return self.home / "keys"

    @classmethod
    def from_env(cls) -> Settings:
        explicit = os.environ.get("NANOCRAB_HOME")
        home = Path(explicit).resolve() if explicit else default_home(Path.cwd(), os.environ)
        traces = os.environ.get("NANOCRAB_TRACES", "console")
        if traces not in ("console", "otlp", "none"):
            raise ValueError(f"NANOCRAB_TRACES={traces!r}: use console, otlp or none")
        key = os.environ.get("ANTHROPIC_API_KEY") or None
        provider = os.environ.get("NANOCRAB_PROVIDER") or ("anthropic" if key else "scripted")
        if provider not in ("anthropic", "scripted"):
            raise ValueError(f"NANOCRAB_PROVIDER={provider!r}: use anthropic or scripted")
        if provider == "anthropic" and not key:
            raise ValueError("NANOCRAB_PROVIDER=anthropic needs ANTHROPIC_API_KEY")
        script = Path(os.environ.get("NANOCRAB_SCRIPT") or demo.SCRIPT)
        if provider == "scripted" and not script.is_file():
            raise ValueError(f"NANOCRAB_SCRIPT={script}: no such file")
        web_allow = tuple(
            h.strip() for h in os.environ.get("NANOCRAB_WEB_ALLOW", "").split(",") if h.strip()
        )
        search_key = os.environ.get("NANOCRAB_SEARCH_API_KEY") or None
        if (os.environ.get("NANOCRAB_SEARCH_PROVIDER") or "brave") not in ("brave", "tavily"):
            raise ValueError("NANOCRAB_SEARCH_PROVIDER: use brave or tavily")
        nats_auth = os.environ.get("NANOCRAB_NATS_AUTH") or None
        if nats_auth not in (None, "nkeys", "none"):
            raise ValueError(f"NANOCRAB_NATS_AUTH={nats_auth!r}: use nkeys or none")
        policy = os.environ.get("NANOCRAB_POLICY") or None
        policy_file = Path(policy) if policy else home / "policy.yaml"
        if policy and not policy_file.is_file():
            raise ValueError(f"NANOCRAB_POLICY={policy}: no such file")
        guardrails = os.environ.get("NANOCRAB_GUARDRAILS") or None
        guardrails_file = (
            Path(guardrails) if guardrails and guardrails != "none" else home / "guardrails.yaml"
        )
        if guardrails and guardrails != "none" and not guardrails_file.is_file():
            raise ValueError(f"NANOCRAB_GUARDRAILS={guardrails}: no such file (or 'none')")
        return cls(
            home=home,
            policy_file=policy_file if policy_file.is_file() else None,
            guardrails_file=guardrails_file if guardrails_file.is_file() else None,
            guardrails=guardrails != "none",
            alert_webhook=os.environ.get("NANOCRAB_ALERT_WEBHOOK") or None,
            gateway=_listen(os.environ.get("NANOCRAB_GATEWAY") or None),
            stream_replicas=_replicas(os.environ.get("NANOCRAB_STREAM_REPLICAS") or "1"),
            stream_placement=_placement(os.environ.get("NANOCRAB_STREAM_PLACEMENT") or ""),
            nats_url=os.environ.get("NANOCRAB_NATS_URL") or None,
            nats_auth=None if nats_auth is None else nats_auth == "nkeys",
            db_url=os.environ.get("NANOCRAB_DB_URL") or default_url(home),
            traces=cast(TraceExporter, traces),  # checked above: `in` does not narrow a str
            sync=os.environ.get("NANOCRAB_SYNC", "default"),
            provider=cast(Literal["anthropic", "scripted"], provider),  # checked above
            anthropic_api_key=SecretStr(key) if key else None,
            model=os.environ.get("NANOCRAB_MODEL", ""),
            script=script,
            web_allow=web_allow,
            search_provider=os.environ.get("NANOCRAB_SEARCH_PROVIDER") or "brave",
            search_api_key=SecretStr(search_key) if search_key else None,
            search_url=os.environ.get("NANOCRAB_SEARCH_URL") or None,
            user_skills=Path.home() / ".nanocrab" / "skills",
            user=os.environ.get("USER") or getpass.getuser() or "cli",
        )

    def bus(self) -> BusConfig:
        cluster, tags = self.stream_placement
        return BusConfig(
            url=self.nats_url, data_dir=self.home, auth=self.nats_auth,
            replicas=self.stream_replicas, placement_cluster=cluster, placement_tags=tags,
        )  # fmt: skip


def _replicas(value: str) -> int:
    """``NANOCRAB_STREAM_REPLICAS``: 1 to 5 (JetStream's limit)."""
    if not value.isdigit() or not 1 <= int(value) <= 5:
        raise ValueError(f"NANOCRAB_STREAM_REPLICAS={value!r}: use 1 to 5 (3 on a 3-node cluster)")
    return int(value)


def _placement(value: str) -> tuple[str | None, tuple[str, ...]]:
    """``NANOCRAB_STREAM_PLACEMENT``: ``cluster``, ``cluster:tag,tag`` or ``:tag``."""
    cluster, _, tags = value.partition(":")
    return cluster.strip() or None, tuple(t.strip() for t in tags.split(",") if t.strip())


def _listen(value: str | None) -> tuple[str, int] | None:
    """``NANOCRAB_GATEWAY``: ``host:port`` (``[::1]:8787`` for IPv6) or ``port`` (loopback)."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"NANOCRAB_GATEWAY={value!r}: use host:port, e.g. 127.0.0.1:8787")
    return host.strip("[]") or "127.0.0.1", int(port)
