"""The generated encoders write exactly what cattrs and the JSON encoder write, or decline."""

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipc
from ipc._encoders import make_encoders
from ipc._fastpath import Refused
from ipc._messages import _dumps, converter
from tests.ipc._strategies import instances, json_values

ENCODERS = make_encoders(ipc.MESSAGE_TYPES, dumps=_dumps, hook_for=converter.get_unstructure_hook)
CLASSES = sorted(ipc.MESSAGE_TYPES.values(), key=lambda cls: cls.__name__)

# Values of any type at all, for fields holding the wrong one (attrs does not check types).
anything = (
    json_values
    | st.floats()
    | st.sets(st.integers(), max_size=2)
    | st.tuples(st.integers())
    | st.just(object())
    | st.builds(ipc.Usage, tokens=st.integers())
)


def general(body: Any) -> tuple[bool, str | None]:
    try:
        return True, _dumps(converter.unstructure(body))
    except (ValueError, TypeError, RecursionError):
        return False, None


def fast(body: Any) -> tuple[bool, str | None]:
    try:
        return True, ENCODERS[type(body)](body)
    except Refused:
        return False, None


def test_every_message_type_has_an_encoder():
    assert set(ENCODERS) == set(ipc.MESSAGE_TYPES.values())


@given(data=st.data(), cls=st.sampled_from(CLASSES))
def test_well_typed_bodies_are_written_exactly_as_the_general_path_writes_them(data, cls):
    body = data.draw(instances(cls))
    assert fast(body) == general(body)
    assert fast(body)[0]


@given(data=st.data(), cls=st.sampled_from([c for c in CLASSES if attrs.fields(c)]))
def test_a_field_of_another_type_is_written_identically_or_declined(data, cls):
    field = data.draw(st.sampled_from(attrs.fields(cls)))
    body = attrs.evolve(data.draw(instances(cls)), **{field.name: data.draw(anything)})
    accepted, text = fast(body)
    if accepted:
        assert (accepted, text) == general(body)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_that_is_not_finite_is_left_to_the_general_path(value):
    body = ipc.Event(activity="usage", usage=ipc.Usage(cost_usd=value))
    assert fast(body) == (False, None)
    assert general(body) == (False, None)  # allow_nan=False: it raises, and encode refuses


def test_an_int_in_a_float_field_is_written_as_the_general_path_writes_it():
    body = ipc.Event(activity="usage", usage=ipc.Usage(tokens=1, cost_usd=2))
    assert fast(body) == (False, None)
    text = general(body)[1]
    assert text is not None
    assert text.startswith('{"activity":"usage","text":"","tool":"","progress":null,')
    assert '"usage":{"tokens":1,"cost_usd":2' in text
    assert '"cost_usd":2.0' not in text


def test_a_class_with_a_field_type_it_does_not_know_gets_no_encoder():
    @attrs.frozen(kw_only=True)
    class Odd:
        when: set[str]

    made = make_encoders(
        {"odd": Odd, "steer": ipc.Steer}, dumps=_dumps, hook_for=converter.get_unstructure_hook
    )
    assert made.keys() == {ipc.Steer}
