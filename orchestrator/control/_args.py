"""Reading the ``args`` of a control request: one-line usage errors naming the field."""

from collections.abc import Mapping
from typing import Any

from orchestrator._errors import UsageError


def str_arg(args: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    value = args.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise UsageError(f"{key} must be a non-empty string")
    return value


def strs_arg(args: Mapping[str, Any], key: str) -> list[str]:
    value = args.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{key} must be a list of strings")
    return value
