"""The codec for the envelope every frame carries: one strict converter reads and writes it.

Every frame body is a JSON envelope::

    {"v": 1, "token": "...", "owner": "a1", "corr": "7", "kind": "request",
     "type": "prompt", "body": {...}}

``type`` selects the body's class through :data:`~ipc._types.MESSAGE_TYPES` (an explicit tag
map; the classes live in :mod:`ipc._types`). This module is the only place that
(de)serializes them, through one cattrs converter that forbids unknown keys, so a schema error
always names its field (``$.body.text``).
"""

import json
import typing
from collections.abc import Callable
from typing import Any, Final

import attrs
import cattrs
from cattrs.cols import list_structure_factory
from cattrs.preconf.json import make_converter
from cattrs.v import format_exception

from ipc._errors import SchemaError
from ipc._types import MESSAGE_TYPES, PROTOCOL_VERSION, TYPE_NAMES, Envelope, Kind, Message


@attrs.frozen(kw_only=True)
class _RawEnvelope:
    v: int
    token: str
    owner: str
    corr: str
    kind: Kind
    type: str
    body: dict[str, Any]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.dumps/json.loads with options construct a new coder on every call.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
_TEXT_CHECK: Final = json.JSONEncoder(ensure_ascii=False)


def _strict(expected: type[Any], *accepted: type[Any]) -> Any:
    # cattrs would coerce 1 -> "1" and "x" -> error late; on the wire a type mismatch is a
    # schema error, and bool is not an int.
    def hook(value: Any, _: Any) -> Any:
        if type(value) not in accepted:
            raise TypeError(f"expected {expected.__name__}, got {type(value).__name__}")
        return expected(value)

    return hook


def _is_list(cls: Any) -> bool:
    return typing.get_origin(cls) is list


def _strict_list(cls: Any, conv: cattrs.BaseConverter) -> Callable[[Any, Any], Any]:
    # cattrs builds a list from any iterable, so "abc" would become ["a", "b", "c"] and an
    # object would become its keys; on the wire only a JSON array is a list.
    items = list_structure_factory(cls, conv)

    def hook(value: Any, kind: Any) -> Any:
        if type(value) is not list:
            raise TypeError(f"expected a list, got {type(value).__name__}")
        return items(value, kind)

    return hook


def _make_converter(*, detailed: bool) -> cattrs.Converter:
    made = make_converter(forbid_extra_keys=True, detailed_validation=detailed)
    made.register_structure_hook(str, _strict(str, str))
    made.register_structure_hook(int, _strict(int, int))
    made.register_structure_hook(bool, _strict(bool, bool))
    made.register_structure_hook(float, _strict(float, float, int))
    made.register_structure_hook_factory(_is_list, _strict_list)
    return made


converter: Final = _make_converter(detailed=True)
"""The converter: every schema error it raises names its field path."""

# The same rules without per-field error bookkeeping, for the hot path: a frame it refuses is
# structured again by ``converter`` to say exactly why, so it never decides alone.
_fast: Final = _make_converter(detailed=False)
_ENVELOPE_KEYS: Final = frozenset(attrs.fields_dict(_RawEnvelope))
_KINDS: Final = frozenset(typing.get_args(Kind))


def _format_exception(exc: BaseException, cls: type[Any] | None) -> str:
    # cattrs says only "invalid value" for a validator's ValueError; its message names the
    # field and the rule, which is what the reader of the error needs.
    if isinstance(exc, ValueError) and cls is None and str(exc):
        return f"invalid value ({exc})"
    return format_exception(exc, cls)


def render_error(exc: Exception, prefix: str) -> tuple[str, str]:
    """Return (path, first message) for a cattrs failure, e.g. ``$.body.text``."""
    if isinstance(exc, cattrs.BaseValidationError):
        messages = cattrs.transform_error(exc, path=prefix, format_exception=_format_exception)
        first = messages[0] if messages else f"invalid value @ {prefix}"
        path = first.rsplit(" @ ", 1)[-1] if " @ " in first else prefix
        return path, first
    return prefix, f"{exc} @ {prefix}"


