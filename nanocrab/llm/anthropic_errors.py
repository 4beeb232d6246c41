"""Classify the anthropic SDK's failures as :class:`LlmError` (overflow / retryable / fatal).

The handler acts on the kind alone: ``overflow`` → compact the context and retry, ``retryable``
→ back off and retry, ``fatal`` → fail the run. Messages are written for the person reading the
run's timeline: what happened, the status, the API's own words, and what to do about it.

Rules, by HTTP status (or, for an ``error`` event inside a 200 stream, the status its
``error.type`` stands for):

* 400 whose message says the prompt is too long / exceeds the context window, and 413 (request
  too large) → ``overflow``: a smaller context can succeed.
* 429 → ``retryable``, unless it is a spend limit or the message speaks of quota, credit or
  billing → ``fatal`` (waiting will not refill an account).
* 408, 409, 5xx (529 overloaded included), connection failures, timeouts and connections dropped
  mid-stream → ``retryable``.
* 401, 402, 403, 404, other 400s and other 4xx → ``fatal``.
* an in-stream error of a type this module does not know → ``retryable``: the request was
  accepted, so the failure happened on the server's side.
"""

from __future__ import annotations

import re

import anthropic
import httpx2

from nanocrab.llm.base import LlmError, LlmErrorKind

_OVERFLOW = re.compile(
    r"prompt is too long|too many (input )?tokens|context (window|length|limit)|maximum context",
    re.IGNORECASE,
)
_QUOTA = re.compile(r"quota|credit|billing|spend(ing)? limit|usage limit", re.IGNORECASE)
_QUOTA_CODES = frozenset({"contract_spend_limit_reached", "enforced_spend_limit_reached"})

STATUS_OF_ERROR_TYPE: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""The documented ``error.type`` values and the HTTP status each is sent with."""


def classify_status_error(exc: anthropic.APIStatusError, *, model: str) -> LlmError:
    """An HTTP error response, or an ``error`` event that arrived inside a 200 stream."""
    in_stream = exc.status_code < 400
    status = STATUS_OF_ERROR_TYPE.get(exc.type or "", 500) if in_stream else exc.status_code
    label = f"{exc.type or 'error'} event in the response stream" if in_stream else str(status)
    detail = _detail(exc)
    code = None if in_stream else status
    retry_after = None if in_stream else _retry_after(exc.response.headers)

    def error(kind: LlmErrorKind, what: str, hint: str = "") -> LlmError:
        message = f"{what} ({label}): {detail}" + (f" — {hint}" if hint else "")
        return LlmError(kind, message, status_code=code, retry_after=retry_after)

    if status == 413 or (status == 400 and _OVERFLOW.search(detail)):
        return error("overflow", "context overflow", "the conversation must be compacted")
    if status == 400:
        return error("fatal", "invalid request", "the request nanocrab built was rejected")
    if status == 401:
        return error("fatal", "authentication failed", "check ANTHROPIC_API_KEY")
    if status == 402:
        return error("fatal", "billing problem", "check the plan and credit balance")
    if status == 403:
        return error("fatal", "permission denied", "the API key may not use this model or feature")
    if status == 404:
        return error("fatal", "not found", f"check the model name {model!r}")
    if status == 429:
        if exc.error_code in _QUOTA_CODES or _QUOTA.search(detail):
            return error("fatal", "quota exhausted", "add credits or raise the spend limit")
        return error("retryable", "rate limited")
    if status == 529:
        return error("retryable", "the API is overloaded")
    if status >= 500:
        return error("retryable", "server error")
    if status in (408, 409):
        return error("retryable", "request not completed")
    return error("fatal", "request rejected")


def classify_connection_error(exc: anthropic.APIConnectionError, *, base_url: str) -> LlmError:
    """No response at all: the SDK could not connect, or gave up waiting (``APITimeoutError``)."""
    cause = exc.__cause__ or exc
    if isinstance(exc, anthropic.APITimeoutError):
        return LlmError("retryable", f"the Anthropic API at {base_url} did not answer in time")
    return LlmError(
        "retryable",
        f"cannot reach the Anthropic API at {base_url}: {_describe(cause)} — check the network",
    )


def classify_stream_error(exc: httpx2.TransportError) -> LlmError:
    """The connection failed after the response began: the SDK lets these through unwrapped."""
    if isinstance(exc, httpx2.TimeoutException):
        return LlmError("retryable", f"the response stream stalled: {_describe(exc)}")
    return LlmError("retryable", f"the connection dropped mid-response: {_describe(exc)}")


def _detail(exc: anthropic.APIStatusError) -> str:
    if exc.api_message:
        return exc.api_message
    body = exc.body if isinstance(exc.body, str) else ""
    return body.strip()[:200] or "no error message in the response"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds from ``retry-after-ms`` or a numeric ``retry-after``; an HTTP date is ignored."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None
