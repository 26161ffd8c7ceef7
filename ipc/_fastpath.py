"""Generated structurers: the decode hot path for message bodies that are plainly valid.

The strict converter in :mod:`ipc._messages` judges every body, and only it writes error
messages; going through cattrs costs about half a decode, though. So each message class also
gets one function, generated once from its attrs fields (as attrs and cattrs generate theirs),
that checks the exact key set and each value's exact type inline and builds the instance. It
accepts a subset of what the strict converter accepts, with the same value
(``tests/ipc/test_fastpath.py`` checks both on generated bodies): anything else raises
:class:`Refused`, and the caller hands the body to the strict converter, which accepts it
after all or says which field is wrong.

A class with a field type the generator does not know gets no fast structurer; its bodies take
the strict path only.
"""

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs


class Refused(Exception):
    """The body is not plainly valid; only the strict converter may decide."""


Structurer = Callable[[Any], Any]

_REFUSED: Final = Refused()  # raised often on hostile input: one instance, no formatting
_SIMPLE: Final = (str, int, bool)


class _Unsupported(Exception):
    """A field type this generator does not handle."""


@attrs.define(eq=False)
class _Generator:
    """Writes one structurer per attrs class, nested classes included."""

    names: dict[str, Any] = attrs.Factory(lambda: {"REFUSED": _REFUSED})
    done: dict[type[Any], str] = attrs.Factory(dict)
    source: list[str] = attrs.Factory(list)

    def constant(self, value: Any) -> str:
        name = f"c{len(self.names)}"
        self.names[name] = value
        return name

    def structurer(self, cls: type[Any]) -> str:
        """The name of *cls*'s structurer, written on first use."""
        if cls in self.done:
            return self.done[cls]
        name = f"structure_{cls.__name__}_{len(self.done)}"
        self.done[cls] = name
        fields = attrs.fields(cls)
        lines = [
            f"def {name}(d):",
            "    if type(d) is not dict:",
            "        raise REFUSED",
            "    kw = {}",
        ]
        for field in fields:
            key = repr(field.name)
            lines.append(f"    if {key} in d:")
            lines.append(f"        v = d[{key}]")
            lines.extend("        " + line for line in self.value(field.type))
            lines.append(f"        kw[{key}] = v")
            if field.default is attrs.NOTHING:
                lines.append("    else:")
                lines.append("        raise REFUSED")
        # Every known key was moved to kw: anything left over is an unknown key.
        lines.append("    if len(kw) != len(d):")
        lines.append("        raise REFUSED")
        lines.append(f"    return {self.constant(cls)}(**kw)")
        self.source.append("\n".join(lines))
        return name

    def value(self, tp: Any) -> list[str]:
        """Lines that check ``v`` against *tp* and leave the structured value in ``v``."""
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if tp in _SIMPLE:
            # The strict converter's rule: the exact JSON type (bool is not an int).
            return [f"if type(v) is not {tp.__name__}:", "    raise REFUSED"]
        if tp is float:
            return [
                "if type(v) is int:",
                "    v = float(v)",
                "elif type(v) is not float:",
                "    raise REFUSED",
            ]
        if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
            (inner,) = (arg for arg in args if arg is not type(None))
            return ["if v is not None:", *("    " + line for line in self.value(inner))]
        if origin is typing.Literal and all(type(arg) is str for arg in args):
            allowed = self.constant(frozenset(args))
            return [f"if type(v) is not str or v not in {allowed}:", "    raise REFUSED"]
        if origin is list and args and args[0] in _SIMPLE:
            return [
                "if type(v) is not list:",
                "    raise REFUSED",
                "for item in v:",
                f"    if type(item) is not {args[0].__name__}:",
                "        raise REFUSED",
            ]
        if origin is dict and args == (str, Any):
            return [
                "if type(v) is not dict:",
                "    raise REFUSED",
                "for item in v:",
                "    if type(item) is not str:",
                "        raise REFUSED",
            ]
        if attrs.has(tp):
            return [f"v = {self.structurer(tp)}(v)"]
        raise _Unsupported(tp)


def make_structurers(classes: Mapping[str, type[Any]]) -> dict[str, Structurer]:
    """One structurer per wire type whose class the generator understands."""
    out: dict[str, Structurer] = {}
    for wire_type, cls in classes.items():
        generator = _Generator()
        try:
            name = generator.structurer(cls)
        except _Unsupported:
            continue
        namespace = dict(generator.names)
        # The source is built above from attrs field names and types only: never from input.
        exec("\n\n".join(generator.source), namespace)  # noqa: S102
        out[wire_type] = namespace[name]
    return out
