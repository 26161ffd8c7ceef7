"""The codec for the envelope every frame carries: one strict converter reads and writes it.

Every frame body is a JSON envelope::

    {"v": 1, "token": "...", "owner": "a1", "corr": "7", "kind": "request",
     "type": "prompt", "body": {...}}

``type`` selects the body's class through :data:`~ipc._types.MESSAGE_TYPES` (an explicit tag
map; the classes live in :mod:`ipc._types`). This module is the only place that
(de)serializes them, through one cattrs converter that forbids unknown keys, so a schema error
always names its field (``$.body.text``).

Both directions have a hot path, because a round trip's cost is mostly this codec: a
:class:`FrameWriter` keeps its channel's fixed envelope prefix as text and writes a body of
plain field values with a generated encoder (:mod:`ipc._encoders`), and :func:`decode_frame`
builds a plainly valid body with a generated structurer (:mod:`ipc._fastpath`), handing
anything else to the strict converter.
"""

import json
import typing
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any, Final

import attrs
import cattrs
import orjson
from cattrs.cols import list_structure_factory
from cattrs.preconf.json import make_converter
from cattrs.v import format_exception

from ipc._encoders import make_encoders
from ipc._errors import SchemaError
from ipc._fastpath import Refused, make_structurers
from ipc._framing import MAX_FRAME, encode_frame
from ipc._types import MESSAGE_TYPES, PROTOCOL_VERSION, TYPE_NAMES, Envelope, Kind, Message

Decoded = tuple[str, str, str, Kind, str, Message]
"""A decoded frame as :func:`decode_frame` returns it: token, owner, corr, kind, type, body."""


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


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct; a repeated key is refused, not last-wins
    (two parsers could otherwise read one frame two ways)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        repeated = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {repeated!r}")
    return obj


