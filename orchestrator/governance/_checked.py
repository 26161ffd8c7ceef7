"""Checked results: a child's report ends with one fenced JSON block that a JSON Schema accepts.

Pure and synchronous. A spawn may carry a schema; :func:`load_schema` / :func:`check_schema`
refuse a bad one at spawn with one line (too large, not JSON, not a valid schema).
:func:`instruction` is the line appended to the child's task. When a turn settles,
:class:`CheckedResult` judges the report: the **last** fenced ````json`` block is parsed and
validated with the ``jsonschema`` library (no remote ``$ref`` is ever fetched). An invalid or
missing result gets **one** corrective steer naming the error and the path of the failing
element; a second invalid result fails the child with that error.
"""

import json
import re
from collections.abc import Mapping
from typing import Any, Final, cast

import attrs
import jsonschema
import jsonschema.exceptions
import referencing.exceptions

from orchestrator._errors import UsageError
from orchestrator._schemafile import SCHEMA_CAP, parse_schema_text

__all__ = [
    "ERROR_CAP",
    "RESULT_CAP",
    "RESULT_DEPTH",
    "SCHEMA_CAP",
    "Checked",
    "CheckedResult",
    "Verdict",
    "check_schema",
    "extract",
    "instruction",
    "load_schema",
    "needs_isolation",
    "validate",
]

#: The largest result block that is parsed, in bytes (every ``wait`` note carries the result).
RESULT_CAP: Final = 64 * 1024
#: The deepest nesting of a result: every reply that carries it must still encode (orjson
#: stops at 254 levels) and validation must not run out of stack.
RESULT_DEPTH: Final = 64
#: The longest validation error line (steer, failure) in characters.
ERROR_CAP: Final = 300

_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\r\n]*?)[ \t]*$")


