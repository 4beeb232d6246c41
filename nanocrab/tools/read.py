"""The ``read`` tool: a window of a text file, with a hint where to continue; an image file as
an image block for the model."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from nanocrab.events import ImageBlock, ReadDetails, TextBlock
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.images import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_EDGE,
    ImageTooLarge,
    ImageUndecodable,
    fit_image,
    sniff_image,
)
from nanocrab.tools.paths import display_path, not_found, os_error
from nanocrab.tools.text import BOM, count_lines, looks_binary


class ReadArgs(ToolArgs):
    path: str = Field(description="File to read, relative to the workspace.")
    offset: int = Field(default=1, ge=1, description="First line to return (1-based).")
    limit: int = Field(default=2000, ge=1, description="Maximum number of lines to return.")


class ReadTool:
    """Reads at most ``limit`` lines and ``max_bytes`` bytes from ``offset`` on.

    Lines are returned as they are in the file, without line numbers, with CRLF shown as LF and a
    UTF-8 BOM dropped, so the text can be copied into ``edit``. When more follows, the content
    ends with ``[… N more lines; continue with offset=K]`` and ``ReadDetails.next_offset`` is K.
    A single line longer than ``max_bytes`` is cut, with a note saying so.

    A PNG, JPEG, GIF or WebP file (by its first bytes) comes back as an image block: scaled to
    ``max_image_bytes`` and ``max_image_edge`` (:mod:`nanocrab.tools.images`), stored in the
    artifact store by content hash, and named in the block by its key — never inline in the
    event. ``offset`` and ``limit`` do not apply to it.
    """

    name: ClassVar[str] = "read"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "Read a text file in the workspace. Returns up to `limit` lines (default 2000) and about "
        "50 KB starting at line `offset` (1-based); when the file is longer the output ends with "
        "the offset to continue from. Use grep to find the lines you need in large files. "
        "An image file (PNG, JPEG, GIF, WebP) is returned as an image you can see."
    )
    args_model: ClassVar[type[ToolArgs]] = ReadArgs
    idempotent: ClassVar[bool] = True  # reads only: re-run after a crash

    def __init__(
        self,
        *,
        max_bytes: int = 50_000,
        max_file_bytes: int = 64 * 1024 * 1024,
        max_image_bytes: int = MAX_IMAGE_BYTES,
        max_image_edge: int = MAX_IMAGE_EDGE,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes
        self.max_image_bytes = max_image_bytes
        self.max_image_edge = max_image_edge

    async def run(self, args: ReadArgs, ctx: ToolContext) -> ToolResult:
        path = await ctx.ops.resolve(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, path)
        try:
            info = await ctx.ops.stat(path, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        if info is None:
            raise not_found(shown)
        if info.is_dir:
            raise ToolError("invalid_arguments", f"{shown} is a directory; use ls to list it.")
        if info.size > self.max_file_bytes:
            raise ToolError(
                "failed",
                f"{shown} is {info.size} bytes, more than read handles ({self.max_file_bytes}); "
                "use grep to find the lines you need, or exec with head/tail/sed.",
            )
        try:
            data = await ctx.ops.read_bytes(path, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        media_type = sniff_image(data)
        if media_type is not None:
            return await self._image(data, media_type, shown, ctx)
        if looks_binary(data):
            raise ToolError(
                "failed",
                f"{shown} is a binary file ({len(data)} bytes) and cannot be shown as text; "
                "use exec (e.g. `file`, `xxd | head`) to inspect it.",
            )
        text = data.decode("utf-8", errors="replace").removeprefix(BOM).replace("\r\n", "\n")
        return self._window(text, shown, args.offset, args.limit)

    async def _image(
        self, data: bytes, media_type: str, shown: str, ctx: ToolContext
    ) -> ToolResult:
        try:
            image = fit_image(
                data, media_type, max_bytes=self.max_image_bytes, max_edge=self.max_image_edge
            )
        except ImageUndecodable as exc:
            raise ToolError(
                "failed",
                f"{shown} is a binary file ({len(data)} bytes) and cannot be shown as text or as "
                f"an image ({exc}); use exec (e.g. `file`, `xxd | head`) to inspect it.",
            ) from exc
        except ImageTooLarge as exc:
            raise ToolError("failed", f"{shown} cannot be shown: {exc}.") from exc
        name = shown.rsplit("/", 1)[-1] or "image"
        ref = await ctx.artifacts.put(name, image.data, media_type=image.media_type)
        size = f"{image.width}x{image.height}, " if image.width and image.height else ""
        note = f" (scaled down from {len(data)} bytes)" if image.resized else ""
        details = ReadDetails(
            path=shown, offset=1, lines=0, total_lines=0, media_type=image.media_type,
            image_bytes=len(image.data), width=image.width, height=image.height,
            resized=image.resized,
        )  # fmt: skip
        return ToolResult(
            content=[
                TextBlock(
                    f"{shown}: {image.media_type} image, {size}{len(image.data)} bytes{note}"
                ),
                ImageBlock(media_type=image.media_type, artifact=ref.key),
            ],
            details=details,
            artifacts=[ref],
        )

    def _window(self, text: str, shown: str, offset: int, limit: int) -> ToolResult:
        total = count_lines(text)
        if total == 0:
            details = ReadDetails(path=shown, offset=1, lines=0, total_lines=0)
            return ToolResult.text(f"({shown} is empty)", details=details)
        if offset > total:
            raise ToolError(
                "invalid_arguments",
                f"offset={offset} is past the end of {shown}, which has {total} lines.",
            )
        lines = text.split("\n", offset - 1 + limit)
        window = lines[offset - 1 : offset - 1 + limit]
        if offset - 1 + len(window) > total:
            window = window[: total - (offset - 1)]
        body = "\n".join(window)
        if len(body.encode()) < self.max_bytes:
            parts, note = window, ""
        else:
            parts, note = self._fit(window, offset)
            body = "\n".join(parts)
        last = offset - 1 + len(parts)
        truncated = last < total
        next_offset = last + 1 if truncated else None
        if note:
            body += "\n\n" + note
        if truncated:
            body += f"\n\n[… {total - last} more lines; continue with offset={next_offset}]"
        details = ReadDetails(
            path=shown, offset=offset, lines=len(parts), total_lines=total,
            truncated=truncated, next_offset=next_offset,
        )  # fmt: skip
        return ToolResult.text(body, details=details)

    def _fit(self, window: list[str], offset: int) -> tuple[list[str], str]:
        """The leading lines of ``window`` that fit ``max_bytes``, and a note when the first
        line alone does not fit and had to be cut."""
        parts: list[str] = []
        size = 0
        for line in window:
            cost = len(line.encode()) + 1
            if size + cost > self.max_bytes:
                break
            parts.append(line)
            size += cost
        if parts:
            return parts, ""
        first = window[0].encode()
        cut = first[: self.max_bytes].decode(errors="ignore")
        note = (
            f"[line {offset} is {len(first)} bytes; showing its first {len(cut.encode())}. "
            "Use grep or exec (e.g. `cut -c`) to see the rest.]"
        )
        return [cut], note