def _not_json(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON")


# Built once: json.dumps/json.loads with options construct a new coder on every call.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=unique_object)
_TEXT_CHECK: Final = json.JSONEncoder(ensure_ascii=False)

# The C encoder _ENCODER.encode builds anew on every call (a third of its cost), built once
# with the same options. Without a markers dict it does not look for cycles: a cyclic body
# ends in a RecursionError, which _encode refuses like any other unencodable value.
_MAKE_C_ENCODER: Final = getattr(json.encoder, "c_make_encoder", None)
if _MAKE_C_ENCODER is None:  # an interpreter without the C accelerator
    _dumps: Callable[[Any], str] = _ENCODER.encode
else:
    _C_ENCODER: Final = _MAKE_C_ENCODER(
        markers=None,
        default=_not_json,
        encoder=encode_basestring,
        indent=None,
        key_separator=":",
        item_separator=",",
        sort_keys=False,
        skipkeys=False,
        allow_nan=False,
    )

    def _dumps(value: Any) -> str:
        return "".join(_C_ENCODER(value, 0))


_ENCODE_ERRORS: Final = (UnicodeError, ValueError, TypeError, RecursionError)


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


def _make_converter() -> cattrs.Converter:
    made = make_converter(forbid_extra_keys=True)
    made.register_structure_hook(str, _strict(str, str))
    made.register_structure_hook(int, _strict(int, int))
    made.register_structure_hook(bool, _strict(bool, bool))
    made.register_structure_hook(float, _strict(float, float, int))
    made.register_structure_hook_factory(_is_list, _strict_list)
    return made


converter: Final = _make_converter()
"""The converter: every schema error it raises names its field path."""

_FAST: Final = make_structurers(MESSAGE_TYPES)
_FAST_ENCODE: Final = make_encoders(
    MESSAGE_TYPES, dumps=_dumps, hook_for=converter.get_unstructure_hook
)
_UNSTRUCTURE: Final = {cls: converter.get_unstructure_hook(cls) for cls in TYPE_NAMES}
_KEY_COUNT: Final = len(attrs.fields(_RawEnvelope))
_KINDS: Final = frozenset(typing.get_args(Kind))
_KIND_TEXT: Final = {kind: f',"kind":"{kind}"' for kind in _KINDS}


def _head_text(v: int, token: str, owner: str) -> str:
    return f'{{"v":{_dumps(v)},"token":{_dumps(token)},"owner":{_dumps(owner)},"corr":'


def _type_text(type_: str) -> str:
    return f',"type":{_dumps(type_)},"body":'


_TYPE_TEXT: Final = {cls: _type_text(name) for cls, name in TYPE_NAMES.items()}


def _encode(head: str, corr: str, kind: Kind, type_text: str, body: Message) -> bytes:
    # The envelope's keys in a fixed order, so equal envelopes encode to equal bytes.
    cls = type(body)
    try:
        try:
            body_text = _FAST_ENCODE[cls](body)
        except (KeyError, Refused):
            body_text = _dumps(_UNSTRUCTURE.get(cls, converter.unstructure)(body))
        return "".join(
            (head, encode_basestring(corr), _KIND_TEXT[kind], type_text, body_text, "}")
        ).encode()
    except _ENCODE_ERRORS as exc:
        # A lone surrogate or a NaN would put a frame on the wire that no peer may accept.
        raise SchemaError(
            f"encode {TYPE_NAMES.get(cls, cls.__name__)}: not representable as UTF-8 JSON: {exc}",
            path="$.body",
            reason="encode",
        ) from None


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
    a lone surrogate in a string, a NaN or infinite float, a value of no JSON type.
    """
    return _encode(
        _head_text(envelope.v, envelope.token, envelope.owner),
        envelope.corr,
        envelope.kind,
        _type_text(envelope.type),
        envelope.body,
    )


@attrs.frozen(kw_only=True)
class FrameWriter:
    """Whole frames (length prefix included) from one sender: :func:`encode_envelope`'s bytes.

    The envelope's fixed part (version, token, owner) is encoded once, here.
    """

    token: str
    owner: str
    max_frame: int = MAX_FRAME
    _head: str = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda self: _head_text(PROTOCOL_VERSION, self.token, self.owner), takes_self=True
        ),
    )

    def frame(self, kind: Kind, corr: str, message: Message) -> bytes:
        """The frame of *message*; raises :class:`SchemaError` or :class:`FrameError`."""
        data = _encode(self._head, corr, kind, _TYPE_TEXT[type(message)], message)
        size = len(data)
        if size > self.max_frame:
            return encode_frame(data, max_frame=self.max_frame)  # refuses it, saying why
        return size.to_bytes(4, "big") + data  # encode_frame's prefix, a call fewer


def _strict_loads(data: bytes) -> Any:
    """The strict decoder: what a frame's JSON means, or a ``json`` :class:`SchemaError`."""
    try:
        # Decode strictly ourselves: json.loads(bytes) would also take UTF-16/32 and let
        # encoded surrogates through ("surrogatepass").
        text = data.decode()
        try:
            obj, end = _DECODER.raw_decode(text)
        except ValueError:
            end = -1
        if end != len(text):
            # Whitespace around the object, or an error to report: the full decoder says.
            obj = _DECODER.decode(text)
        # A \u escape may still spell a lone surrogate: valid JSON grammar, but a string that
        # can never be encoded again. Only frames with an escape pay for the check.
        if "\\u" in text:
            _TEXT_CHECK.encode(obj).encode()
    except (UnicodeError, ValueError, RecursionError) as exc:
        # ValueError also covers an integer past the interpreter's digit limit.
        raise SchemaError(f"frame is not UTF-8 JSON: {exc}", reason="json") from None
    return obj


def loads(data: bytes) -> Any:
    """A frame body's JSON value: orjson's reading where it is the strict decoder's too.

    Raises :class:`SchemaError` (reason ``json``) for what the strict decoder refuses.
    """
    # orjson keeps the last of two equal keys and reads an integer past 64 bits as a float.
    # A text that is exactly what orjson writes for the value it read has neither (a dropped
    # key or a rewritten number would make it differ), no whitespace and no escape but the
    # ones orjson writes, which are FrameWriter's too. Any other text, and whatever orjson
    # refuses, is read by the strict decoder, which takes it or says why not.
    try:
        obj = orjson.loads(data)
        canonical = orjson.dumps(obj) == data
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        canonical = False
    return obj if canonical else _strict_loads(data)


def decode_frame(data: bytes) -> Decoded:
    """Parse one frame body into its parts; raise :class:`SchemaError` naming the bad field.

    :func:`decode_envelope` without building the :class:`Envelope` (the channel's hot path);
    the version is always :data:`PROTOCOL_VERSION`.
    """
    obj = loads(data)
    if type(obj) is not dict:
        raise SchemaError("frame is not a JSON object @ $", reason="schema")
    if len(obj) == _KEY_COUNT:  # as every FrameWriter writes it: the envelope's seven keys
        # Looked up one by one (cheaper than comparing the key list); a missing one is None,
        # which the check below sends to the converter.
        get: Callable[[str], Any] = obj.get
        v, token, owner, corr = get("v"), get("token"), get("owner"), get("corr")
        kind, type_, raw_body = get("kind"), get("type"), get("body")
    else:
        v = token = owner = corr = kind = type_ = raw_body = None  # the converter decides
    if not (
        type(v) is int
        and type(token) is str
        and type(owner) is str
        and type(corr) is str
        and type(kind) is str
        and kind in _KINDS
        and type(type_) is str
        and type(raw_body) is dict
    ):
        # The check above accepts a subset of what structuring _RawEnvelope accepts (keys in
        # any order are fine there), at half the cost; the converter decides the rest and
        # explains a refusal.
        try:
            raw = converter.structure(obj, _RawEnvelope)
        except Exception as exc:
            path, message = render_error(exc, "$")
            raise SchemaError(message, path=path) from None
        v, token, owner, corr, kind, type_, raw_body = attrs.astuple(raw, recurse=False)
    if v != PROTOCOL_VERSION:
        raise SchemaError(f"unsupported protocol version {v} @ $.v", path="$.v")
    try:
        body = _FAST[type_](raw_body)
    except (KeyError, Refused):
        cls = MESSAGE_TYPES.get(type_)
        if cls is None:
            raise SchemaError(
                f"unknown message type {type_!r} @ $.type", path="$.type", reason="type"
            ) from None
        try:
            body = converter.structure(raw_body, cls)
        except Exception as exc:
            path, message = render_error(exc, "$.body")
            raise SchemaError(message, path=path) from None
    return token, owner, corr, kind, type_, body


def decode_envelope(data: bytes) -> Envelope:
    """Parse one frame body; raise :class:`SchemaError` naming the bad field."""
    token, owner, corr, kind, type_, body = decode_frame(data)
    return Envelope(
        v=PROTOCOL_VERSION, token=token, owner=owner, corr=corr, kind=kind, type=type_, body=body
    )


def type_name(message: Message) -> str:
    """The wire ``type`` of *message*."""
    return TYPE_NAMES[type(message)]
