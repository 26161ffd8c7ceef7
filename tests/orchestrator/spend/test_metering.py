"""The gateway's meter against the scripted model server's own wire output: every API, streamed
and whole, fed in arbitrary pieces, bills what the script says."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.spend._metering import Meter, Metered
from tests.fakes._script import Turn
from tests.fakes._wire import Api, Reply, render_json, render_stream

TURN = Turn.from_mapping(
    {"text": "hello", "usage": {"input_tokens": 11, "output_tokens": 3, "cache_read_tokens": 2}},
    where="test",
)
#: The fake's input_tokens include the cached ones for OpenAI's APIs, not for Anthropic's.
EXPECTED = {
    "chat": Metered(input_tokens=9, output_tokens=3, cache_read_tokens=2, model="m"),
    "responses": Metered(input_tokens=9, output_tokens=3, cache_read_tokens=2, model="m"),
    "messages": Metered(input_tokens=11, output_tokens=3, cache_read_tokens=2, model="m"),
}


def _body(api: Api, *, stream: bool) -> bytes:
    reply = Reply(turn=TURN, model="m", reply_id="a-0")
    if stream:
        return b"".join(render_stream(api, reply).frames)
    return json.dumps(render_json(api, reply)).encode()


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
@pytest.mark.parametrize("stream", [False, True])
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_every_shape_in_any_pieces_bills_what_the_server_said(api, stream, cuts) -> None:
    meter = Meter(streaming=stream)
    for piece in _cut(_body(api, stream=stream), cuts):
        meter.feed(piece)
    assert meter.usage() == EXPECTED[api]


def test_a_hostile_upstream_cannot_bill_negative_and_garbage_bills_nothing() -> None:
    meter = Meter()
    meter.feed(b'{"usage": {"prompt_tokens": -5, "completion_tokens": 7}}')
    assert meter.usage() == Metered(output_tokens=7)
    garbage = Meter(streaming=True)
    garbage.feed(b"data: {not json\n\ndata: [DONE]\n\n")
    assert garbage.usage().empty
