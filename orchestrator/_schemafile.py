"""Reading a JSON Schema file (``fleet spawn --schema FILE``, an agent's ``schema:``).

Only the bytes and the JSON: capped at :data:`SCHEMA_CAP`, parsed strictly (no ``NaN``), one
line on any fault. Whether the object is a valid schema is checked where ``jsonschema`` lives
(:func:`orchestrator.governance._checked.check_schema`), at spawn.
"""

import json
from pathlib import Path
from typing import Any, Final

from orchestrator._errors import UsageError

#: The largest schema a spawn may carry, in bytes.
SCHEMA_CAP: Final = 64 * 1024


def parse_schema_text(data: bytes | str, *, source: str) -> dict[str, Any]:
    """The JSON object of a schema file's *data*; one line naming *source* when it is too
    large, not JSON or not an object."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > SCHEMA_CAP:
        raise UsageError(
            f"{source}: {len(raw)} bytes, over the {SCHEMA_CAP // 1024} KiB schema cap"
        )
    try:
        schema = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        first = " ".join(str(exc).split())[:200]
        raise UsageError(f"{source}: not JSON: {first}") from None
    if not isinstance(schema, dict):
        kind = "an array" if isinstance(schema, list) else f"a JSON {type(schema).__name__}"
        raise UsageError(f"{source}: a JSON Schema must be a JSON object, not {kind}")
    return schema


def read_schema_file(path: Path) -> dict[str, Any]:
    """The JSON in the schema file *path*, read at most one byte past the cap."""
    source = f"schema file {path}"
    try:
        with path.open("rb") as file:
            data = file.read(SCHEMA_CAP + 1)
    except OSError as exc:
        raise UsageError(f"{source}: {exc.strerror or exc}") from None
    if len(data) > SCHEMA_CAP:
        raise UsageError(f"{source}: over the {SCHEMA_CAP // 1024} KiB schema cap")
    return parse_schema_text(data, source=source)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
