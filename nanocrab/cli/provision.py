"""The keys of one handler host: its own seed and the public keys it verifies with.

A process started by ``nanocrab handler NAME`` on its own host holds exactly one nkey seed — its
identity's, which authenticates its NATS connection and signs its events — and the public keys
(``<name>.pub``) of the identities whose signatures it checks: the policy's (grants) and the
approver's (approvals). An executor host therefore can verify a grant but never mint one: there
is no policy seed on it. :func:`export_host_keys` writes such a directory from a data dir that
holds every seed (the one whose public keys the cluster's authorization lists).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import nkeys

from nanocrab.bus.permissions import APPROVER, HANDLER_IDENTITIES, POLICY, PROJECTOR
from nanocrab.security import KeyRing
from nanocrab.security.errors import KeyFileError

HOST_IDENTITIES: Final = (*HANDLER_IDENTITIES, PROJECTOR)
"""What ``nanocrab handler NAME`` can run."""

VERIFIES: Final = (POLICY, APPROVER)
"""The public keys every handler host gets: what the wiring verifies grants and approvals with
(the projector verifies nothing, but a public key is no secret)."""


class HostKeys(KeyRing):
    """A :class:`KeyRing` that never invents a seed: an identity without ``<name>.nk`` is known
    only by its public key in ``<name>.pub``.

    :meth:`keypair` of such an identity is a verify-only key pair: signing with it fails, so a
    handler wired on the wrong host cannot sign as another identity.
    """

    def seed(self, name: str) -> bytes:
        if not self.exists(name):
            raise KeyFileError(
                f"no nkey seed for {name!r} in {self.dir}: this host runs another identity; "
                f"`nanocrab cluster keys {name} DIR` exports one from the data dir holding all"
            )
        return super().seed(name)

    def keypair(self, name: str) -> nkeys.KeyPair:
        if self.exists(name):
            return super().keypair(name)
        return nkeys.KeyPair(public_key=self.public_key(name).encode())

    def public_key(self, name: str) -> str:
        if self.exists(name):
            return super().public_key(name)
        path = self.dir / f"{name}.pub"
        try:
            key = path.read_text().strip()
        except FileNotFoundError as exc:
            raise KeyFileError(
                f"no key for {name!r} in {self.dir}: neither {name}.nk nor {name}.pub; "
                f"`nanocrab cluster keys IDENTITY DIR` writes a host's keys"
            ) from exc
        if not (key.startswith("U") and len(key) == 56):
            raise KeyFileError(f"{path} does not hold a public user nkey (U…, 56 chars)")
        return key


def export_host_keys(source: KeyRing, identity: str, dest: Path) -> list[Path]:
    """Write ``identity``'s seed and the :data:`VERIFIES` public keys into ``dest``; returns
    the files written. Never writes another identity's seed."""
    if identity not in HOST_IDENTITIES:
        raise ValueError(f"unknown handler {identity!r}; known: {', '.join(HOST_IDENTITIES)}")
    return export_keys(source, dest, seeds=(identity,), publics=VERIFIES)


def export_keys(
    source: KeyRing, dest: Path, *, seeds: Sequence[str], publics: Sequence[str] = ()
) -> list[Path]:
    """Write the ``seeds`` (``<name>.nk``, 0600, directory 0700) and the public keys of
    ``publics`` not among them (``<name>.pub``) into ``dest``; returns the files written."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(dest, 0o700)
    written = []
    for name in seeds:
        seed_file = dest / f"{name}.nk"
        tmp = seed_file.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(source.seed(name) + b"\n")
        os.replace(tmp, seed_file)
        written.append(seed_file)
    for name in publics:
        if name in seeds:
            continue
        pub = dest / f"{name}.pub"
        pub.write_text(source.public_key(name) + "\n")
        written.append(pub)
    return written


__all__ = ["HOST_IDENTITIES", "VERIFIES", "HostKeys", "export_host_keys", "export_keys"]
