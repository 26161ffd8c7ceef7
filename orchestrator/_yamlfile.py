"""Reading one optional YAML settings file (config.yaml, roles.yaml) with one-line errors."""

from pathlib import Path
from typing import Any

from orchestrator._errors import UsageError


def read_yaml_file(path: Path, what: str) -> Any:
    """Parse *path*; a missing file is ``None``, any other failure one line naming *what*."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc} (fix or remove the file)") from None
    import yaml  # noqa: PLC0415 - only a settings file pays for it

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise UsageError(f"{what} {path}: {first} (fix or remove the file)") from None
