import json
import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipc
from ipc import Envelope, Reply, SchemaError, decode_envelope, encode_envelope
from ipc._messages import FrameWriter, decode_frame
from tests.ipc._strategies import instances

messages = st.sampled_from(sorted(ipc.MESSAGE_TYPES.values(), key=lambda c: c.__name__)).flatmap(
    instances
)
TYPE_NAMES = {cls: name for name, cls in ipc.MESSAGE_TYPES.items()}


def envelope_for(message: ipc.Message, **fields: Any) -> Envelope:
    values: dict[str, Any] = {
        "v": 1,
        "token": "t" * 64,
        "owner": "a1",
        "corr": "3",
        "kind": "request",
        "type": TYPE_NAMES[type(message)],
        "body": message,
    }
    values.update(fields)
    return Envelope(**values)


def raw(type_: str, body: Any, **fields: Any) -> bytes:
    obj = {
        "v": 1,
        "token": "t",
        "owner": "a1",
        "corr": "1",
        "kind": "request",
        "type": type_,
        "body": body,
    }
    obj.update(fields)
    return json.dumps(obj).encode()


def schema_error(data: bytes) -> SchemaError:
    with pytest.raises(SchemaError) as caught:
        decode_envelope(data)
    return caught.value


@given(
    message=messages,
    kind=st.sampled_from(["request", "response", "event"]),
    corr=st.text(max_size=10),
)
def test_every_message_round_trips(message, kind, corr):
    envelope = envelope_for(message, kind=kind, corr=corr)
    assert decode_envelope(encode_envelope(envelope)) == envelope


@pytest.mark.parametrize("cls", list(ipc.MESSAGE_TYPES.values()), ids=list(ipc.MESSAGE_TYPES))
@given(data=st.data())
def test_each_type_round_trips_through_a_frame(cls, data):
    message = data.draw(instances(cls))
    frame = ipc.encode_frame(encode_envelope(envelope_for(message)))
    (body,) = ipc.FrameDecoder().feed(frame)
    assert decode_envelope(body).body == message


def test_tag_map_covers_the_message_union_exactly_once():
    assert set(ipc.MESSAGE_TYPES.values()) == set(typing.get_args(ipc.Message))
    assert len(set(ipc.MESSAGE_TYPES.values())) == len(ipc.MESSAGE_TYPES)


def test_only_question_and_spawn_may_wait_without_deadline():
    assert frozenset({"question", "spawn"}) == ipc.NO_DEADLINE_TYPES


def test_encoding_is_compact_utf8():
    data = encode_envelope(envelope_for(ipc.Steer(text="héllo")))
    assert b" " not in data
    assert "héllo".encode() in data


@pytest.mark.parametrize(
    ("type_", "body", "path"),
    [
        ("prompt", {"text": 1, "turn": 1}, "$.body.text"),
        ("prompt", {"text": "x"}, "$.body.turn"),
        (
            "event",
            {"activity": "x", "progress": {"done": 1, "total": "2"}},
            "$.body.progress.total",
        ),
        ("ownership", {"paths": ["a", 2]}, "$.body.paths[1]"),
        ("discuss", {"op": "shout"}, "$.body.op"),
        ("hello", {"pid": 1, "role": "admin"}, "$.body.role"),
    ],
)
def test_schema_errors_name_the_field_path(type_, body, path):
    error = schema_error(raw(type_, body))
    assert error.path == path
    assert error.reason == "schema"
    assert str(error).endswith(f"@ {path}")


@pytest.mark.parametrize(
    ("field", "value"),
    [("v", "1"), ("token", 1), ("owner", None), ("corr", 7), ("kind", "notice")],
)
def test_envelope_field_errors_name_the_field(field, value):
    error = schema_error(raw("steer", {"text": "x"}, **{field: value}))
    assert error.path == f"$.{field}"


@pytest.mark.parametrize(
    ("type_", "body", "path"),
    [
        ("steer", {"text": 1}, "$.body.text"),  # 1 is not a str
        ("prompt", {"text": "x", "turn": True}, "$.body.turn"),  # true is not an int
        ("prompt", {"text": "x", "turn": 1.0}, "$.body.turn"),  # 1.0 is not an int
        ("prompt", {"text": "x", "turn": "1"}, "$.body.turn"),  # "1" is not an int
        ("settled", {"turn": 1, "text": "x", "ok": 1}, "$.body.ok"),  # 1 is not a bool
        ("event", {"activity": "x", "usage": {"cost_usd": True}}, "$.body.usage.cost_usd"),
        ("ownership", {"paths": "abc"}, "$.body.paths"),  # a string is not a list
        ("ownership", {"paths": {"a": 1}}, "$.body.paths"),  # nor is an object
        ("reply", {"ok": True, "data": [["k", 1]]}, "$.body.data"),  # pairs are not an object
    ],
)
def test_types_are_strict(type_, body, path):
    assert schema_error(raw(type_, body)).path == path


def test_an_int_is_accepted_where_a_float_is_expected():
    envelope = decode_envelope(raw("event", {"activity": "usage", "usage": {"cost_usd": 2}}))
    assert envelope.body == ipc.Event(activity="usage", usage=ipc.Usage(cost_usd=2.0))


