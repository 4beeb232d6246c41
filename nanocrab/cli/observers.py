"""Outside clients: named observers (read-only NATS identities) and how to connect
(docs/events.md §6).

An observer is a public key in ``<keys dir>/observers/<name>.pub``; its seed is in
``<keys dir>/observers/<name>.nk`` (0600) unless it was handed out once and not kept. Every
server configuration rendered for the data dir (the embedded server's, ``nanocrab security
nats-config``) includes each listed observer with :func:`nanocrab.bus.permissions.observer_allow`,
so an observer survives a restart of ``nanocrab up``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from nanocrab.bus import EmbeddedServer
from nanocrab.bus.permissions import check_observer_name
from nanocrab.cli.settings import Settings
from nanocrab.security import KeyRing, SecurityError, new_seed


@dataclass(frozen=True, kw_only=True)
class Observer:
    """One observer: its public key, and where its seed is kept (``None``: printed once)."""

    name: str
    public_key: str
    seed_path: Path | None


def observers_dir(keys_dir: Path) -> Path:
    return Path(keys_dir) / "observers"


def observer_keys(keys_dir: Path) -> dict[str, str]:
    """Every observer's public key, by name (empty when there is none)."""
    directory = observers_dir(keys_dir)
    if not directory.is_dir():
        return {}
    return {p.stem: p.read_text().strip() for p in sorted(directory.glob("*.pub"))}


def find_observer(keys_dir: Path, name: str) -> Observer | None:
    """The observer called ``name``, or ``None``."""
    key = observer_keys(keys_dir).get(name)
    if key is None:
        return None
    seed = observers_dir(keys_dir) / f"{name}.nk"
    return Observer(name=name, public_key=key, seed_path=seed if seed.exists() else None)


def create_observer(keys_dir: Path, name: str, *, keep_seed: bool) -> tuple[Observer, bytes]:
    """Create observer ``name`` and return it with its seed (``SU…``).

    ``keep_seed`` writes the seed to ``<name>.nk`` (0600); otherwise only the public key is
    stored and the returned seed is the one copy. Raises ``ValueError`` for a bad or taken name.
    """
    check_observer_name(name)
    if find_observer(keys_dir, name) is not None:
        raise ValueError(f"observer {name!r} exists already ({observers_dir(keys_dir)})")
    directory = observers_dir(keys_dir)
    if keep_seed:
        ring = KeyRing(directory)
        try:
            seed = ring.seed(name)
        except SecurityError as exc:
            raise ValueError(str(exc)) from exc
        seed_path: Path | None = ring.seed_path(name)
    else:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        seed, seed_path = new_seed(), None
    key: bytes = nkeys.from_seed(bytearray(seed)).public_key  # nkeys is untyped
    pub = directory / f"{name}.pub"
    tmp = pub.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(key.decode() + "\n")
    os.replace(tmp, pub)
    return Observer(name=name, public_key=key.decode(), seed_path=seed_path), seed


def connect_snippets(url: str, seed_file: str) -> dict[str, str]:
    """One line per client library connecting to ``url`` with the nkey seed in ``seed_file``."""
    return {
        "python": f'nc = await nats.connect("{url}", nkeys_seed="{seed_file}")',
        "javascript": (
            f'const nc = await connect({{ servers: "{url}", authenticator: nkeyAuthenticator('
            f'new TextEncoder().encode(readFileSync("{seed_file}", "utf8").trim())) }});'
        ),
        "go": (
            f'opt, _ := nats.NkeyOptionFromSeed("{seed_file}"); nc, _ := nats.Connect("{url}", opt)'
        ),
    }


def server_info(settings: Settings, server: EmbeddedServer | None) -> dict[str, Any]:
    """Where an outside client connects and with what (``nanocrab status``): ``url``, ``external``,
    ``lifetime`` (whether the URL outlives this command), ``auth`` (``nkeys`` or ``none``),
    ``observers`` (names) and ``connect``, one line saying how."""
    cfg = settings.bus()
    url = settings.nats_url if server is None else server.url
    if server is None:
        lifetime = "external server (NANOCRAB_NATS_URL)"
    elif server.owned:
        lifetime = (
            "embedded, started for this command only: `nanocrab up` keeps a server on this "
            "data dir (port 4222, or a free one when 4222 is taken)"
        )
    else:
        lifetime = f"embedded, running (pid {server.pid})"
    names = sorted(observer_keys(cfg.keys_dir)) if cfg.authenticated else []
    if not cfg.authenticated:
        connect = "no credentials (NANOCRAB_NATS_AUTH=none); see docs/events.md §6"
    elif names:
        where = observers_dir(cfg.keys_dir)
        connect = (
            f"with an observer's nkey seed ({', '.join(names)}: {where}/NAME.nk); "
            "new one: `nanocrab security observer NAME`; see docs/events.md §6"
        )
    else:
        connect = (
            "with an nkey seed: create a read-only one with `nanocrab security observer NAME`; "
            "see docs/events.md §6"
        )
    return {
        "url": url,
        "external": server is None,
        "lifetime": lifetime,
        "auth": "nkeys" if cfg.authenticated else "none",
        "observers": names,
        "connect": connect,
    }
