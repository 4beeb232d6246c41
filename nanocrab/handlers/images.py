"""The bytes behind a model request's image blocks, read from the object store for one call.

Events carry an image as an :class:`~nanocrab.events.ImageBlock` naming its artifact (a content
hash), never inline. Just before a model call the LLM handler gives the request the bytes of
every image its messages name (:attr:`ModelRequest.images`); a provider sends them as image
content. Objects are content-addressed and never change, so recently used ones are cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator

import msgspec
import nats.errors
import nats.js.errors

from nanocrab.bus import EventLog
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.bus.errors import TransientError
from nanocrab.events import ImageBlock, ToolResultBlock
from nanocrab.llm.base import ModelRequest

ImageReader = Callable[[str], Awaitable[bytes]]
"""An artifact key → its bytes; raises ``nats.js.errors.NotFoundError`` for a missing one."""

_CACHED = 32


class ImageSource:
    """Fills :attr:`ModelRequest.images` from ``read``. An image whose object is gone is left
    out (the provider then tells the model it exists but cannot be shown); a store that cannot
    be read now raises :class:`TransientError`, so the delivery is retried."""

    def __init__(self, read: ImageReader) -> None:
        self._read = read
        self._cache: OrderedDict[str, bytes] = OrderedDict()

    @classmethod
    def of_log(cls, log: EventLog) -> ImageSource:
        return cls(JetStreamArtifacts(log).read)

    async def attach(self, request: ModelRequest) -> ModelRequest:
        keys = list(dict.fromkeys(image_keys(request)))
        if not keys:
            return request
        images: dict[str, bytes] = {}
        for key in keys:
            data = await self._get(key)
            if data is not None:
                images[key] = data
        return msgspec.structs.replace(request, images=images)

    async def _get(self, key: str) -> bytes | None:
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        try:
            data = await self._read(key)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, OSError) as exc:
            raise TransientError(f"cannot read image {key!r}: {exc!r}") from exc
        self._cache[key] = data
        while len(self._cache) > _CACHED:
            self._cache.popitem(last=False)
        return data


def image_keys(request: ModelRequest) -> Iterator[str]:
    """The artifact keys of every image block in ``request``'s messages, in order."""
    for message in request.messages:
        for block in message.content:
            if isinstance(block, ImageBlock):
                yield block.artifact
            elif isinstance(block, ToolResultBlock):
                yield from (b.artifact for b in block.content if isinstance(b, ImageBlock))
