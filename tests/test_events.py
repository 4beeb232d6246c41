"""The vocabulary and its wire contract: CloudEvents JSON, strict decoding, upcasting, ids."""

from __future__ import annotations

import json
import time
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nanocrab.bus import Subjects
from nanocrab.events import (
    EVENT_TYPES,
    Codec,
    DecodeErrorKind,
    Event,
    EventDecodeError,
    LlmResponded,
    TaskSubmitted,
    TextBlock,
    ToolUseBlock,
    UpcasterRegistry,
    Usage,
    derive_event_id,
    new_event_id,
)

DATA = Path(__file__).parent / "data"


def sample(tp: Any) -> Any:
    """A valid value of type ``tp`` (for building one instance of every event type)."""
    origin = typing.get_origin(tp)
    if tp is str:
        return "s"
    if tp is int:
        return 1
    if tp is float:
        return 1.5
    if tp is bool:
        return True
    if tp is datetime:
        return datetime(2026, 1, 1, tzinfo=UTC)
    if origin is typing.Literal:
        return typing.get_args(tp)[0]
    if origin is list:
        return [sample(typing.get_args(tp)[0])]
    if origin is dict:
        return {"k": "v"}
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return sample(typing.get_args(tp)[0])
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp(
            **{
                f.name: sample(f.type)
                for f in msgspec.structs.fields(tp)
                if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
            }
        )
    raise TypeError(tp)


def build(cls: type[Event]) -> Event:
    hints = typing.get_type_hints(cls)
    required = {
        f.name: sample(hints[f.name])
        for f in msgspec.structs.fields(cls)
        if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
    }
    return cls(run_id="r1", session_id="s1", **required)


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_every_type_round_trips_as_cloudevents(event_type: str) -> None:
    codec = Codec()
    event = build(EVENT_TYPES[event_type])
    raw = codec.encode(event, subject="x")
    wire = json.loads(raw)
    assert wire["specversion"] == "1.0"
    assert wire["type"] == event_type == event.type
    assert wire["datacontenttype"] == "application/json"
    assert wire["schemaversion"] == type(event).schema_version
    assert all(a.isalnum() and a.islower() for a in wire), "CloudEvents attribute names"
    assert "run_id" not in wire["data"] and "id" not in wire["data"]
    assert codec.decode(raw) == event


def test_every_type_has_a_family_dot_name_tag_and_a_six_token_subject() -> None:
    subjects = Subjects("nanocrab", "nanocrab_eph")
    for name, cls in EVENT_TYPES.items():
        family, _, short = name.partition(".")
        assert family and short and "." not in short
        subject = subjects.for_event(build(cls))
        assert len(subject.split(".")) == 6
        assert subjects.matches_type(subject, name)


def test_ids_sort_by_time_and_derived_ids_are_deterministic() -> None:
    a = new_event_id()
    time.sleep(0.002)
    b = new_event_id()
    assert len(a) == len(b) == 26 and a < b
    cause = new_event_id()
    first = derive_event_id("echo", cause, 0)
    assert first == derive_event_id("echo", cause, 0)
    assert first != derive_event_id("echo", cause, 1) != derive_event_id("other", cause, 1)
    assert first[:10] == cause[:10], "a reaction carries its cause's timestamp"


def test_derived_ids_are_what_python_ulid_makes_of_the_same_bytes() -> None:
    """Ids already in logs were derived through python-ulid: a redelivered event must get the
    same reaction ids from this code (else its reactions would be stored twice)."""
    import hashlib
    import random

    from ulid import ULID

    rng = random.Random(7)
    causes = [str(ULID.from_bytes(rng.randbytes(6) + rng.randbytes(10))) for _ in range(500)]
    causes += [c.lower() for c in causes[:20]]  # python-ulid reads lower case too
    causes += ["", "task-1", "81ARZ3NDEKTSV4RRFFQ69G5FAV", "01ARZ3NDEKTSV4RRFFQ69G5FAU",
               "7ZZZZZZZZZZZZZZZZZZZZZZZZZ", "00000000000000000000000000"]  # fmt: skip
    for cause in causes:
        for ordinal in (0, 3):
            digest = hashlib.blake2b(f"echo\x1f{cause}\x1f{ordinal}".encode(),
                                     digest_size=10).digest()  # fmt: skip
            try:
                millis = ULID.from_str(cause).milliseconds
            except ValueError:
                millis = 0  # not a ULID (or one past the 48-bit clock): the epoch
            expected = str(ULID.from_bytes(millis.to_bytes(6, "big") + digest))
            assert derive_event_id("echo", cause, ordinal) == expected, cause
    assert derive_event_id("dlq", "x", 0, millis=2**48 - 1)[:10] == "7ZZZZZZZZZ"


