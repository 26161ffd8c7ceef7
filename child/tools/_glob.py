"""Glob patterns as models write them, for ``find`` and ``grep``'s file filter.

``fnmatch`` lets ``*`` cross ``/`` and knows neither ``**`` nor ``{a,b}``, and ``Path.glob``
follows symlinked directories on Python 3.11; so the walk is ours and this module only answers
"does this relative path match". Rules: a pattern without ``/`` matches the last path component
at any depth; otherwise it matches the whole relative path. ``*`` and ``?`` stay within one
component, ``**`` spans any number of them (``a/**/b`` matches ``a/b``), ``[...]`` is a
character class (``[!...]`` negates) and ``{x,y}`` alternates (nesting allowed).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A predicate over ``/``-separated relative paths; see the module docstring for the rules."""
    regex = re.compile(_translate(pattern), re.DOTALL)
    if "/" in pattern:
        return lambda relative: regex.fullmatch(relative) is not None
    return lambda relative: regex.fullmatch(relative.rsplit("/", 1)[-1]) is not None


def _translate(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[" and (end := _class_end(pattern, i)) > 0:
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            # Escape what Python's regex classes treat specially (and warn about as future sets).
            body = re.sub(r"([\\\[&~|])", r"\\\1", body.removeprefix("!"))
            body = re.sub(r"(?<=-)-", r"\\-", body)  # "--" would read as a set difference
            cls = f"[{'^' if negate else ''}{body}]"
            try:
                re.compile(cls)
            except re.error:
                # A reversed range such as [?-/] matches no character (as in fnmatch).
                cls = "(?!)" if not negate else "[^/]"
            out.append(cls)
            i = end + 1
        elif char == "{" and (end := _brace_end(pattern, i)) > 0:
            options = _split_top_level(pattern[i + 1 : end])
            out.append("(?:" + "|".join(_translate(option) for option in options) + ")")
            i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class at ``start`` (a leading ``]`` is literal), or -1."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "!":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    return pattern.find("]", i)


def _brace_end(pattern: str, start: int) -> int:
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top_level(body: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in body:
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += (char == "{") - (char == "}")
        current.append(char)
    parts.append("".join(current))
    return parts
