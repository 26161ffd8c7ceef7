"""A whole frame decodes on the fast paths exactly as the strict converter alone decodes it.

:func:`ipc._messages.decode_frame` takes shortcuts at every level (orjson for the JSON, a
key lookup for the envelope, a generated structurer for the body). Here a reference decoder
uses none of them: the strict JSON decoder, then the cattrs converter for the envelope and
the body. On generated frames, well-formed or broken, both must give the same parts (repr
tells ``1`` from ``1.0`` and ``True``) or both must refuse.
"""

import json
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

import ipc
from ipc import SchemaError
from ipc._messages import FrameWriter, _RawEnvelope, _strict_loads, converter, decode_frame
from ipc._types import PROTOCOL_VERSION
from tests.ipc._strategies import instances, json_values, wire_bodies

CLASSES = sorted(ipc.MESSAGE_TYPES.values(), key=lambda cls: cls.__name__)
TYPE_NAMES = {cls: name for name, cls in ipc.MESSAGE_TYPES.items()}
WIRE_TYPES = sorted(TYPE_NAMES.values())
KINDS = ["request", "response", "event"]
KEYS = ["v", "token", "owner", "corr", "kind", "type", "body"]


def strict_decode(data: bytes) -> tuple[Any, ...]:
    """The reference: no orjson, no envelope shortcut, no generated structurer."""
    obj = _strict_loads(data)
    if type(obj) is not dict:
        raise SchemaError("not an object", reason="schema")
    try:
        raw = converter.structure(obj, _RawEnvelope)
    except Exception as exc:
        raise SchemaError(str(exc)) from None
    if raw.v != PROTOCOL_VERSION:
        raise SchemaError("version", path="$.v")
    cls = ipc.MESSAGE_TYPES.get(raw.type)
    if cls is None:
        raise SchemaError("type", reason="type")
    try:
        body = converter.structure(raw.body, cls)
    except Exception as exc:
        raise SchemaError(str(exc)) from None
    return raw.token, raw.owner, raw.corr, raw.kind, raw.type, body


def outcome(decode: Any, data: bytes) -> tuple[str, str]:
    try:
        return "value", repr(decode(data))
    except SchemaError as exc:
        return "refused", exc.reason


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """An envelope as a peer may spell it: valid, or with one thing wrong (a key missing,
    extra or out of order; an envelope or body field retyped; another version or type)."""
    cls = draw(st.sampled_from(CLASSES))
    body = draw(wire_bodies(cls))
    obj: dict[str, Any] = {
        "v": 1,
        "token": "t" * 64,
        "owner": "a1",
        "corr": draw(st.text(max_size=6)),
        "kind": draw(st.sampled_from(KINDS)),
        "type": TYPE_NAMES[cls],
        "body": body,
    }
    fault = draw(
        st.sampled_from(["none", "drop", "add", "shuffle", "retype", "version", "type", "body"])
    )
    if fault == "drop":
        del obj[draw(st.sampled_from(KEYS))]
    elif fault == "add":
        obj[draw(st.text(max_size=6))] = draw(json_values)
    elif fault == "shuffle":
        obj = {key: obj[key] for key in draw(st.permutations(KEYS))}
    elif fault == "retype":
        obj[draw(st.sampled_from(KEYS))] = draw(json_values)
    elif fault == "version":
        obj["v"] = draw(st.sampled_from([2, 0, 1.0, True, "1", None]))
    elif fault == "type":
        obj["type"] = draw(st.sampled_from(WIRE_TYPES) | st.text(max_size=6))
    elif fault == "body":
        names = [f.name for f in attrs.fields(cls)]
        # A bool where an int goes, a float or null where a string goes, and so on.
        values = st.booleans() | st.none() | json_values
        options = [st.tuples(st.text(max_size=6), values)]
        if names:
            options.append(st.tuples(st.sampled_from(names), values))
        key, value = draw(st.one_of(options))
        obj["body"] = {**body, key: value}
    return obj


def spell(obj: Any, compact: bool) -> bytes:
    if compact:  # what orjson (and a FrameWriter) writes
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return json.dumps(obj).encode()  # spaces and \u escapes: the strict decoder's to read


@settings(max_examples=400)
@given(envelopes(), st.booleans())
def test_any_envelope_decodes_as_the_strict_converter_decodes_it(obj, compact):
    data = spell(obj, compact)
    assert outcome(decode_frame, data) == outcome(strict_decode, data)


@given(st.sampled_from(CLASSES).flatmap(instances), st.sampled_from(KINDS), st.text(max_size=8))
def test_every_written_frame_decodes_as_the_strict_converter_decodes_it(message, kind, corr):
    data = FrameWriter(token="t" * 64, owner="a1").frame(kind, corr, message)[4:]
    fast = outcome(decode_frame, data)
    assert fast == outcome(strict_decode, data)
    assert fast[0] == "value"


@given(st.sampled_from(CLASSES).flatmap(instances), st.data())
def test_a_mutated_written_frame_is_read_or_refused_as_the_strict_converter_does(message, data):
    frame = bytearray(FrameWriter(token="t" * 64, owner="a1").frame("event", "", message)[4:])
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(frame) - 1))
        frame[index] = data.draw(st.integers(0, 255))
    assert outcome(decode_frame, bytes(frame)) == outcome(strict_decode, bytes(frame))
