"""Generated body encoders: the encode hot path for message bodies of plain field values.

A body is written as ``json(converter.unstructure(body))``: cattrs builds a dict, the JSON
encoder walks it. Each message class also gets one function, generated once from its attrs
fields (the order cattrs uses), that writes the same JSON text directly from the fields. It
handles a field only when the value's exact type makes the text certain (``True`` is
``true``, a ``str`` is ``encode_basestring(value)``, an empty ``dict`` is ``{}``); a
non-empty ``dict[str, Any]`` goes through the field's own cattrs hook and the JSON encoder,
as before. Anything else — a value of another type than its annotation, a float that is not
finite — raises :class:`~ipc._fastpath.Refused`, and the caller takes the general path, which
writes it or says why it cannot. ``tests/ipc/test_encoders.py`` checks that both paths write
the same bytes.

A class with a field type the generator does not know gets no fast encoder.
"""

import math
import types
import typing
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring
from typing import Any, Final

import attrs

from ipc._fastpath import Refused

Encoder = Callable[[Any], str]
JsonDumps = Callable[[Any], str]
HookFor = Callable[[Any], Callable[[Any], Any]]

_REFUSED: Final = Refused()


class _Unsupported(Exception):
    """A field type this generator does not handle."""


@attrs.define(eq=False)
class _Generator:
    """Writes one encoder per attrs class, nested classes included."""

    dumps: JsonDumps
    hook_for: HookFor
    names: dict[str, Any] = attrs.Factory(dict)
    done: dict[type[Any], str] = attrs.Factory(dict)
    source: list[str] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self.names.update(
            REFUSED=_REFUSED,
            S=encode_basestring,
            INT=int.__repr__,
            FLOAT=float.__repr__,
            isfinite=math.isfinite,
            dumps=self.dumps,
        )

    def constant(self, value: Any) -> str:
        name = f"c{len(self.names)}"
        self.names[name] = value
        return name

    def encoder(self, cls: type[Any]) -> str:
        """The name of *cls*'s encoder, written on first use."""
        if cls in self.done:
            return self.done[cls]
        name = f"encode_{cls.__name__}_{len(self.done)}"
        self.done[cls] = name
        lines = [f"def {name}(m):", "    parts = []"]
        for index, field in enumerate(attrs.fields(cls)):
            key = encode_basestring(field.name)
            opening = "{" if index == 0 else ","
            lines.append(f"    parts.append({f'{opening}{key}:'!r})")
            lines.append(f"    v = m.{field.name}")
            lines.extend("    " + line for line in self.value(field.type))
        lines.append("    parts.append('}' if parts else '{}')")
        lines.append("    return ''.join(parts)")
        self.source.append("\n".join(lines))
        return name

    def value(self, tp: Any) -> list[str]:
        """Lines that append the JSON text of ``v`` (annotated *tp*) to ``parts``."""
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if tp is str or (origin is typing.Literal and all(type(a) is str for a in args)):
            return ["if type(v) is not str:", "    raise REFUSED", "parts.append(S(v))"]
        if tp is bool:
            return [
                "if v is True:",
                "    parts.append('true')",
                "elif v is False:",
                "    parts.append('false')",
                "else:",
                "    raise REFUSED",
            ]
        if tp is int:
            return ["if type(v) is not int:", "    raise REFUSED", "parts.append(INT(v))"]
        if tp is float:
            return [
                "if type(v) is not float or not isfinite(v):",
                "    raise REFUSED",
                "parts.append(FLOAT(v))",
            ]
        if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
            (inner,) = (arg for arg in args if arg is not type(None))
            return [
                "if v is None:",
                "    parts.append('null')",
                "else:",
                *("    " + line for line in self.value(inner)),
            ]
        if origin is list and args == (str,):
            return [
                "if type(v) is not list:",
                "    raise REFUSED",
                "for item in v:",
                "    if type(item) is not str:",
                "        raise REFUSED",
                "parts.append('[' + ','.join(map(S, v)) + ']')",
            ]
        if origin is dict and args == (str, Any):
            hook = self.constant(self.hook_for(tp))
            return [
                "if type(v) is not dict:",
                "    raise REFUSED",
                f"parts.append(dumps({hook}(v)) if v else '{{}}')",
            ]
        if attrs.has(tp):
            cls = self.constant(tp)
            return [
                f"if type(v) is not {cls}:",
                "    raise REFUSED",
                f"parts.append({self.encoder(tp)}(v))",
            ]
        raise _Unsupported(tp)


def make_encoders(
    classes: Mapping[str, type[Any]], *, dumps: JsonDumps, hook_for: HookFor
) -> dict[type[Any], Encoder]:
    """One encoder per message class the generator understands.

    *dumps* is the compact JSON encoder and *hook_for* the converter's unstructure hook for a
    type: what the general path uses, for the values the encoders hand on.
    """
    out: dict[type[Any], Encoder] = {}
    for cls in classes.values():
        generator = _Generator(dumps=dumps, hook_for=hook_for)
        try:
            name = generator.encoder(cls)
        except _Unsupported:
            continue
        namespace = dict(generator.names)
        # The source is built above from attrs field names and types only: never from input.
        exec("\n\n".join(generator.source), namespace)  # noqa: S102
        out[cls] = namespace[name]
    return out
