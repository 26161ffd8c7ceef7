"""Bounded JSONL: split on newline bytes only, strip a trailing CR, cap a record's size."""

import json

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from child.backends._jsonl import LineSplitter, Oversize, RecordReader, encode

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    st.lists(st.dictionaries(st.text(), _JSON, max_size=4), max_size=6),
    st.lists(st.integers(min_value=1, max_value=64), min_size=1),
)
def test_records_survive_any_chunking(records, sizes):
    data = b"".join(encode(r) for r in records)
    splitter = LineSplitter()
    out: list[bytes | Oversize] = []
    offset, index = 0, 0
    while offset < len(data):
        size = sizes[index % len(sizes)]
        out += splitter.feed(data[offset : offset + size])
        offset, index = offset + size, index + 1
    out += splitter.close()
    assert [json.loads(line) for line in out if isinstance(line, bytes)] == records


def test_unicode_line_separators_stay_inside_a_record():
    line = '{"text": "a\u2028b\u0085c"}\r\n'.encode()
    assert LineSplitter().feed(line) == ['{"text": "a\u2028b\u0085c"}'.encode()]


def test_an_oversize_record_is_skipped_but_keeps_its_type():
    splitter = LineSplitter(max_bytes=64)
    big = b'{"type":"agent_end","messages":"' + b"x" * 200 + b'"}\n'
    out = splitter.feed(big[:50]) + splitter.feed(big[50:] + b'{"type":"ok"}\n')
    assert len(out) == 2
    assert isinstance(out[0], Oversize)
    assert (out[0].size, out[0].kind) == (len(big) - 1, "agent_end")
    assert out[1] == b'{"type":"ok"}'


def test_a_last_record_without_newline_is_still_a_record():
    splitter = LineSplitter()
    assert splitter.feed(b'{"a": 1}\n{"b"') == [b'{"a": 1}']
    assert splitter.feed(b": 2}") == []
    assert splitter.close() == [b'{"b": 2}']


async def test_the_reader_skips_stray_lines_and_survives_cancellation():
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = RecordReader(receive)
    with trio.move_on_after(0.01):
        await reader.receive()  # cancelled while waiting: nothing may be lost
    await send.send_all(b'{"type": "a"}\nnot json\n[1, 2]\n{"type": "b"')
    assert await reader.receive() == {"type": "a"}
    await send.send_all(b"}\n")
    assert await reader.receive() == {"type": "b"}
    await send.aclose()
    assert await reader.receive() is None
    assert await reader.receive() is None


def test_encode_is_one_ascii_line():
    data = encode({"text": "line\nbreak \u2028 é"})
    assert data.count(b"\n") == 1
    assert data.endswith(b"\n")
    assert data.isascii()
