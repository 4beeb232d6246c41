"""CloudEvents 1.0 structured-mode JSON: the wire format and the public contract.

Envelope fields map to CloudEvents attributes; everything else is ``data``::

    {"specversion": "1.0", "id": "01J...", "type": "task.submitted", "source": "cli",
     "subject": "run/01J...", "time": "2026-...Z", "datacontenttype": "application/json",
     "tenant": "default", "runid": "01J...", "schemaversion": 2, "data": {"text": "..."}}

Extension attribute names are lower-case alphanumerics, as CloudEvents requires; absent
attributes are omitted, never ``null``. Unknown extension attributes are accepted and ignored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Union

import msgspec

from nanocrab.events.base import Event
from nanocrab.events.errors import DecodeErrorKind, EventDecodeError, UpcastError
from nanocrab.events.registry import DATA_STRUCTS, EVENT_TYPES, payload_fields
from nanocrab.events.upcast import UpcasterRegistry, default_upcasters

DEFAULT_MAX_EVENT_BYTES = 256 * 1024

# envelope field name -> CloudEvents extension attribute name
_EXTENSIONS: dict[str, str] = {
    "tenant": "tenant",
    "task_id": "taskid",
    "run_id": "runid",
    "step_id": "stepid",
    "session_id": "sessionid",
    "causation_id": "causationid",
    "correlation_id": "correlationid",
    "trace": "traceparent",
}


class _Envelope(msgspec.Struct, kw_only=True):
    specversion: str
    id: str
    source: str
    time: datetime
    datacontenttype: str = "application/json"
    subject: str | None = None
    tenant: str = "default"
    taskid: str | None = None
    runid: str | None = None
    stepid: str | None = None
    sessionid: str | None = None
    causationid: str | None = None
    correlationid: str | None = None
    traceparent: str | None = None
    schemaversion: int | msgspec.UnsetType = msgspec.UNSET  # read as 1; unset, to say so


class _Wire(_Envelope, kw_only=True):
    type: str
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # read as {}; unset, to say so


# One struct per event type whose ``data`` is that type's data struct, all in one tagged union:
# the common case (a known type at its current version) decodes and validates in a single pass.
_TYPED_WIRES: dict[type[msgspec.Struct], type[Event]] = {
    msgspec.defstruct(
        f"_Wire_{cls.__name__}",
        [("data", DATA_STRUCTS[tag])],
        bases=(_Envelope,),
        tag_field="type",
        tag=tag,
        kw_only=True,
    ): cls
    for tag, cls in EVENT_TYPES.items()
}
_fast_decoder = msgspec.json.Decoder(Union[tuple(_TYPED_WIRES)])  # noqa: UP007
_wire_decoder = msgspec.json.Decoder(_Wire)
_encoder = msgspec.json.Encoder()
_PAYLOAD_FIELDS = {name: payload_fields(cls) for name, cls in EVENT_TYPES.items()}


class Codec:
    """Encodes events to CloudEvents JSON bytes and decodes them back, strictly.

    ``decode`` raises :class:`EventDecodeError` whose ``kind`` is one of
    :class:`DecodeErrorKind`; it never returns a partially valid event. Payloads larger than
    ``max_bytes`` are refused in both directions, so an oversized event can neither be written
    by this code nor processed by it.
    """

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        upcasters: UpcasterRegistry = default_upcasters,
    ) -> None:
        self.max_bytes = max_bytes
        self._upcasters = upcasters

    def to_wire(
        self, event: Event, *, subject: str | None = None, trace: str | None = None
    ) -> dict[str, Any]:
        """The CloudEvents attribute dict for ``event`` (``data`` still holding Python values).

        ``trace`` fills the ``traceparent`` attribute when the event has none of its own.
        """
        wire: dict[str, Any] = {
            "specversion": "1.0",
            "id": event.id,
            "type": event.type,
            "source": event.source,
            "time": event.time,
            "datacontenttype": "application/json",
        }
        if subject is not None:
            wire["subject"] = subject
        for field, attr in _EXTENSIONS.items():
            value = getattr(event, field)
            if value is not None:
                wire[attr] = value
        if trace is not None and event.trace is None:
            wire["traceparent"] = trace
        wire["schemaversion"] = event.schema_version
        wire["data"] = {f: getattr(event, f) for f in _PAYLOAD_FIELDS[event.type]}
        return wire

    def encode(
        self, event: Event, *, subject: str | None = None, trace: str | None = None
    ) -> bytes:
        raw = _encoder.encode(self.to_wire(event, subject=subject, trace=trace))
        if len(raw) > self.max_bytes:
            raise EventDecodeError(
                DecodeErrorKind.OVERSIZED,
                f"{event.type} {event.id} encodes to {len(raw)} bytes, over the "
                f"{self.max_bytes}-byte limit; store large payloads as artifacts",
            )
        return raw

    def decode(self, raw: bytes | bytearray | memoryview) -> Event:
        if len(raw) > self.max_bytes:
            raise EventDecodeError(
                DecodeErrorKind.OVERSIZED, f"{len(raw)} bytes, over the {self.max_bytes}-byte limit"
            )
        try:
            fast = _fast_decoder.decode(raw)
        except msgspec.DecodeError:
            pass  # not the common case: the general path below says precisely what is wrong
        else:
            fast_cls = _TYPED_WIRES[type(fast)]
            if fast.schemaversion == fast_cls.schema_version:
                _check_envelope(fast)
                return _build(fast_cls, fast, msgspec.structs.asdict(fast.data))
        try:
            wire = _wire_decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise EventDecodeError(DecodeErrorKind.INVALID, f"envelope: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise EventDecodeError(DecodeErrorKind.MALFORMED, str(exc)) from exc
        _check_envelope(wire)
        cls = EVENT_TYPES.get(wire.type)
        if cls is None:
            raise EventDecodeError(
                DecodeErrorKind.UNKNOWN_TYPE, f"unknown event type {wire.type!r}"
            )
        data_type = DATA_STRUCTS[wire.type]
        version = 1 if wire.schemaversion is msgspec.UNSET else wire.schemaversion
        raw_data = msgspec.Raw(b"{}") if wire.data is msgspec.UNSET else wire.data
        what = f"{wire.type} data{' (absent, read as {})' if wire.data is msgspec.UNSET else ''}"
        try:
            if version == cls.schema_version:
                data = msgspec.json.decode(raw_data, type=data_type)
            elif version < cls.schema_version and version >= 1:
                old = msgspec.json.decode(raw_data, type=dict[str, Any])
                new = self._upcasters.upcast(
                    wire.type, old, from_version=version, to_version=cls.schema_version
                )
                data = msgspec.convert(new, type=data_type)
            else:
                raise EventDecodeError(
                    DecodeErrorKind.UNSUPPORTED_VERSION,
                    f"{wire.type} schema v{version}; this code knows v1..v{cls.schema_version}",
                )
        except msgspec.ValidationError as exc:
            if wire.schemaversion is msgspec.UNSET and version != cls.schema_version:
                raise _version_missing(wire.type, cls.schema_version, exc) from exc
            raise EventDecodeError(DecodeErrorKind.INVALID, f"{what}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise EventDecodeError(DecodeErrorKind.MALFORMED, f"{what}: {exc}") from exc
        except (UpcastError, KeyError, TypeError, ValueError) as exc:
            if wire.schemaversion is msgspec.UNSET:
                raise _version_missing(wire.type, cls.schema_version, exc) from exc
            raise EventDecodeError(
                DecodeErrorKind.UNSUPPORTED_VERSION,
                f"{wire.type} v{version} could not be upcast: {_why(exc)}",
            ) from exc
        return _build(cls, wire, msgspec.structs.asdict(data))


def _version_missing(event_type: str, current: int, exc: Exception) -> EventDecodeError:
    """An event without ``schemaversion`` whose data is not valid as v1 (how it is read): most
    likely current data from a publisher that left the attribute out."""
    return EventDecodeError(
        DecodeErrorKind.INVALID,
        f'{event_type}: "schemaversion" is missing, so its data was read as v1, and as v1 it is '
        f'not valid ({_why(exc)}); the current version is {current}: set "schemaversion": '
        f"{current}",
    )


def _why(exc: Exception) -> str:
    """An upcast or validation failure in words (a bare ``KeyError('prompt')`` says little)."""
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} field"
    return str(exc)


def _check_envelope(wire: _Envelope) -> None:
    if wire.specversion != "1.0":
        raise EventDecodeError(
            DecodeErrorKind.INVALID, f"specversion {wire.specversion!r}, expected '1.0'"
        )
    if not wire.id or not wire.source:
        raise EventDecodeError(DecodeErrorKind.INVALID, "id and source must be non-empty")
    if wire.time.tzinfo is None:
        raise EventDecodeError(DecodeErrorKind.INVALID, "time must carry a UTC offset")
    if wire.datacontenttype != "application/json":
        raise EventDecodeError(
            DecodeErrorKind.INVALID, f"datacontenttype {wire.datacontenttype!r} not supported"
        )


def _build(cls: type[Event], wire: _Envelope, payload: dict[str, Any]) -> Event:
    return cls(
        id=wire.id,
        time=wire.time,
        source=wire.source,
        tenant=wire.tenant,
        task_id=wire.taskid,
        run_id=wire.runid,
        step_id=wire.stepid,
        session_id=wire.sessionid,
        causation_id=wire.causationid,
        correlation_id=wire.correlationid,
        trace=wire.traceparent,
        **payload,
    )
