"""Validating a checked result where a backtracking pattern cannot stall the supervisor.

A schema's ``pattern`` runs Python's ``re`` on strings the child chose, and ``re`` holds the
interpreter for as long as it backtracks: a crafted result against a careless pattern
(``^(a+)+$``) would freeze every child's I/O. :func:`validate_safely` therefore validates a
schema with a regular expression in a fresh ``python -I`` process that is killed after
:data:`TIMEOUT` seconds (the child is then failed: no correction helps); any other schema is
validated in place, which takes well under a millisecond for a typical result.

:func:`main` is that process: a JSON ``{"report", "schema"}`` on stdin, the
:class:`~orchestrator.governance._checked.Checked` as JSON on stdout.
"""

import json
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from orchestrator.governance._checked import Checked, needs_isolation, validate

__all__ = ["TIMEOUT", "validate_safely"]

#: Seconds an isolated validation may take before it is killed.
TIMEOUT: Final = 10.0
#: Where this package is imported from: the isolated process (``-I``: no environment, no
#: current directory on the path) finds the same code however the supervisor was started.
_ROOT: Final = Path(__file__).resolve().parents[2]
_ENTRY: Final = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from orchestrator.governance._checkproc import main; main()"
)


async def validate_safely(
    report: str,
    schema: Mapping[str, Any],
    *,
    timeout: float | None = None,  # noqa: ASYNC109 - the validating process's kill deadline
) -> Checked:
    """*report* validated against *schema*; off the event loop when the schema has patterns
    (killed after *timeout* seconds, default :data:`TIMEOUT`)."""
    timeout = TIMEOUT if timeout is None else timeout
    if not needs_isolation(schema):
        return validate(report, schema)
    request = json.dumps({"report": report, "schema": schema}).encode()
    argv = [sys.executable, "-I", "-c", _ENTRY, str(_ROOT)]
    with trio.move_on_after(timeout):
        try:
            done = await trio.run_process(
                argv,
                stdin=request,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                deliver_cancel=_kill,
            )
        except OSError as exc:
            return Checked(ok=False, error=f"could not start the validator: {exc}", broken=True)
        try:
            return Checked(**json.loads(done.stdout))
        except (ValueError, TypeError):
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return Checked(ok=False, error=f"the validator failed: {tail[0][:200]}", broken=True)
    return Checked(
        ok=False,
        error=f"validation ran past {timeout:g} s (a pattern in the schema backtracks on this "
        "result)",
        broken=True,
    )


async def _kill(process: trio.Process) -> None:
    process.send_signal(signal.SIGKILL)


def main() -> None:
    request = json.load(sys.stdin)
    checked = validate(request["report"], request["schema"])
    json.dump(attrs.asdict(checked), sys.stdout)


if __name__ == "__main__":
    main()
