"""The automaton behind lock specs: which paths a spec owns, and whether two specs share one.

A spec (grammar in :mod:`._ownership`) compiles to a nondeterministic automaton over
code points whose edges carry sets of code points as sorted, disjoint ranges. :func:`owns` runs
one automaton over a concrete path; :func:`witness_path` searches the product of two automata
breadth first, so it finds a path both own exactly when one exists.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import TypeAlias

import attrs

# A set of code points as sorted, disjoint, inclusive (low, high) ranges.
Ranges: TypeAlias = tuple[tuple[int, int], ...]
MAX_CODE_POINT = 0x10FFFF
_SLASH = ord("/")
_ANY: Ranges = ((0, MAX_CODE_POINT),)
_NOT_SLASH: Ranges = ((0, _SLASH - 1), (_SLASH + 1, MAX_CODE_POINT))
_ONLY_SLASH: Ranges = ((_SLASH, _SLASH),)


class SpecError(ValueError):
    """A lock spec cannot be normalized; ``spec`` and ``reason`` say which and why."""

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"normalize lock spec {spec!r}: {reason}")
        self.spec = spec
        self.reason = reason


def _merge(items: list[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(items):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if low <= high:
            out.append((low, high))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def parse_class(text: str, start: int) -> tuple[Ranges, int] | None:
    """Parse the bracket expression opening at ``text[start]`` the way :mod:`fnmatch` does.

    Returns its code points (never ``/``) and the index after its ``]``, or None when the ``[``
    is unterminated and therefore a literal.
    """
    j = start + 1
    negate = j < len(text) and text[j] == "!"
    j += negate
    body_start = j
    if j < len(text) and text[j] == "]":
        j += 1
    close = text.find("]", j)
    if close < 0:
        return None
    body = text[body_start:close]
    items: list[tuple[int, int]] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            low, high = ord(body[k]), ord(body[k + 2])
            if low <= high:  # a reversed range matches nothing, as in fnmatch
                items.append((low, high))
            k += 3
        else:
            items.append((ord(body[k]), ord(body[k])))
            k += 1
    ranges = _merge(items)
    return _intersect(_complement(ranges) if negate else ranges, _NOT_SLASH), close + 1


@attrs.frozen(kw_only=True)
class _Nfa:
    edges: tuple[tuple[tuple[Ranges, int], ...], ...]
    closure: tuple[frozenset[int], ...]
    accept: frozenset[int]


class _Builder:
    """Accumulates an automaton's states, character edges and empty (epsilon) edges."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[Ranges, int]]] = [[]]
        self.epsilon: list[set[int]] = [set()]

    def state(self) -> int:
        self.edges.append([])
        self.epsilon.append(set())
        return len(self.edges) - 1

    def step(self, source: int, ranges: Ranges) -> int:
        target = self.state()
        self.edges[source].append((ranges, target))
        return target

    def repeat(self, state: int, ranges: Ranges) -> int:
        if (ranges, state) not in self.edges[state]:
            self.edges[state].append((ranges, state))
        return state

    def skip(self, source: int, target: int) -> None:
        self.epsilon[source].add(target)


@functools.lru_cache(maxsize=4096)
def _compile(spec: str) -> _Nfa:
    """The automaton of every path ``spec`` owns: its matches, each optionally plus ``/...``."""
    if not spec.startswith("/"):
        raise SpecError(spec, "not normalized (not absolute); pass it through normalize() first")
    nfa = _Builder()
    current = 0
    components = [part for part in spec.split("/") if part]
    for index, component in enumerate(components):
        if component == "**":
            # Last: "/" and anything below. Elsewhere: zero components, or "/" and anything
            # (slashes included) before the next component's "/".
            below = nfa.repeat(nfa.step(current, _ONLY_SLASH), _ANY)
            if index < len(components) - 1:
                nfa.skip(current, after := nfa.state())
                nfa.skip(below, after)
                below = after
            current = below
            continue
        current = nfa.step(current, _ONLY_SLASH)
        i = 0
        while i < len(component):
            parsed = parse_class(component, i) if component[i] == "[" else None
            if component[i] == "*":
                # Each state in a component is entered by one edge only, so a loop is "X*".
                nfa.repeat(current, _NOT_SLASH)
            elif parsed is not None:
                current = nfa.step(current, parsed[0])
                i = parsed[1] - 1
            else:
                char = ord(component[i])
                current = nfa.step(current, _NOT_SLASH if char == ord("?") else ((char, char),))
            i += 1
    below = nfa.repeat(nfa.step(current, _ONLY_SLASH), _ANY)
    return _Nfa(
        edges=tuple(map(tuple, nfa.edges)),
        closure=tuple(_epsilon_closure(nfa.epsilon, s) for s in range(len(nfa.edges))),
        accept=frozenset({current, below}),
    )


def _epsilon_closure(epsilon: list[set[int]], start: int) -> frozenset[int]:
    seen = {start}
    stack = [start]
    while stack:
        for nxt in epsilon[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return frozenset(seen)


def _pick(ranges: Ranges) -> str:
    """A readable member of ``ranges`` for a witness path."""
    if _intersect(ranges, ((ord("x"), ord("x")),)):
        return "x"
    printable = _intersect(ranges, ((0x21, _SLASH - 1), (_SLASH + 1, MAX_CODE_POINT)))
    return chr((printable or ranges)[0][0])


def witness_path(a: str, b: str) -> str | None:
    """A path owned by both specs, or None when there is none (breadth-first product search)."""
    left, right = _compile(a), _compile(b)
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {(0, 0): None}
    queue = deque([(0, 0)])
    while queue:
        pair = queue.popleft()
        here_a, here_b = left.closure[pair[0]], right.closure[pair[1]]
        if here_a & left.accept and here_b & right.accept:
            chars: list[str] = []
            link = parents[pair]
            while link is not None:
                chars.append(link[1])
                link = parents[link[0]]
            return "".join(reversed(chars))
        for sa in here_a:
            for ranges_a, ta in left.edges[sa]:
                for sb in here_b:
                    for ranges_b, tb in right.edges[sb]:
                        common = _intersect(ranges_a, ranges_b)
                        if common and (ta, tb) not in parents:
                            parents[ta, tb] = (pair, _pick(common))
                            queue.append((ta, tb))
    return None


def owns(spec: str, path: str) -> bool:
    """Whether the normalized ``spec`` owns the concrete absolute ``path``."""
    nfa = _compile(spec)
    states = nfa.closure[0]
    for code in map(ord, path):
        states = frozenset().union(
            *(
                nfa.closure[target]
                for state in states
                for ranges, target in nfa.edges[state]
                if any(low <= code <= high for low, high in ranges)
            )
        )
    return bool(states & nfa.accept)
