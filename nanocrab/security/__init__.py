"""Keys, signatures and binding hashes for grants and approvals (DESIGN §8)."""

from nanocrab.security.errors import KeyError_, SecurityError
from nanocrab.security.keys import KeyRing, new_seed
from nanocrab.security.signing import binding_hash, canonical_bytes, sign, verify

__all__ = [
    "KeyError_",
    "KeyRing",
    "SecurityError",
    "binding_hash",
    "canonical_bytes",
    "new_seed",
    "sign",
    "verify",
]
