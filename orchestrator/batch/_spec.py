"""``fleet map``'s options: what to run for each row, checked once when the map starts."""

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError

__all__ = ["MAX_RETRIES", "MapSpec"]

MAX_RETRIES: Final = 10


def _positive(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not value > 0 or math.isinf(value)):
        raise UsageError(f"map: {name} {value!r} must be a positive number")


@attrs.frozen(kw_only=True)
class MapSpec:
    """What to run for each row (``fleet map``'s options)."""

    template: str
    agent: str = "scout"
    mode: str | None = None
    model: str | None = None
    role: str | None = None
    schema: dict[str, Any] | None = attrs.field(default=None, eq=False)
    dedupe_key: str | None = None
    max_items: int | None = None
    max_runtime: float | None = None
    retries: int = 0
    #: Where results and failures go as JSONL (absolute; ``None``: the ledger only).
    out: str | None = None

    def __attrs_post_init__(self) -> None:
        _positive("--max-runtime", self.max_runtime)
        if isinstance(self.retries, bool) or not 0 <= self.retries <= MAX_RETRIES:
            raise UsageError(f"map: --retries {self.retries!r} must be 0..{MAX_RETRIES}")
        if self.out is not None and not Path(self.out).is_absolute():
            raise UsageError(f"map: --out {self.out!r} must be an absolute path")
        if self.mode == "worktree":
            raise UsageError("map: rows run as scouts or forks, not worktree writers")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "MapSpec":
        """From a control request or a ledger; unknown keys are an error."""
        fields = {a.name for a in attrs.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise UsageError(f"map: unknown option {min(unknown)!r}")
        template = data.get("template")
        if not isinstance(template, str):
            raise UsageError("map: the task template must be a string")
        for name in ("agent", "mode", "model", "role", "dedupe_key", "out"):
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise UsageError(f"map: {name} must be a string")
        for name in ("max_items", "retries"):
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"map: {name} must be a whole number")
        runtime = data.get("max_runtime")
        if runtime is not None and (
            isinstance(runtime, bool) or not isinstance(runtime, int | float)
        ):
            raise UsageError("map: max_runtime must be a number of seconds")
        schema = data.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise UsageError("map: schema must be a JSON Schema object")
        return cls(
            template=template,
            agent=data.get("agent") or "scout",
            mode=data.get("mode"),
            model=data.get("model"),
            role=data.get("role"),
            schema=schema,
            dedupe_key=data.get("dedupe_key"),
            max_items=data.get("max_items"),
            max_runtime=None if runtime is None else float(runtime),
            retries=data.get("retries") or 0,
            out=data.get("out"),
        )

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)
