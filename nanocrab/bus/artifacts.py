"""Large payloads in the JetStream Object Store; events carry an ``ArtifactRef`` and a preview."""

from __future__ import annotations

import hashlib
import logging
import re
from functools import partial

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from nanocrab.bus.config import BusConfig
from nanocrab.bus.connection import patiently
from nanocrab.bus.errors import BusError
from nanocrab.bus.log import EventLog
from nanocrab.bus.permissions import artifact_bucket
from nanocrab.events import ArtifactRef

log = logging.getLogger(__name__)


async def ensure_bucket(js: JetStreamContext, cfg: BusConfig) -> None:
    """Create the artifact bucket if missing (set-up, as ``admin`` when permissions are on;
    each request waits out a leader election, ``connection.patiently``)."""
    bucket = artifact_bucket(cfg)
    try:
        await patiently(partial(js.object_store, bucket), f"bucket {bucket}")
    except (BucketNotFoundError, NotFoundError):
        # as many copies as the streams: an artifact outlives a node like its event does
        config = ObjectStoreConfig(replicas=cfg.replicas)
        await patiently(
            partial(js.create_object_store, bucket, config=config), f"creating bucket {bucket}"
        )


class JetStreamArtifacts:
    """Stores artifacts in the object-store bucket ``<root>_artifacts``.

    Keys are ``<sha256>/<name>``: the same bytes stored twice are one object, written once (so
    the writer never needs to purge the old chunks of a rewritten object, which the broker's
    permissions do not allow it). The bucket is created at set-up; without broker permissions
    it is also created on first use.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.bucket = artifact_bucket(log.cfg)
        self._store: ObjectStore | None = None

    async def _obj(self) -> ObjectStore:
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
            try:
                await store.get_info(key)
            except ObjectNotFoundError:
                await store.put(key, data)
        except (nats.errors.Error, OSError) as exc:
            raise BusError(f"could not store artifact {name!r}: {exc!r}") from exc
        return ArtifactRef(
            bucket=self.bucket, key=key, size=len(data), sha256=digest,
            media_type=media_type, preview=preview,
        )  # fmt: skip

    async def get(self, ref: ArtifactRef) -> bytes:
        return await self.read(ref.key)

    async def read(self, key: str) -> bytes:
        """The bytes stored under ``key`` (an ``ImageBlock.artifact``, an ``ArtifactRef.key``).
        Raises the client's ``nats.errors.Error`` (``ObjectNotFoundError`` for no such key,
        :class:`ArtifactMismatch` for bytes that are not the ones the key names).

        The key's first part is the bytes' SHA-256, and it is checked: an identity with rights
        on the bucket (the CLI, the gateway) can store an object again under an existing key,
        and what a reader passes on — a tool's full output, an image the model is shown, a
        replay — must be what was stored when the event naming it was written."""
        store = await self._obj()
        result = await store.get(key)
        data = bytes(result.data or b"")
        digest = key.split("/", 1)[0]
        if _DIGEST.fullmatch(digest) and hashlib.sha256(data).hexdigest() != digest:
            log.warning("artifact %s: the stored bytes do not have the digest its key names "
                        "(rewritten in the object store?): not read", key)  # fmt: skip
            raise ArtifactMismatch(description=f"artifact {key}: stored bytes do not match")
        return data


class ArtifactMismatch(ObjectNotFoundError):
    """An object whose bytes are not the ones its key's digest names: as good as missing (a
    reader never passes them on)."""


_DIGEST = re.compile(r"[0-9a-f]{64}")
