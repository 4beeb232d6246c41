"""Reading a JSON request body within a size limit, refusing with the right problem."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from nanocrab.gateway.errors import Problem

MAX_BODY = 64 * 1024
"""Bytes a request body may have (a task's text is well under it): 413 above."""
MAX_TASK_BODY = 24 * 1024 * 1024
"""Bytes a task body may have: it may carry images (base64), at most 4 of 5 MiB each."""
M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, model: type[M], *, limit: int = MAX_BODY) -> M:
    """The body as ``model``: 413 over ``limit`` bytes, 415 unless JSON, 400 for bad JSON,
    422 for the wrong shape. Reads at most ``limit + 1`` bytes, whatever the client claims."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise Problem(413, "too-large", "Request body too large", f"over {limit} bytes")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise Problem(
            415, "unsupported-media-type", "Send JSON",
            f"Content-Type {ctype or '(none)'!r}: use application/json",
        )  # fmt: skip
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Problem(413, "too-large", "Request body too large", f"over {limit} bytes")
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise Problem(400, "bad-json", "The body is not valid JSON", errors[0]["msg"]) from None
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors)
        raise Problem(422, "invalid-body", "The body does not match the schema", detail) from None
