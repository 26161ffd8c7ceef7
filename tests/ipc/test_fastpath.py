"""The generated structurers agree with the strict converter, on valid and broken bodies."""

import types
import typing
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipc
from ipc._fastpath import Refused, make_structurers
from ipc._messages import converter

FAST = make_structurers(ipc.MESSAGE_TYPES)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)


def valid_value(tp: Any) -> st.SearchStrategy[Any]:
    """A JSON value the strict converter accepts for *tp* (what a well-behaved peer sends)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is str:
        return st.text(max_size=12)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers()
    if tp is float:  # an int is a float on the wire
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers()
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([valid_value(arg) for arg in args])
    if tp is type(None):
        return st.none()
    if origin is list:
        return st.lists(valid_value(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), json_values, max_size=3)
    if attrs.has(tp):
        return valid_body(tp)
    raise AssertionError(f"no strategy for {tp!r}")


def valid_body(cls: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    fields = attrs.fields(cls)
    return st.fixed_dictionaries(
        {f.name: valid_value(f.type) for f in fields if f.default is attrs.NOTHING},
        optional={f.name: valid_value(f.type) for f in fields if f.default is not attrs.NOTHING},
    )


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
    body = data.draw(valid_body(cls))
    accepted, value = strict(body, cls)
    assert accepted
    assert fast(body, wire_type) == (True, value)


@given(data=st.data(), wire_type=types_)
def test_fast_and_strict_agree_on_broken_bodies(data, wire_type):
    cls = ipc.MESSAGE_TYPES[wire_type]
    body = data.draw(broken(data.draw(valid_body(cls)), cls))
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
