import hashlib
import hmac
import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipc import (
    derive_token,
    new_launch,
    new_session_key,
    peer_uid,
    tokens_match,
    valid_identifier,
)

IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"


def test_session_keys_are_32_random_bytes():
    keys = {new_session_key() for _ in range(8)}
    assert len(keys) == 8
    assert {len(key) for key in keys} == {32}


def test_token_is_hmac_sha256_of_the_owner_in_hex():
    key = bytes(range(32))
    expected = hmac.new(key, b"a1", hashlib.sha256).hexdigest()
    assert derive_token(key, "a1") == expected
    assert len(expected) == 64


def test_tokens_differ_by_owner_and_by_session():
    key = new_session_key()
    assert derive_token(key, "a1") != derive_token(key, "a2")
    assert derive_token(key, "a1") != derive_token(new_session_key(), "a1")
    assert derive_token(key, "a1") == derive_token(key, "a1")


def test_each_launch_of_an_owner_has_its_own_token():
    key = new_session_key()
    first, second = new_launch(), new_launch()
    assert first != second
    assert len(first) == 32
    assert derive_token(key, "a1", first) != derive_token(key, "a1", second)
    assert derive_token(key, "a1", first) == derive_token(key, "a1", first)
    assert derive_token(key, "a1", first) != derive_token(key, "a1")
    expected = hmac.new(key, f"a1\0{first}".encode(), hashlib.sha256).hexdigest()
    assert derive_token(key, "a1", first) == expected


def test_tokens_match_only_when_equal():
    token = derive_token(new_session_key(), "a1")
    assert tokens_match(token, token)
    assert not tokens_match(token[:-1] + ("0" if token[-1] != "0" else "1"), token)
    assert not tokens_match(token[:10], token)
    assert not tokens_match("", token)


@given(presented=st.text())
def test_any_presented_string_compares_without_raising(presented):
    # Includes lone surrogates and non-ASCII, which hmac.compare_digest refuses as str.
    token = "f" * 64
    assert tokens_match(presented, token) is (presented == token)


def test_a_lone_surrogate_token_is_just_wrong():
    assert not tokens_match("\ud800", "f" * 64)


@given(st.from_regex(IDENTIFIER, fullmatch=True))
def test_identifiers_matching_the_rule_are_valid(value):
    assert valid_identifier(value)


@pytest.mark.parametrize(
    "value",
    ["", "-a", "_a", "a" * 129, "a b", "a/b", "a.b", "é", "a\n", "..", "a:b"],
)
def test_identifiers_outside_the_rule_are_invalid(value):
    assert not valid_identifier(value)


def test_identifier_length_limit_is_128():
    assert valid_identifier("a" * 128)
    assert not valid_identifier("a" * 129)


def test_peer_uid_reports_our_uid_for_our_own_socket():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_uid(left) == os.geteuid()
        assert peer_uid(right) == os.geteuid()
