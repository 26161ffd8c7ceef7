"""How a verb ends: its exit code, and a failure as one stderr line (and the ``--json`` error).

Shared by the full command line (:mod:`._main`) and the warm verbs (:mod:`._fast`), so both
end alike; it imports nothing beyond the error tree.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from orchestrator._errors import TimedOut

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, Final, NoReturn

    from orchestrator._errors import FleetError

#: The exit code when the reader of our output went away (``fleet peek | head -1``): what a
#: shell reports for a process that SIGPIPE ended.
CLOSED_PIPE: Final = 141


def exit_with(run: Callable[[], int]) -> NoReturn:
    """Exit with *run*'s code, or :data:`CLOSED_PIPE` when our reader went away."""
    try:
        code = run()
        sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can be said, and Python must not complain again when it flushes at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        code = CLOSED_PIPE
    sys.exit(code)


class WaitTimedOut(TimedOut):
    """``fleet wait --timeout`` ran out: exit 3, with what is still working (``progress``:
    the ``questions`` and ``working`` rows of the last wait) beside the error."""

    def __init__(self, message: str, progress: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.progress = {k: progress[k] for k in ("questions", "working") if k in progress}


def progress_text(progress: Mapping[str, Any]) -> str:
    """The human lines of a timed-out wait: open questions, then each working child."""
    lines = [
        f"question {q['id']} from {q['key']}: {q['text']}  (fleet answer {q['id']} TEXT)"
        for q in progress.get("questions", [])
    ]
    for row in progress.get("working", []):
        checklist = f" {row['checklist']}" if row.get("checklist") else ""
        activity = f" — {row['activity']}" if row.get("activity") else ""
        lines.append(
            f"{row['key']} {row['name']} {row['state']}{checklist}{activity} "
            f"(for {row['age_s']:g} s, last event {row['last_event_age_s']:g} s ago)"
        )
    return "\n".join(lines)


def note_failed(note: Mapping[str, Any]) -> bool:
    """Whether a settle note is a failure: the child failed, or its turn did (a model that is
    unreachable or answers 500, a missing CLI, a CLI that is not logged in) and left it idle
    with the turn's error. A question is not a failure."""
    return note.get("state") == "failed" or (bool(note.get("error")) and "question" not in note)


def error_code(exc: FleetError, verb: str, *, json_output: bool) -> int:
    """Report a verb's :class:`FleetError` (one stderr line, the JSON error with ``--json``)."""
    message = str(exc)
    prefix = f"{verb}: "
    line = f"fleet {message}" if message.startswith(prefix) else f"fleet {verb}: {message}"
    progress = exc.progress if isinstance(exc, WaitTimedOut) else None
    if json_output:
        error = {"error": {"kind": exc.kind, "message": message}}
        print(json.dumps(error | {"settled": [], **progress} if progress is not None else error))
    elif progress:
        print(progress_text(progress))
    print(line, file=sys.stderr)
    return exc.exit_code


def internal_error_code(exc: Exception, verb: str, *, json_output: bool, debug: bool) -> int:
    """Report a bug in one line (the traceback with ``--debug`` or ``FLEET_DEBUG``).

    A supervisor (``serve``) writes the traceback too: started by another command, its log is
    the only record of the bug, and nobody can rerun it with ``--debug``."""
    if debug or os.environ.get("FLEET_DEBUG"):
        raise exc
    if verb == "serve":
        traceback.print_exception(exc, file=sys.stderr)
    if json_output:
        print(json.dumps({"error": {"kind": "internal", "message": str(exc)}}))
    print(
        f"fleet {verb}: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
        file=sys.stderr,
    )
    return 1
