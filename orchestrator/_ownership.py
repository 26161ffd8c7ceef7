"""Path ownership locks for writing children (DESIGN.md §4).

A *spec* is a path or a glob. ``*`` and ``?`` match within one path component, ``[...]`` is a
bracket expression in :mod:`fnmatch` form (``[!...]`` negates, a leading ``]`` is literal), and a
component that is exactly ``**`` matches zero or more whole components (one or more when it is
the last component). A spec owns every path it matches *and everything below it*, so ``src``
owns ``src/a/b.py`` and ``src/*`` owns ``src/a/b.py`` too.

Specs are stored in normalized form (:func:`normalize`) and two owners may never hold specs
that :func:`may_overlap`. The overlap test is exact for this grammar: it intersects the two
specs' automata, so it never misses a conflict and never invents one.
"""

from __future__ import annotations

import bisect
import functools
import os
import re
import sys
import tempfile
from collections import deque
from typing import TYPE_CHECKING, TypeAlias

import attrs

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

# A set of code points as sorted, disjoint, inclusive (low, high) ranges.
_Ranges: TypeAlias = tuple[tuple[int, int], ...]

_MAX_CODE_POINT = 0x10FFFF
_SLASH = ord("/")
_ANY: _Ranges = ((0, _MAX_CODE_POINT),)
_NOT_SLASH: _Ranges = ((0, _SLASH - 1), (_SLASH + 1, _MAX_CODE_POINT))
_ONLY_SLASH: _Ranges = ((_SLASH, _SLASH),)
_MAGIC = frozenset("*?[")


class SpecError(ValueError):
    """A lock spec cannot be normalized; ``spec`` and ``reason`` say which and why."""

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"normalize lock spec {spec!r}: {reason}")
        self.spec = spec
        self.reason = reason


class LockConflict(Exception):
    """A requested spec overlaps a spec another live owner holds; nothing was acquired."""

    def __init__(self, *, owner: str, spec: str, holder: str, holder_spec: str) -> None:
        super().__init__(
            f"lock for {owner}: path {spec} is owned by {holder} ({holder_spec}); "
            f"wait for {holder} to finish or choose paths outside its spec"
        )
        self.owner = owner
        self.spec = spec
        self.holder = holder
        self.holder_spec = holder_spec


def normalize(spec: str, *, root: Path, case_insensitive: bool | None = None) -> str:
    """Return the absolute, symlink-free, case-folded form of ``spec``.

    A relative spec is resolved against ``root``. The part before the first wildcard component
    goes through :func:`os.path.realpath` (symlinks in its existing prefix are resolved, ``..``
    applied), and the wildcard remainder is appended unchanged except for ``.`` and empty
    components; ``..`` after a wildcard is refused because its meaning depends on what the
    wildcard matched. Specs outside ``root`` are allowed. When ``case_insensitive`` is None the
    file system under ``root`` is probed once (see :func:`_probe_case_insensitive`).
    """
    if not spec or "\0" in spec:
        raise SpecError(spec, "a spec must be a non-empty path without NUL; pass a path or glob")
    base = "/" if os.path.isabs(spec) else os.fspath(root)
    parts = spec.split("/")
    first = next((i for i, part in enumerate(parts) if _MAGIC & set(part)), len(parts))
    # The real path is literal even when a directory name holds a wildcard character.
    prefix = re.sub(r"([*?[])", r"[\1]", os.path.realpath(os.path.join(base, *parts[:first])))
    rest = [part for part in parts[first:] if part not in {"", "."}]
    if ".." in rest:
        raise SpecError(spec, "'..' follows a wildcard; write the path without '..'")
    normalized = "/".join([prefix.rstrip("/"), *rest]) if rest else prefix
    if case_insensitive is None:
        case_insensitive = _probe_case_insensitive(os.path.realpath(root))
    return _fold_spec(normalized) if case_insensitive else normalized


def may_overlap(a: str, b: str) -> bool:
    """Whether some path is owned by both normalized specs ``a`` and ``b``."""
    return _witness(a, b) is not None


@attrs.frozen(kw_only=True)
class _Claim:
    spec: str
    root: str
    folded: bool


