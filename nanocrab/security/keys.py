"""Ed25519 identities (NATS nkeys) kept in the data directory.

Each identity — a handler (``policy``, ``executor`` …) or a human approver — is one user nkey
seed in ``<keys dir>/<name>.nk``, created on first use with owner-only permissions (file 0600,
directory 0700). The same key signs that identity's events and, where the broker enforces
permissions, authenticates its NATS connection. A seed never enters an event; only public keys
(``U…``) do.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import nkeys

from nanocrab.security.errors import KeyFileError

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def new_seed() -> bytes:
    """A fresh user seed (``SU…``)."""
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)  # nkeys is untyped
    return seed


class KeyRing:
    """The identities of one data directory (``<home>/keys``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def seed_path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise KeyFileError(
                f"invalid identity name {name!r}: use lower-case letters, digits, - _"
            )
        return self.dir / f"{name}.nk"

    def _ensure_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)

    def seed(self, name: str) -> bytes:
        """The identity's seed, created (atomically, 0600) if it does not exist yet."""
        path = self.seed_path(name)
        try:
            return self._read(path)
        except FileNotFoundError:
            pass
        self._ensure_dir()
        seed = new_seed()
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(seed + b"\n")
        try:
            os.link(tmp, path)  # never replaces a seed another process created meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return self._read(path)

    def _read(self, path: Path) -> bytes:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(
                f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}); "
                f"run `chmod 600 {path}`"
            )
        seed = path.read_bytes().strip()
        try:
            nkeys.from_seed(bytearray(seed))
        except nkeys.NkeysError as exc:
            raise KeyFileError(f"{path} does not hold a valid nkey seed: {exc!r}") from exc
        return seed

    def keypair(self, name: str) -> nkeys.KeyPair:
        return nkeys.from_seed(bytearray(self.seed(name)))

    def public_key(self, name: str) -> str:
        key: bytes = self.keypair(name).public_key  # nkeys is untyped
        return key.decode()

    def exists(self, name: str) -> bool:
        return self.seed_path(name).exists()