def encode_envelope(envelope: Envelope) -> bytes:
    """Serialize *envelope* to the compact UTF-8 JSON a frame carries.

    Raises :class:`SchemaError` (reason ``encode``) for a value JSON cannot carry faithfully:
    a lone surrogate in a string, or a NaN or infinite float.
    """
    return encode_fields(
        token=envelope.token,
        owner=envelope.owner,
        corr=envelope.corr,
        kind=envelope.kind,
        type_=envelope.type,
        body=envelope.body,
        v=envelope.v,
    )


def encode_fields(
    *,
    token: str,
    owner: str,
    corr: str,
    kind: Kind,
    type_: str,
    body: Message,
    v: int = PROTOCOL_VERSION,
) -> bytes:
    """:func:`encode_envelope` without building the :class:`Envelope` (the send path)."""
    raw = {
        "v": v,
        "token": token,
        "owner": owner,
        "corr": corr,
        "kind": kind,
        "type": type_,
        "body": converter.unstructure(body),
    }
    try:
        return _ENCODER.encode(raw).encode()
    except (UnicodeError, ValueError) as exc:
        # A lone surrogate or a NaN would put a frame on the wire that no peer may accept.
        raise SchemaError(
            f"encode {type_}: not representable as UTF-8 JSON: {exc}",
            path="$.body",
            reason="encode",
        ) from None


def decode_envelope(data: bytes) -> Envelope:
    """Parse one frame body; raise :class:`SchemaError` naming the bad field."""
    try:
        # Decode strictly ourselves: json.loads(bytes) would also take UTF-16/32 and let
        # encoded surrogates through ("surrogatepass").
        text = data.decode()
        obj = _DECODER.decode(text)
        # A \u escape may still spell a lone surrogate: valid JSON grammar, but a string that
        # can never be encoded again. Only frames with an escape pay for the check.
        if "\\u" in text:
            _TEXT_CHECK.encode(obj).encode()
    except (UnicodeError, ValueError, RecursionError) as exc:
        # ValueError also covers an integer past the interpreter's digit limit.
        raise SchemaError(f"frame is not UTF-8 JSON: {exc}", reason="json") from None
    if not isinstance(obj, dict):
        raise SchemaError("frame is not a JSON object @ $", reason="schema")
    if (
        obj.keys() == _ENVELOPE_KEYS
        and type(obj["v"]) is int
        and type(obj["token"]) is str
        and type(obj["owner"]) is str
        and type(obj["corr"]) is str
        and type(obj["kind"]) is str
        and obj["kind"] in _KINDS
        and type(obj["type"]) is str
        and type(obj["body"]) is dict
    ):
        # Exactly what structuring _RawEnvelope accepts, checked inline: it is half the
        # cost of a decode, and JSON objects have only str keys.
        fields = obj
    else:
        try:
            fields = attrs.asdict(converter.structure(obj, _RawEnvelope), recurse=False)
        except Exception as exc:
            path, message = render_error(exc, "$")
            raise SchemaError(message, path=path) from None
    if fields["v"] != PROTOCOL_VERSION:
        raise SchemaError(f"unsupported protocol version {fields['v']} @ $.v", path="$.v")
    type_ = fields["type"]
    cls = MESSAGE_TYPES.get(type_)
    if cls is None:
        raise SchemaError(f"unknown message type {type_!r} @ $.type", path="$.type", reason="type")
    try:
        body = _fast.structure(fields["body"], cls)
    except Exception:
        try:
            body = converter.structure(fields["body"], cls)
        except Exception as exc:
            path, message = render_error(exc, "$.body")
            raise SchemaError(message, path=path) from None
    return Envelope(
        v=fields["v"],
        token=fields["token"],
        owner=fields["owner"],
        corr=fields["corr"],
        kind=fields["kind"],
        type=type_,
        body=body,
    )


def type_name(message: Message) -> str:
    """The wire ``type`` of *message*."""
    return TYPE_NAMES[type(message)]