def test_extra_keys_are_refused_in_the_envelope_and_the_body():
    assert "extra" in str(schema_error(raw("steer", {"text": "x"}, extra=1)))
    error = schema_error(raw("steer", {"text": "x", "sneaky": 1}))
    assert error.path == "$.body"
    assert "sneaky" in str(error)


def test_unknown_type_has_its_own_reason():
    error = schema_error(raw("format_disk", {}))
    assert (error.reason, error.path) == ("type", "$.type")


def test_other_protocol_versions_are_refused():
    assert schema_error(raw("steer", {"text": "x"}, v=2)).path == "$.v"


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"\xff\xfe{}",
        '{"a": 1}'.encode("utf-16"),  # JSON, but not UTF-8
        '{"a": "\ud800"}'.encode("utf-8", "surrogatepass"),  # an encoded surrogate
        b'{"a": "\\ud800"}',  # an escaped lone surrogate
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": ' + b"9" * 5000 + b"}",  # past the interpreter's int digit limit
        b"[" * 100_000 + b"]" * 100_000,  # past the recursion limit
    ],
    ids=[
        "syntax",
        "bom",
        "utf16",
        "surrogate",
        "escaped-surrogate",
        "nan",
        "inf",
        "bigint",
        "deep",
    ],
)
def test_undecodable_bodies_are_json_errors(data):
    assert schema_error(data).reason == "json"


def test_a_paired_surrogate_escape_is_fine():
    envelope = decode_envelope(raw("steer", {"text": "\U0001f600"}))  # json escapes it
    assert envelope.body == ipc.Steer(text="\U0001f600")


def test_a_non_object_frame_is_a_schema_error():
    error = schema_error(b"[1, 2]")
    assert (error.reason, error.path) == ("schema", "$")


@pytest.mark.parametrize(
    "message",
    [ipc.Steer(text="\ud800"), ipc.Event(activity="usage", usage=ipc.Usage(cost_usd=float("nan")))],
    ids=["surrogate", "nan"],
)
def test_encoding_refuses_what_no_peer_may_accept(message):
    with pytest.raises(SchemaError) as caught:
        encode_envelope(envelope_for(message))
    assert caught.value.reason == "encode"


@given(
    message=messages,
    kind=st.sampled_from(["request", "response", "event"]),
    corr=st.text(max_size=10),
    owner=st.text(max_size=10),
)
def test_a_frame_writer_writes_exactly_the_envelope_encoding(message, kind, corr, owner):
    writer = FrameWriter(token="t" * 64, owner=owner)
    envelope = envelope_for(message, kind=kind, corr=corr, owner=owner)
    assert writer.frame(kind, corr, message) == ipc.encode_frame(encode_envelope(envelope))


def test_a_frame_writer_refuses_an_oversize_frame():
    writer = FrameWriter(token="t" * 64, owner="a1", max_frame=100)
    with pytest.raises(ipc.FrameError, match="exceeds the 100-byte limit"):
        writer.frame("event", "", ipc.Steer(text="x" * 100))


def test_decode_frame_returns_the_parts_decode_envelope_builds_on():
    envelope = envelope_for(ipc.Ownership(paths=["a"]), kind="request", corr="9")
    parts = decode_frame(encode_envelope(envelope))
    assert parts == ("t" * 64, "a1", "9", "request", "ownership", ipc.Ownership(paths=["a"]))


def test_whitespace_around_the_object_is_still_json():
    envelope = envelope_for(ipc.Steer(text="x"))
    assert decode_envelope(b" \n" + encode_envelope(envelope) + b"\t ") == envelope


def test_trailing_data_after_the_object_is_a_json_error():
    data = encode_envelope(envelope_for(ipc.Steer(text="x")))
    assert schema_error(data + b"{}").reason == "json"


@pytest.mark.parametrize(
    "data",
    [{"when": object()}, {"z": 1j}],
    ids=["object", "complex"],
)
def test_encoding_refuses_data_that_is_not_json(data):
    with pytest.raises(SchemaError) as caught:
        encode_envelope(envelope_for(Reply(ok=True, data=data)))
    assert caught.value.reason == "encode"


def test_encoding_refuses_a_cycle():
    data: dict[str, Any] = {}
    data["self"] = data
    with pytest.raises(SchemaError) as caught:
        encode_envelope(envelope_for(Reply(ok=True, data=data)))
    assert caught.value.reason == "encode"


def test_envelope_keys_in_another_order_still_decode():
    obj = json.loads(encode_envelope(envelope_for(ipc.Steer(text="x"))))
    reordered = json.dumps(dict(reversed(list(obj.items())))).encode()
    assert decode_envelope(reordered) == envelope_for(ipc.Steer(text="x"))


@pytest.mark.parametrize(
    "data",
    [
        # in the body: the fast path's shape, one key twice (last-wins would read "b")
        raw("steer", {"text": "a"})[:-2] + b', "text": "b"}}',
        # in the envelope: a second token
        raw("steer", {"text": "a"})[:-1] + b', "token": "other"}',
        # nested, with whitespace around the object (the full decoder's path)
        b" " + raw("ask", {"text": "q"}).replace(b'"text": "q"', b'"text": "q", "text": "r"'),
    ],
    ids=["body", "envelope", "padded"],
)
def test_a_repeated_key_is_refused_not_last_wins(data):
    error = schema_error(data)
    assert error.reason == "json"
    assert "duplicate key" in str(error)