@attrs.define(eq=False)
class LockTable:
    """Who owns which specs. Owners are opaque strings (the child's key)."""

    _claims: dict[str, list[_Claim]] = attrs.field(factory=dict, init=False)

    def acquire(self, owner: str, specs: Sequence[str], *, root: Path) -> tuple[str, ...]:
        """Take every spec or none; return the normalized form of each requested spec.

        Raises :class:`LockConflict` (and takes nothing) when a spec overlaps another owner's.
        Specs ``owner`` already holds, or that overlap only its own specs, are fine.
        """
        real_root = os.path.realpath(root)
        folded = _probe_case_insensitive(real_root)
        wanted = tuple(
            dict.fromkeys(normalize(s, root=root, case_insensitive=folded) for s in specs)
        )
        mine = {claim.spec for claim in self._claims.get(owner, ())}
        new = [spec for spec in wanted if spec not in mine]
        for spec in new:
            for holder, claims in self._claims.items():
                if holder == owner:
                    continue
                for claim in claims:
                    if may_overlap(spec, claim.spec):
                        raise LockConflict(
                            owner=owner, spec=spec, holder=holder, holder_spec=claim.spec
                        )
        if new:
            self._claims.setdefault(owner, []).extend(
                _Claim(spec=spec, root=real_root, folded=folded) for spec in new
            )
        return wanted

    def release(self, owner: str) -> tuple[str, ...]:
        """Drop every spec ``owner`` holds and return them; () when it held none."""
        return tuple(claim.spec for claim in self._claims.pop(owner, ()))

    def holds(self, owner: str, path: Path) -> bool:
        """Whether ``owner`` covers the concrete ``path`` (a relative one is under the root)."""
        for claim in self._claims.get(owner, ()):
            concrete = os.path.realpath(os.path.join(claim.root, path))
            if _owns(claim.spec, _fold(concrete) if claim.folded else concrete):
                return True
        return False

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        """Every owner's normalized specs, in acquisition order."""
        return {owner: tuple(c.spec for c in claims) for owner, claims in self._claims.items()}


@functools.cache
def _probe_case_insensitive(root: str) -> bool:
    """Whether names under ``root`` are case-insensitive, probed once per root.

    A temporary file is created and looked up under its swapcased name. When ``root`` is not
    writable the platform default is assumed: case-insensitive on macOS, sensitive elsewhere.
    """
    try:
        fd, name = tempfile.mkstemp(prefix=".fleet-case-probe-", dir=root)
    except OSError:
        return sys.platform == "darwin"
    try:
        os.close(fd)
        other = os.path.join(root, os.path.basename(name).swapcase())
        try:
            return os.path.samefile(name, other)
        except FileNotFoundError:
            return False
    finally:
        os.unlink(name)


def _fold(text: str) -> str:
    # Only one-to-one lowercase mappings: a fold that changes length (U+0130) would change what
    # ``?`` matches, so such characters are kept as they are on both sides.
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in text)


def _fold_spec(spec: str) -> str:
    """Case-fold a spec: literals are lowered; a class that holds a cased letter becomes ``?``.

    Widening such a class to any character is conservative: on a case-insensitive file system
    ``[A-Z]`` must also match the lowered names, and only a false conflict can result.
    """
    folded: list[str] = []
    for component in spec.split("/"):  # like _compile: a bracket never spans a "/"
        i = 0
        while i < len(component):
            parsed = _parse_class(component, i) if component[i] == "[" else None
            if parsed is None:
                folded.append(_fold(component[i]))
                i += 1
            else:
                folded.append("?" if _has_cased(parsed[0]) else component[i : parsed[1]])
                i = parsed[1]
        folded.append("/")
    return "".join(folded)[:-1]


@functools.cache
def _cased_code_points() -> tuple[int, ...]:
    return tuple(cp for cp in range(_MAX_CODE_POINT + 1) if _fold(chr(cp)) != chr(cp))


def _has_cased(ranges: _Ranges) -> bool:
    cased = _cased_code_points()
    for low, high in ranges:
        i = bisect.bisect_left(cased, low)
        if i < len(cased) and cased[i] <= high:
            return True
    return False


def _merge(items: list[tuple[int, int]]) -> _Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(items):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def _intersect(a: _Ranges, b: _Ranges) -> _Ranges:
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


def _complement(ranges: _Ranges) -> _Ranges:
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CODE_POINT:
        out.append((start, _MAX_CODE_POINT))
    return tuple(out)


def _parse_class(text: str, start: int) -> tuple[_Ranges, int] | None:
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
    edges: tuple[tuple[tuple[_Ranges, int], ...], ...]
    closure: tuple[frozenset[int], ...]
    accept: frozenset[int]


class _Builder:
    """Accumulates an automaton's states, character edges and empty (epsilon) edges."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[_Ranges, int]]] = [[]]
        self.epsilon: list[set[int]] = [set()]

    def state(self) -> int:
        self.edges.append([])
        self.epsilon.append(set())
        return len(self.edges) - 1

    def step(self, source: int, ranges: _Ranges) -> int:
        target = self.state()
        self.edges[source].append((ranges, target))
        return target

    def repeat(self, state: int, ranges: _Ranges) -> int:
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
            parsed = _parse_class(component, i) if component[i] == "[" else None
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


def _pick(ranges: _Ranges) -> str:
    """A readable member of ``ranges`` for a witness path."""
    if _intersect(ranges, ((ord("x"), ord("x")),)):
        return "x"
    printable = _intersect(ranges, ((0x21, _SLASH - 1), (_SLASH + 1, _MAX_CODE_POINT)))
    return chr((printable or ranges)[0][0])


def _witness(a: str, b: str) -> str | None:
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


def _owns(spec: str, path: str) -> bool:
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
