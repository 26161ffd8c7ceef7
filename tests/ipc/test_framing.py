import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipc import MAX_FRAME, FrameDecoder, FrameError, encode_frame

bodies = st.lists(st.binary(min_size=1, max_size=300), max_size=20)


def test_encode_frame_prefixes_the_big_endian_length():
    assert encode_frame(b'{"a":1}') == b'\x00\x00\x00\x07{"a":1}'


def test_encode_frame_refuses_an_empty_body():
    with pytest.raises(FrameError, match="empty body"):
        encode_frame(b"")


def test_encode_frame_accepts_exactly_the_limit_and_refuses_one_more():
    assert len(encode_frame(b"x" * 10, max_frame=10)) == 14
    with pytest.raises(FrameError, match="11 bytes exceeds the 10-byte limit"):
        encode_frame(b"x" * 11, max_frame=10)


def test_default_limit_is_one_mebibyte():
    assert MAX_FRAME == 1 << 20


def test_decoder_reassembles_byte_at_a_time():
    decoder = FrameDecoder()
    stream = encode_frame(b"first") + encode_frame(b"second")
    out = []
    for index in range(len(stream)):
        out += decoder.feed(stream[index : index + 1])
    assert out == [b"first", b"second"]
    assert decoder.buffered == 0


def test_decoder_holds_a_partial_frame_until_it_completes():
    decoder = FrameDecoder()
    frame = encode_frame(b"hello")
    assert decoder.feed(frame[:6]) == []
    assert decoder.buffered == 2
    assert decoder.feed(frame[6:]) == [b"hello"]


@given(bodies=bodies, data=st.data())
def test_any_chunking_yields_the_same_frames(bodies, data):
    stream = b"".join(encode_frame(body) for body in bodies)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(stream)), max_size=40)))
    decoder = FrameDecoder()
    out = []
    start = 0
    for cut in [*cuts, len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    assert out == bodies
    assert decoder.buffered == 0


def test_zero_length_breaks_the_stream_for_good():
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="zero-length frame"):
        decoder.feed(b"\x00\x00\x00\x00")
    # No resync: even a valid frame afterwards is refused.
    with pytest.raises(FrameError, match="already broke framing"):
        decoder.feed(encode_frame(b"ok"))


def test_oversize_is_refused_from_the_header_alone():
    decoder = FrameDecoder(max_frame=1024)
    # Only the 4-byte header: the decoder must not wait to buffer a 1025-byte body.
    with pytest.raises(FrameError, match="1025-byte frame"):
        decoder.feed(struct.pack(">I", 1025))


def test_oversize_against_the_default_limit():
    with pytest.raises(FrameError, match=f"limit {MAX_FRAME}"):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME + 1))


def test_a_bad_header_raises_even_after_a_good_frame_in_the_same_chunk():
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(encode_frame(b"good") + b"\x00\x00\x00\x00")
