"""The frame JSON reader: orjson where its reading is the strict decoder's, else the strict one.

:func:`ipc._messages.loads` must give exactly what :func:`ipc._messages._strict_loads` gives
(same values, same types, same key order) or refuse exactly what it refuses, for any bytes.
"""

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipc
from ipc import SchemaError
from ipc._messages import FrameWriter, _strict_loads, decode_frame, loads

wide_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**70)
    | st.integers(min_value=-(2**70), max_value=-(2**63) + 2)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


def outcome(read: Any, data: bytes) -> tuple[str, str]:
    try:
        # repr tells 1 from 1.0 from True, -0.0 from 0.0, and shows key order.
        return "value", repr(read(data))
    except SchemaError as exc:
        return "refused", exc.reason


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@given(wide_values)
def test_compact_text_reads_as_the_strict_decoder_reads_it(value):
    data = compact(value)
    assert outcome(loads, data) == outcome(_strict_loads, data) == ("value", repr(value))


@given(wide_values, st.sampled_from([{}, {"ensure_ascii": True}, {"indent": 1}]))
def test_other_spellings_read_as_the_strict_decoder_reads_them(value, options):
    data = json.dumps(value, **options).encode()
    assert outcome(loads, data) == outcome(_strict_loads, data)


@given(wide_values, st.data())
def test_mutated_text_is_read_or_refused_as_the_strict_decoder_does(value, data):
    text = bytearray(compact(value) or b"0")
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(text)))
        text[where:where] = data.draw(
            st.sampled_from([b'"', b",", b":", b"\\u", b"\\ud800", b"\xff", b"\xed\xa0\x80", b"}"])
        )
    assert outcome(loads, bytes(text)) == outcome(_strict_loads, bytes(text))


@given(st.binary(max_size=40))
def test_any_bytes_are_read_or_refused_as_the_strict_decoder_does(data):
    assert outcome(loads, data) == outcome(_strict_loads, data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":1,"a":2}',  # compact: the text orjson would read last-wins
        b'{"a":{"b":"x","b":"x"}}',  # nested, the same value twice
        b'{"a":1,"b":2,"a":1}',
    ],
    ids=["flat", "nested-same-value", "apart"],
)
def test_a_repeated_key_in_compact_text_is_refused(data):
    with pytest.raises(SchemaError, match="duplicate key") as caught:
        loads(data)
    assert caught.value.reason == "json"


def test_a_repeated_token_in_a_written_frame_is_refused():
    frame = FrameWriter(token="t" * 43, owner="a1").frame("event", "", ipc.Steer(text="x"))
    body = frame[4:]
    forged = body.replace(b'"owner"', b'"token":"' + b"u" * 43 + b'","owner"', 1)
    with pytest.raises(SchemaError, match="duplicate key"):
        decode_frame(forged)


def test_an_integer_past_64_bits_stays_an_integer():
    big = 123456789012345678901234567890
    assert loads(b'{"a":%d}' % big) == {"a": big}


@pytest.mark.parametrize(
    "data",
    [b'"\\ud800"', b'"\xed\xa0\x80"', b'"\xff"', b"NaN", b'{"a":1}x', b'{"a":-Infinity}'],
    ids=["escaped-surrogate", "encoded-surrogate", "not-utf8", "nan", "trailing", "infinity"],
)
def test_what_no_peer_may_send_is_refused(data):
    with pytest.raises(SchemaError) as caught:
        loads(data)
    assert caught.value.reason == "json"