def _clip(text: str, limit: int = ERROR_CAP) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def check_schema(schema: Any, *, source: str = "schema") -> dict[str, Any]:
    """*schema* if it is a JSON object that is a valid schema of its dialect (default draft
    2020-12), else a one-line :class:`UsageError` naming *source*."""
    if not isinstance(schema, dict):
        raise UsageError(f"{source}: a JSON Schema must be a JSON object, not {_kind(schema)}")
    try:
        size = len(json.dumps(schema, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{source}: not plain JSON: {_clip(str(exc))}") from None
    if size > SCHEMA_CAP:
        raise UsageError(f"{source}: {size} bytes, over the {SCHEMA_CAP // 1024} KiB schema cap")
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        raise UsageError(f"{source}: $schema must be a string naming a JSON Schema dialect")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    unknown = cast("Any", None)  # validator_for's default, returned for an unknown dialect
    if dialect is not None and jsonschema.validators.validator_for(schema, unknown) is None:
        raise UsageError(
            f"{source}: unknown $schema dialect {_clip(dialect, 100)!r} (use a draft from 3 "
            "to 2020-12, or leave $schema out for 2020-12)"
        )
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = _pointer(exc.absolute_path)
        raise UsageError(
            f"{source}: not a valid JSON Schema at {where}: {_clip(exc.message)}"
        ) from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply to check") from None
    return schema


def load_schema(data: bytes | str, *, source: str) -> dict[str, Any]:
    """A schema from the text of the file *source*: capped, parsed, checked; one line if not."""
    return check_schema(parse_schema_text(data, source=source), source=source)


def instruction(schema: Mapping[str, Any]) -> str:
    """The one instruction appended to a checked child's task."""
    text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
    return (
        "End your final report with exactly one fenced ```json code block holding your result "
        f"as JSON that validates against this JSON Schema: {text}"
    )


def extract(text: str) -> str | None:
    """The content of the last fenced code block tagged ``json`` in *text* (CommonMark fences:
    backticks or tildes, a closing fence at least as long; an unclosed block runs to the end),
    or ``None`` when there is none. Blocks inside other blocks do not count."""
    found: str | None = None
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opened = _OPEN.match(lines[index])
        index += 1
        if opened is None:
            continue
        fence, info = opened["fence"], opened["info"]
        if fence[0] == "`" and "`" in info:
            continue  # not a fence: inline code
        body: list[str] = []
        while index < len(lines):
            line = lines[index]
            index += 1
            stripped = line.strip()
            if (
                len(line) - len(line.lstrip(" ")) <= 3
                and stripped
                and set(stripped) == {fence[0]}
                and len(stripped) >= len(fence)
            ):
                break
            body.append(line)
        if info.lower().split()[:1] == ["json"]:
            found = "\n".join(body)
    return found


@attrs.frozen(kw_only=True)
class Checked:
    """One report judged: the parsed *value* when it is valid, else the *error* line."""

    ok: bool
    value: Any = None
    error: str = ""
    #: The schema itself cannot validate (an unresolvable ``$ref``): no steer will help.
    broken: bool = False


def validate(text: str, schema: Mapping[str, Any]) -> Checked:
    """The last ``json`` block of *text* parsed and validated against *schema*."""
    block = extract(text)
    if block is None:
        return Checked(ok=False, error="the report has no fenced ```json block")
    if len(block.encode()) > RESULT_CAP:
        return Checked(
            ok=False,
            error=f"the ```json block is over the {RESULT_CAP // 1024} KiB result cap",
        )
    try:
        value = json.loads(block, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        return Checked(ok=False, error=f"the last ```json block is not valid JSON: {exc}")
    if _depth(value) > RESULT_DEPTH:
        return Checked(ok=False, error=f"the result is nested deeper than {RESULT_DEPTH} levels")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except (referencing.exceptions.Unresolvable, jsonschema.exceptions.SchemaError) as exc:
        return Checked(ok=False, error=f"the schema cannot be used: {exc}", broken=True)
    except RecursionError:
        return Checked(ok=False, error="the result is nested too deeply to validate")
    if error is None:
        return Checked(ok=True, value=value)
    return Checked(
        ok=False, error=f"result invalid at {_pointer(error.absolute_path)}: {error.message}"
    )


@attrs.frozen(kw_only=True)
class Verdict:
    """What the supervisor does with a settled turn of a checked child: keep *value*
    (``valid``), send *steer* (one corrective turn), or fail the child with *error*."""

    valid: bool
    value: Any = None
    steer: str = ""
    error: str = ""


@attrs.define(eq=False)
class CheckedResult:
    """One child's checked result: its schema and whether the one correction is spent."""

    schema: Mapping[str, Any]
    corrected: bool = False
    #: A validation done ahead of :meth:`judge` (off the event loop), for that report only.
    _known: tuple[str, Checked] | None = None

    def remember(self, report: str, checked: Checked) -> None:
        """Keep *checked* as the outcome of validating *report*, for the next :meth:`judge`."""
        self._known = (report, checked)

    def judge(self, report: str) -> Verdict:
        known, self._known = self._known, None
        checked = known[1] if known is not None and known[0] == report else None
        if checked is None:
            checked = validate(report, self.schema)
        if checked.ok:
            self.corrected = False  # a later prompt of the parent gets its own correction
            return Verdict(valid=True, value=checked.value)
        error = _clip(checked.error)
        if self.corrected or checked.broken:
            return Verdict(valid=False, error=error)
        self.corrected = True
        return Verdict(
            valid=False,
            steer=_clip(
                f"Your result did not pass its JSON Schema ({checked.error}); reply with the "
                "corrected report ending in one fenced ```json block that validates",
                2 * ERROR_CAP,
            ),
        )


#: Keywords whose regular expressions run on the child's strings: a backtracking pattern can
#: take forever on a crafted result, so such schemas are validated in a killable process.
_REGEX_KEYWORDS: Final = frozenset({"pattern", "patternProperties"})


def needs_isolation(schema: Any) -> bool:
    """Whether *schema* holds a regular expression that the child's result is matched against
    (a property merely *named* ``pattern`` counts too: isolation is only slower)."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if _REGEX_KEYWORDS & set(item):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in *value* (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def _pointer(path: Any) -> str:
    """A JSON Pointer (RFC 6901) for a jsonschema path; ``/`` is the whole document."""
    parts = [str(part).replace("~", "~0").replace("/", "~1") for part in path]
    return "/" + "/".join(parts) if parts else "/"


def _kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
