"""A node host's answer to a batch of context fetches (``_ray_contexts.answer``), on its own;
the batches through a real cluster are in ``test_ray.py``."""

import pytest

from orchestrator.launch._context import ContextRefused
from orchestrator.launch._ray_contexts import AGAIN, FILES, GONE, REFUSED, answer

SCRATCHES = {
    "a#1": {"transcript.json": b"a" * 40},
    "b#1": {"transcript.json": b"b" * 40},
    "c#1": {"transcript.json": b"c" * 40},
}


def context(ident: str, backend: str, resume: str) -> dict[str, bytes]:
    if ident == "big#1":
        raise ContextRefused("its context is over the cap")
    if ident not in SCRATCHES:
        raise RuntimeError("the child is gone from its node host")
    assert (backend, resume) == ("builtin", "")
    return SCRATCHES[ident]


def asked(*idents: str) -> list[tuple[str, str, str]]:
    return [(ident, "builtin", "") for ident in idents]


def test_each_fetch_is_answered_in_order_with_its_files_its_refusal_or_why_not():
    got = answer(asked("a#1", "big#1", "gone#1", "b#1"), context, ContextRefused)
    assert got == [
        (FILES, SCRATCHES["a#1"]),
        (REFUSED, "its context is over the cap"),
        (GONE, "RuntimeError: the child is gone from its node host"),
        (FILES, SCRATCHES["b#1"]),
    ]


@pytest.mark.parametrize(
    ("cap", "kinds"),
    [
        (100, [FILES, FILES, AGAIN]),  # 80 bytes fit, the third would pass 100
        (80, [FILES, FILES, AGAIN]),  # full at exactly the cap
        (10, [FILES, AGAIN, AGAIN]),  # the first always goes, whatever its size
    ],
)
def test_an_answer_stops_at_its_cap_and_the_rest_is_asked_again(cap, kinds):
    got = answer(asked("a#1", "b#1", "c#1"), context, ContextRefused, cap=cap)
    assert [kind for kind, _ in got] == kinds
    assert all(value == "" for kind, value in got if kind == AGAIN)
