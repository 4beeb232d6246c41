"""Keys, signatures and binding hashes (nanocrab.security), without a bus."""

from __future__ import annotations

import os
import stat
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from nanocrab.events import ApprovalGranted, Capability, GrantIssued, utcnow
from nanocrab.security import KeyFileError, KeyRing, binding_hash, sign, verify


def grant(**changes: object) -> GrantIssued:
    g = GrantIssued(
        grant_id="g1", call_id="c1", tool="write",
        capabilities=[Capability(tool="write", resource="/ws/a.txt", access="write")],
        scope="step", tier="guarded", expires_at=utcnow() + timedelta(minutes=1),
        run_id="run-1", session_id="s-1", binding_hash="h", nonce="n",
    )  # fmt: skip
    return msgspec.structs.replace(g, **changes) if changes else g


def test_seeds_are_created_owner_only_and_reused(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    first = ring.public_key("policy")
    assert first.startswith("U") and ring.public_key("policy") == first
    assert stat.S_IMODE(os.stat(ring.seed_path("policy")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    assert KeyRing(tmp_path / "keys").public_key("policy") == first, "another process agrees"
    assert ring.public_key("approver") != first


def test_a_seed_readable_by_others_is_refused(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    ring.seed("policy")
    os.chmod(ring.seed_path("policy"), 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        ring.keypair("policy")


def test_a_corrupt_seed_and_a_bad_name_are_clear_errors(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    ring.seed("policy")
    ring.seed_path("policy").write_bytes(b"SUnot-a-seed\n")
    with pytest.raises(KeyFileError, match="valid nkey seed"):
        ring.keypair("policy")
    with pytest.raises(KeyFileError, match="invalid identity name"):
        ring.seed_path("../evil")


def test_a_signature_covers_run_session_and_every_payload_field(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    trusted = {ring.public_key("policy")}
    signed = sign(grant(), ring.keypair("policy"))
    assert verify(signed, trusted) is None
    # the runtime stamps id, time and causation after signing: not covered
    assert verify(msgspec.structs.replace(signed, id="X" * 26, causation_id="c"), trusted) is None
    for change in ({"run_id": "run-2"}, {"session_id": "s-2"}, {"tier": "safe"},
                   {"expires_at": utcnow() + timedelta(days=1)}, {"binding_hash": "other"},
                   {"capabilities": [Capability(tool="write", resource="/")]}):  # fmt: skip
        assert "invalid signature" in (verify(msgspec.structs.replace(signed, **change), trusted)
                                       or ""), change  # fmt: skip


def test_unsigned_untrusted_and_garbled_signatures_are_refused(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    trusted = {ring.public_key("policy")}
    assert "not signed" in (verify(grant(), trusted) or "")
    other = sign(grant(), ring.keypair("mallory"))
    assert "not a trusted key" in (verify(other, trusted) or "")
    garbled = msgspec.structs.replace(sign(grant(), ring.keypair("policy")), signature="!!")
    assert "invalid signature" in (verify(garbled, trusted) or "")
    wrong_key = msgspec.structs.replace(other, signer="UNOTAKEY")
    assert verify(wrong_key, {"UNOTAKEY"}) is not None


def test_an_approval_signature_binds_its_answer(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    answer = sign(
        ApprovalGranted(approval_id="a1", approver="ann", binding_hash="h1", run_id="r"),
        ring.keypair("approver"),
    )
    trusted = {ring.public_key("approver")}
    assert verify(answer, trusted) is None
    assert verify(msgspec.structs.replace(answer, remember="session"), trusted) is not None
    assert verify(msgspec.structs.replace(answer, approval_id="a2"), trusted) is not None


def test_the_binding_hash_is_one_exact_call() -> None:
    base = binding_hash("write", {"path": "a", "content": "x"}, ["/ws/a"], "n1")
    assert base == binding_hash("write", {"content": "x", "path": "a"}, ["/ws/a"], "n1")
    assert base != binding_hash("write", {"path": "a", "content": "y"}, ["/ws/a"], "n1")
    assert base != binding_hash("write", {"path": "a", "content": "x"}, ["/ws/b"], "n1")
    assert base != binding_hash("edit", {"path": "a", "content": "x"}, ["/ws/a"], "n1")
    assert base != binding_hash("write", {"path": "a", "content": "x"}, ["/ws/a"], "n2")