def test_subject_tokens_are_sanitised() -> None:
    subjects = Subjects("nanocrab", "nanocrab_eph")
    event = TaskSubmitted(text="x", run_id="evil.run.*.>", tenant="a b")
    subject = subjects.for_event(event)
    assert subject == "nanocrab.a_b.run.evil_run____.task.submitted"
    assert subjects.run("x.y") == "nanocrab.*.run.x_y.>"
    with pytest.raises(ValueError, match="pattern"):
        subjects.of_type("a.b.c")


def _valid() -> dict[str, Any]:
    return json.loads(Codec().encode(TaskSubmitted(text="hi", run_id="r")))


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (lambda w: b"{not json", DecodeErrorKind.MALFORMED),
        (lambda w: {**w, "type": "task.exploded"}, DecodeErrorKind.UNKNOWN_TYPE),
        (lambda w: {**w, "data": {}}, DecodeErrorKind.INVALID),  # missing required ``text``
        (lambda w: {k: v for k, v in w.items() if k != "id"}, DecodeErrorKind.INVALID),
        (lambda w: {**w, "specversion": "0.3"}, DecodeErrorKind.INVALID),
        (lambda w: {**w, "time": "2026-01-01T00:00:00"}, DecodeErrorKind.INVALID),
        (lambda w: {**w, "data": {"text": 5}}, DecodeErrorKind.INVALID),
        (lambda w: {**w, "schemaversion": 99}, DecodeErrorKind.UNSUPPORTED_VERSION),
        (lambda w: {**w, "data": {"text": "x" * 5000}}, DecodeErrorKind.OVERSIZED),
    ],
)
def test_decode_rejects_bad_input_with_a_typed_reason(mutate: Any, kind: DecodeErrorKind) -> None:
    value = mutate(_valid())
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    with pytest.raises(EventDecodeError) as info:
        Codec(max_bytes=4096).decode(raw)
    assert info.value.kind is kind
    assert info.value.message


def test_encode_refuses_oversized_events() -> None:
    with pytest.raises(EventDecodeError) as info:
        Codec(max_bytes=2048).encode(TaskSubmitted(text="x" * 4096))
    assert info.value.kind is DecodeErrorKind.OVERSIZED
    assert "artifact" in info.value.message


def test_unknown_extension_attributes_are_accepted() -> None:
    wire = {**_valid(), "comexampleextension1": "value"}
    assert Codec().decode(json.dumps(wire).encode()).type == "task.submitted"


def test_a_stored_v1_event_decodes_as_v2() -> None:
    raw = (DATA / "task_submitted_v1.json").read_bytes()
    assert json.loads(raw)["schemaversion"] == 1
    event = Codec().decode(raw)
    assert isinstance(event, TaskSubmitted)
    assert event.text == "summarise yesterday's incidents"
    assert event.agent == "default"
    assert TaskSubmitted.schema_version == 2
    assert json.loads(Codec().encode(event))["schemaversion"] == 2


def test_a_gap_in_the_upcaster_chain_is_a_clear_error() -> None:
    raw = (DATA / "task_submitted_v1.json").read_bytes()
    with pytest.raises(EventDecodeError) as info:
        Codec(upcasters=UpcasterRegistry()).decode(raw)
    assert info.value.kind is DecodeErrorKind.UNSUPPORTED_VERSION
    assert "v1 -> v2" in info.value.message


def test_nested_content_blocks_keep_their_types() -> None:
    event = LlmResponded(
        provider="anthropic",
        model="m",
        stop_reason="tool_use",
        usage=Usage(input_tokens=3),
        content=[TextBlock("thinking"), ToolUseBlock("t1", "read", {"path": "a.txt"})],
    )
    decoded = Codec().decode(Codec().encode(event))
    assert isinstance(decoded, LlmResponded)
    assert isinstance(decoded.content[1], ToolUseBlock) and decoded.content[1].input == {
        "path": "a.txt"
    }
    assert decoded.usage.input_tokens == 3
