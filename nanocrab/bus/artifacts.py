"""Large payloads in the JetStream Object Store; events carry an ``ArtifactRef`` and a preview."""

from __future__ import annotations

import hashlib

import nats.errors
from nats.js.errors import BucketNotFoundError, NotFoundError

from nanocrab.bus.errors import BusError
from nanocrab.bus.log import EventLog
from nanocrab.events import ArtifactRef


class JetStreamArtifacts:
    """Stores artifacts in the object-store bucket ``<root>_artifacts`` (created on first use).

    Keys are ``<sha256>/<name>``: the same bytes stored twice are one object.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.bucket = f"{log.cfg.root}_artifacts"
        self._store = None

    async def _obj(self):  # type: ignore[no-untyped-def]
        if self._store is None:
            try:
                self._store = await self.log.js.object_store(self.bucket)
            except (BucketNotFoundError, NotFoundError):
                self._store = await self.log.js.create_object_store(self.bucket)
        return self._store

    async def put(
        self, name: str, data: bytes, *, media_type: str = "text/plain", preview: str = ""
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        key = f"{digest}/{name}"
        store = await self._obj()
        try:
            await store.put(key, data)
        except (nats.errors.Error, OSError) as exc:
            raise BusError(f"could not store artifact {name!r}: {exc!r}") from exc
        return ArtifactRef(
            bucket=self.bucket, key=key, size=len(data), sha256=digest,
            media_type=media_type, preview=preview,
        )  # fmt: skip

    async def get(self, ref: ArtifactRef) -> bytes:
        store = await self._obj()
        result = await store.get(ref.key)
        return bytes(result.data or b"")
