"""The secret set at map scale: thousands of child tokens, added cheaply, every one still hidden."""

import hashlib
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.governance._redaction import REDACTED, Redactor, SecretSet

SESSION_KEY = bytes(range(200, 232))


def _token(n: int) -> str:
    return hashlib.sha256(f"child-{n}".encode()).hexdigest()  # 64 hex, a child token's shape


def test_thousands_of_child_tokens_are_added_fast_and_the_first_is_still_hidden() -> None:
    # A long map: one token per launch. The old set recompiled one alternation of every form
    # on each add (quadratic: minutes at this size, and ~80 KB a row of compiled patterns).
    secrets = SecretSet([SESSION_KEY])
    started = time.monotonic()
    for n in range(4000):
        secrets.add(_token(n))
    assert time.monotonic() - started < 10
    # An ended child's token may still be in a kept transcript or a late log line: hidden.
    line = f"child 0 said {_token(0)} and child 3999 said {_token(3999)}."
    assert secrets.scrub(line) == "child 0 said [redacted] and child 3999 said [redacted]."
    assert secrets.scrub(_token(4000)) == _token(4000)  # never issued: kept


def test_a_token_inside_a_longer_hex_run_at_any_offset_is_hidden() -> None:
    secrets = SecretSet([SESSION_KEY, _token(1), _token(2)])
    for pad in range(5):
        data = ("a" * pad + _token(1) + "0" * pad).encode()
        assert secrets.scrub_bytes(data) == b"a" * pad + REDACTED + b"0" * pad
    # Two tokens back to back, and the session key's hex in both cases.
    both = (_token(1) + _token(2) + SESSION_KEY.hex().upper()).encode()
    assert secrets.scrub_bytes(both) == REDACTED * 3
    assert secrets.scrub_bytes(b"x" + SESSION_KEY + b"y") == b"x" + REDACTED + b"y"


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 2999), cuts=st.lists(st.integers(1, 40), max_size=8))
def test_a_stream_of_many_tokens_hides_any_one_split_anywhere(n: int, cuts: list[int]) -> None:
    secrets = _MANY
    data = b"out:" + _token(n).encode() + b":end"
    redactor = Redactor(secrets)
    out = b""
    rest = data
    for cut in cuts:
        out += redactor.feed(rest[:cut])
        rest = rest[cut:]
    out += redactor.feed(rest) + redactor.flush()
    assert out == b"out:" + REDACTED + b":end"


def test_a_stream_cut_mid_token_hides_the_fragment_among_many_tokens() -> None:
    redactor = Redactor(_MANY)
    shown = redactor.feed(b"ok " + _token(1234)[:20].encode())
    tail = shown + redactor.flush()
    assert _token(1234)[:20].encode() not in tail
    assert tail.endswith(REDACTED)


_MANY = SecretSet([SESSION_KEY, *(_token(n) for n in range(3000))])
