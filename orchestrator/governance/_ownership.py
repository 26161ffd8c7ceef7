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
from typing import TYPE_CHECKING

import attrs

from orchestrator.governance._globmatch import (
    MAX_CODE_POINT,
    Ranges,
    SpecError,
    owns,
    parse_class,
    witness_path,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

# SpecError is raised by normalize here and by the automaton in _globmatch; callers catch it
# from here.
__all__ = ["LockConflict", "LockTable", "SpecError", "may_overlap", "normalize"]

_MAGIC = frozenset("*?[")


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
    return witness_path(a, b) is not None


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
            if owns(claim.spec, _fold(concrete) if claim.folded else concrete):
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
            parsed = parse_class(component, i) if component[i] == "[" else None
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
    return tuple(cp for cp in range(MAX_CODE_POINT + 1) if _fold(chr(cp)) != chr(cp))


def _has_cased(ranges: Ranges) -> bool:
    cased = _cased_code_points()
    for low, high in ranges:
        i = bisect.bisect_left(cased, low)
        if i < len(cased) and cased[i] <= high:
            return True
    return False
