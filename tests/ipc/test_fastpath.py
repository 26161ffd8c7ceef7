"""The generated structurers agree with the strict converter, on valid and broken bodies."""

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipc
from ipc._fastpath import Refused, make_structurers
from ipc._messages import converter
from tests.ipc._strategies import json_values, wire_bodies

FAST = make_structurers(ipc.MESSAGE_TYPES)


def broken(body: dict[str, Any], cls: type[Any]) -> st.SearchStrategy[Any]:
    """*body* with one thing wrong, or perhaps still right: a key gone, added, or retyped."""
    names = [field.name for field in attrs.fields(cls)]
    options = [
        st.tuples(st.text(max_size=6), json_values).map(lambda kv: {**body, kv[0]: kv[1]}),
        json_values,
    ]
    if body:
        options.append(
            st.sampled_from(sorted(body)).map(
                lambda key: {k: v for k, v in body.items() if k != key}
            )
        )
    if names:
        # Retype one field: any JSON, or a nested object shaped almost like Progress / Usage.
        nested = st.fixed_dictionaries(
            {},
            optional={
                "done": json_values,
                "total": json_values,
                "tokens": json_values,
                "next": st.lists(json_values, max_size=2),
            },
        )
        options.append(
            st.tuples(st.sampled_from(names), json_values | nested).map(
                lambda kv: {**body, kv[0]: kv[1]}
            )
        )
    return st.one_of(options)


def strict(body: Any, cls: type[Any]) -> tuple[bool, Any]:
    try:
        return True, converter.structure(body, cls)
    except Exception:
        return False, None


def fast(body: Any, wire_type: str) -> tuple[bool, Any]:
    try:
        return True, FAST[wire_type](body)
    except Refused:
        return False, None


types_ = st.sampled_from(sorted(ipc.MESSAGE_TYPES))


def test_every_message_type_has_a_fast_structurer():
    assert set(FAST) == set(ipc.MESSAGE_TYPES)


@given(data=st.data(), wire_type=types_)
def test_fast_and_strict_agree_on_valid_bodies(data, wire_type):
    cls = ipc.MESSAGE_TYPES[wire_type]
    body = data.draw(wire_bodies(cls))
    accepted, value = strict(body, cls)
    assert accepted
    assert fast(body, wire_type) == (True, value)


@given(data=st.data(), wire_type=types_)
def test_fast_and_strict_agree_on_broken_bodies(data, wire_type):
    cls = ipc.MESSAGE_TYPES[wire_type]
    body = data.draw(broken(data.draw(wire_bodies(cls)), cls))
    assert fast(body, wire_type) == strict(body, cls)


@pytest.mark.parametrize(
    ("wire_type", "body"),
    [
        ("prompt", {"text": "x", "turn": True}),  # bool is not an int
        ("prompt", {"text": "x", "turn": 1.0}),  # nor is a float
        ("ownership", {"paths": "abc"}),  # a string is not a list
        ("ownership", {"paths": ["a", 1]}),
        ("hello", {"pid": 1, "role": "admin"}),
        ("reply", {"ok": True, "data": [["k", 1]]}),
        ("event", {"activity": "x", "usage": {"cost_usd": True}}),
        ("event", {"activity": "x", "progress": {"done": 1}}),  # total missing, nested
        ("steer", {"text": "x", "sneaky": 1}),
        ("abort", []),
    ],
)
def test_the_fast_path_refuses_what_the_strict_converter_refuses(wire_type, body):
    assert strict(body, ipc.MESSAGE_TYPES[wire_type]) == (False, None)
    with pytest.raises(Refused):
        FAST[wire_type](body)


def test_an_int_becomes_a_float_as_the_strict_converter_makes_it():
    usage = FAST["event"]({"activity": "usage", "usage": {"cost_usd": 2}}).usage
    assert usage == ipc.Usage(cost_usd=2.0)
    assert type(usage.cost_usd) is float


def test_a_class_with_a_field_type_it_does_not_know_gets_no_fast_structurer():
    @attrs.frozen(kw_only=True)
    class Odd:
        when: set[str]

    assert make_structurers({"odd": Odd, "steer": ipc.Steer}).keys() == {"steer"}
