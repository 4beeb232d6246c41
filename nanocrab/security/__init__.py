"""Keys, signatures and binding hashes for grants and approvals (DESIGN §8)."""

from nanocrab.security.errors import KeyFileError, SecurityError
from nanocrab.security.keys import KeyRing, new_seed
from nanocrab.security.signing import binding_hash, canonical_bytes, sign, signed_by, verify

__all__ = [
    "KeyFileError",
    "KeyRing",
    "SecurityError",
    "binding_hash",
    "canonical_bytes",
    "new_seed",
    "sign",
    "signed_by",
    "verify",
]
