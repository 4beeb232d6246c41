"""What a grant for a capability call is bound to: that exact code.

The policy decides a ``capability`` call's tier from what the capability declares, and the
executor runs it later, looking it up by name again. Between the two a new version can become
current (a ``capability.registered`` is all it takes), so the grant must name the code it was
decided on: the policy adds :func:`pin` as one of the grant's resources (covered by its binding
hash, so an approval is for that code too), and the ``capability`` tool refuses to run anything
else. An adversarial pass swapped an ``fs.write`` version in after a Safe grant for an
``fs.read`` one, and it ran with the workspace writable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import NamedTuple

PREFIX = "capability:"


class Pinned(NamedTuple):
    """An enabled capability as a decision sees it: what it declares, and the resource naming
    exactly its code."""

    permissions: tuple[str, ...]
    resource: str


def pin(name: str, version: str, code: str, entry: str, permissions: Sequence[str]) -> str:
    """``capability:<name>@<version>#<digest>``: the digest covers the code, its entry point and
    its declared permissions, so the same version string with other code is another pin."""
    digest = hashlib.sha256(
        json.dumps([code, entry, sorted(permissions)], ensure_ascii=False).encode()
    ).hexdigest()[:32]
    return f"{PREFIX}{name}@{version}#{digest}"


def pins(resources: Sequence[str | None]) -> list[str]:
    """The capability pins among a grant's resources."""
    return [r for r in resources if r is not None and r.startswith(PREFIX)]


def session_tool(tool: str, resources: Sequence[str | None]) -> str:
    """The tool part of a session approval's key: for a ``capability`` call, the pins of the
    code approved (an approval of one capability covered every other, and later versions)."""
    if tool != "capability":
        return tool
    return " ".join(pins(resources)) or tool
