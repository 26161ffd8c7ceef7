"""Hypothesis strategies for the wire's values and message types, shared by the codec tests."""

import types
import typing
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import strategies as st

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)


def field_value(
    tp: Any,
    *,
    nested: Callable[[type[Any]], st.SearchStrategy[Any]],
    float_ints: bool = False,
) -> st.SearchStrategy[Any]:
    """A value the strict converter accepts for a field of type *tp*; an attrs class in it is
    drawn from *nested* (an instance, or its wire dict). *float_ints*: on the wire an int is
    a float too."""

    def value(inner: Any) -> st.SearchStrategy[Any]:
        return field_value(inner, nested=nested, float_ints=float_ints)

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is str:
        return st.text(max_size=12)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers()
    if tp is float:
        floats = st.floats(allow_nan=False, allow_infinity=False)
        return floats | st.integers() if float_ints else floats
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([value(arg) for arg in args])
    if tp is type(None):
        return st.none()
    if origin is list:
        return st.lists(value(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), json_values, max_size=3)
    if attrs.has(tp):
        return nested(tp)
    raise AssertionError(f"no strategy for {tp!r}")


def instances(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Instances of *cls* with every field drawn, not only those st.builds would infer."""
    return st.builds(
        cls, **{f.name: field_value(f.type, nested=instances) for f in attrs.fields(cls)}
    )


def wire_bodies(cls: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """What a well-behaved peer sends for *cls*: required keys always, defaulted ones maybe."""

    def value(tp: Any) -> st.SearchStrategy[Any]:
        return field_value(tp, nested=wire_bodies, float_ints=True)

    fields = attrs.fields(cls)
    return st.fixed_dictionaries(
        {f.name: value(f.type) for f in fields if f.default is attrs.NOTHING},
        optional={f.name: value(f.type) for f in fields if f.default is not attrs.NOTHING},
    )
