"""Images for the model: recognise the formats it reads, and fit one within its limits.

A model accepts PNG, JPEG, GIF and WebP up to a few megabytes; past about 1568 pixels on the long
edge it scales the image down itself (and charges for the pixels first). :func:`fit_image`
returns bytes within ``max_bytes`` and ``max_edge``: unchanged when they already are, else
re-encoded smaller with Pillow when it is installed; an image that cannot be fitted raises
:class:`ImageTooLarge` saying why.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanocrab.events import ImageBlock

if TYPE_CHECKING:
    from nanocrab.tools.base import ArtifactStore

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MAX_IMAGE_BYTES = 3_750_000  # 5 MB once base64-encoded, the Messages API's per-image limit
MAX_IMAGE_EDGE = 1568  # pixels on the long edge past which the model downscales anyway


class ImageTooLarge(Exception):
    """The image exceeds the limits and could not be made to fit (no Pillow, or still too big)."""


class ImageUndecodable(ImageTooLarge):
    """The bytes start like an image but Pillow cannot decode them (truncated, corrupt)."""


@dataclass(frozen=True, slots=True)
class FittedImage:
    data: bytes
    media_type: str
    width: int | None  # None when Pillow is not installed to read it
    height: int | None
    resized: bool


def sniff_image(data: bytes) -> str | None:
    """The media type of ``data`` when it is one of :data:`IMAGE_TYPES` (by magic bytes)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def fit_image(
    data: bytes,
    media_type: str,
    *,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_edge: int = MAX_IMAGE_EDGE,
) -> FittedImage:
    """``data`` within ``max_bytes`` and ``max_edge`` (see the module docstring). Without
    Pillow an image is passed as it is when small enough, its size unchecked."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        if len(data) > max_bytes:
            raise ImageTooLarge(
                f"the image is {len(data)} bytes, over the {max_bytes}-byte limit, and Pillow is "
                "not installed to scale it down"
            ) from None
        return FittedImage(data, media_type, None, None, resized=False)
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageUndecodable(f"it cannot be decoded as {media_type}: {exc}") from exc
    if len(data) <= max_bytes and max(width, height) <= max_edge:
        return FittedImage(data, media_type, width, height, resized=False)
    if getattr(image, "is_animated", False):
        image.seek(0)  # the first frame of an animation stands for it
    edge = min(max_edge, max(width, height))
    for _ in range(6):
        scale = edge / max(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        out, out_type = _encode(image.resize(size, Image.Resampling.LANCZOS), media_type)
        if len(out) <= max_bytes:
            return FittedImage(out, out_type, size[0], size[1], resized=True)
        edge = int(edge * 0.7)
    raise ImageTooLarge(f"the image stays over {max_bytes} bytes even scaled down to {edge}px")


def _encode(image: object, media_type: str) -> tuple[bytes, str]:
    """PNG stays PNG (lossless, transparency); everything else becomes JPEG."""
    from PIL import Image

    assert isinstance(image, Image.Image)
    buf = io.BytesIO()
    if media_type == "image/png":
        image.save(buf, format="PNG", optimize=True)
        return buf.getvalue(), "image/png"
    image.convert("RGB").save(buf, format="JPEG", quality=85)
    return buf.getvalue(), "image/jpeg"


class NotAnImage(ValueError):
    """The bytes are not a PNG, JPEG, GIF or WebP image."""


async def store_image(
    store: ArtifactStore,
    name: str,
    data: bytes,
    *,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_edge: int = MAX_IMAGE_EDGE,
) -> ImageBlock:
    """``data`` fitted (:func:`fit_image`) and put in ``store`` under its content hash, as the
    image block a task or a result carries. Raises :class:`NotAnImage` or
    :class:`ImageTooLarge` saying what is wrong."""
    media_type = sniff_image(data)
    if media_type is None:
        raise NotAnImage(f"{name} is not a PNG, JPEG, GIF or WebP image")
    image = fit_image(data, media_type, max_bytes=max_bytes, max_edge=max_edge)
    ref = await store.put(name, image.data, media_type=image.media_type)
    return ImageBlock(media_type=image.media_type, artifact=ref.key)
