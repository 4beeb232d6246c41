"""Signing and verifying events, and the binding hash that ties an approval to one call.

The signed bytes are canonical JSON (msgspec, dict keys sorted) of the event's type, tenant,
run, session and time plus every payload field except ``signature``. The rest of the envelope
(id, causation, trace) is stamped by the runtime after the handler returns and is not covered;
what a grant allows, for which run and session, and when it was given, is. So a signed event
cannot be moved to another run or session, re-typed, back-dated or edited.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
import nacl.exceptions
import nacl.signing
import nkeys

from nanocrab.events import Event, payload_fields

E = TypeVar("E", bound=Event)

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_bytes(event: Event) -> bytes:
    payload = {f: getattr(event, f) for f in payload_fields(type(event)) if f != "signature"}
    return _encoder.encode(
        [event.type, event.tenant, event.run_id, event.session_id, event.time, payload]
    )


def sign(event: E, keypair: nkeys.KeyPair) -> E:
    """``event`` with ``signer`` set to the key's public key and ``signature`` over it."""
    signed = msgspec.structs.replace(event, signer=keypair.public_key.decode())
    sig = keypair.sign(canonical_bytes(signed))
    return msgspec.structs.replace(signed, signature=base64.b64encode(sig).decode())


def verify(event: Event, trusted: Collection[str]) -> str | None:
    """``None`` when ``event`` is signed by one of ``trusted`` public keys; else why not."""
    signer: str = getattr(event, "signer", "")
    signature: str = getattr(event, "signature", "")
    if not signer or not signature:
        return f"{event.type} {event.id} is not signed"
    if signer not in trusted:
        return f"{event.type} {event.id} is signed by {signer[:12]}…, which is not a trusted key"
    try:
        _verified(signer, signature, canonical_bytes(event))
    except (nkeys.NkeysError, nacl.exceptions.CryptoError, ValueError, binascii.Error) as exc:
        return f"{event.type} {event.id} has an invalid signature ({exc.__class__.__name__})"
    return None


def signed_by(trusted: Collection[str]) -> Callable[[Event], bool]:
    """A predicate for "signed by one of ``trusted``" (what a run fold believes)."""
    keys = frozenset(trusted)
    return lambda event: verify(event, keys) is None


@functools.lru_cache(maxsize=1024)  # grants in flight; each entry holds the signed bytes
def _verified(signer: str, signature: str, payload: bytes) -> bool:
    """Raises unless ``signature`` by ``signer`` holds over ``payload``. Several handlers verify
    the same grant (the executor, the orchestrator's fold); the cache is keyed by the exact
    bytes, so only an identical signed event hits it."""
    _verify_key(signer).verify(payload, base64.b64decode(signature, validate=True))
    return True


@functools.lru_cache(maxsize=256)
def _verify_key(public: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key inside a public nkey (base32: prefix byte, 32 key bytes, crc16)."""
    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35 or not nkeys.valid_public_prefix_byte(raw[0]):
        raise nkeys.ErrInvalidPublicKey()
    if nkeys.crc16(bytearray(raw[:-2])) != int.from_bytes(raw[-2:], "little"):
        raise nkeys.ErrInvalidPublicKey()
    return nacl.signing.VerifyKey(raw[1:33])


def binding_hash(
    tool: str, arguments: Mapping[str, Any], resources: Sequence[str | None], nonce: str
) -> str:
    """sha256 over the exact call: the same tool with other arguments or on another resource
    hashes differently; the nonce makes each request's hash unique."""
    payload = _encoder.encode([tool, dict(arguments), list(resources), nonce])
    return hashlib.sha256(payload).hexdigest()
