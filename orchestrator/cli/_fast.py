"""The ``fleet`` entry point, and its warm verbs: ``peek`` and ``wait`` on a running supervisor.

An LLM parent calls ``fleet peek --json`` and ``fleet wait --timeout 0`` in a loop (DESIGN §13:
a warm verb <= 3x ``python -c pass``). The full command line (:mod:`._main`: argparse with every
verb, the attrs configuration, a ``git rev-parse``, a ping and the request on two connections)
costs four times an interpreter's start. So :func:`main` first reads those two verbs by hand,
finds the session from the environment (:mod:`._locate`) and sends the ping and the request on
one blocking connection (:mod:`orchestrator.control._blocking`), importing none of trio,
attrs, cattrs, argparse or rich (yaml only to read a ``config.yaml``). Anything else — another
verb, ``--help``, an option it does not know, a command line argparse would refuse, no
supervisor answering, what :mod:`._locate` is unsure of — goes to the full command line before
anything was sent, and the full path decides. What it prints
and the exit code are the full path's, byte for byte (``tests/orchestrator/cli/test_fast.py``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

from orchestrator._digests import drift_warning, drifted, start_digests
from orchestrator._errors import FleetError, TimedOut
from orchestrator._runtime import session_runtime
from orchestrator.cli import _locate
from orchestrator.cli._outcome import (
    WaitTimedOut,
    error_code,
    exit_with,
    internal_error_code,
    note_failed,
)
from orchestrator.control._blocking import Connection, read_token
from orchestrator.control._client import WAIT_SLICE, op_timeout

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn


class WarmVerb:
    """A ``peek`` or ``wait`` command line this module runs itself."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.json = False
        self.debug = False
        self.session: str | None = None
        self.agents: list[str] = []
        self.all = False
        self.timeout: float | None = None


def parse(argv: Sequence[str]) -> WarmVerb | None:
    """*argv* as a warm verb, or ``None`` for anything argparse might read otherwise."""
    found: WarmVerb | None = None
    json_output = debug = False
    session: str | None = None
    positionals = "none"  # then "open", then "closed" once an option follows them
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        name, eq, value = arg.partition("=")
        verb = found.verb if found is not None else ""
        if arg == "--json":
            json_output = True
        elif arg == "--debug":
            debug = True
        elif name == "--session" or (verb == "wait" and name == "--timeout"):
            if not eq:
                if index >= len(argv):
                    return None
                value = argv[index]
                index += 1
            if value.startswith("-"):
                return None
            if name == "--session":
                session = value
            else:
                assert found is not None  # noqa: S101 - only wait has --timeout
                try:
                    found.timeout = float(value)
                except ValueError:
                    return None
                if not math.isfinite(found.timeout) or found.timeout < 0:
                    return None
        elif verb == "wait" and arg == "--all":
            assert found is not None  # noqa: S101 - a verb was found
            found.all = True
        elif verb == "peek" and arg == "--locks":
            pass  # accepted by the full parser, and read by nothing
        elif arg.startswith("-"):
            return None  # --help, --watch, --, an abbreviation, a global setting
        elif found is None:
            if arg not in {"peek", "wait"}:
                return None
            found = WarmVerb(arg)
            continue
        else:
            if positionals == "closed":
                return None  # argparse refuses positionals split by an option
            positionals = "open"
            found.agents.append(arg)
            continue
        if positionals == "open":
            positionals = "closed"
    if found is None:
        return None
    found.json, found.debug, found.session = json_output, debug, session
    return found


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``fleet``: a warm verb here, everything else on the full command line."""
    args = sys.argv[1:] if argv is None else list(argv)
    if os.environ.get("FLEET_CHILD") == "1":
        refuse_in_child(args)
    warm = parse(args)
    if warm is not None:
        try:
            connection = _connect(warm)
        except (_locate.Unsure, FleetError, OSError, ValueError):
            # Nothing was sent: the full path decides, starts a supervisor, names the error.
            pass
        except KeyboardInterrupt:
            sys.exit(130)
        else:
            exit_with(lambda: _run(warm, connection))
    from orchestrator.cli._main import main as full  # noqa: PLC0415 - only when needed

    full(args)


def refuse_in_child(args: Sequence[str]) -> NoReturn:
    """Every verb refuses inside a fleet child: ``fleet mcp``, ``serve`` or any control verb
    there would act with the parent's powers. A child delegates through its own IPC."""
    verb = next((a for a in args if not a.startswith("-")), "")
    where = f"fleet {verb}" if verb else "fleet"
    message = (
        f"{where}: refused inside a fleet child: a child reaches its parent only through "
        "its own tools (subagent, ask_parent)"
    )
    if "--json" in args:
        print(json.dumps({"error": {"kind": "refused", "message": message}}))
    print(message, file=sys.stderr)
    sys.exit(4)


def _connect(warm: WarmVerb) -> Connection:
    """A connection to the session's supervisor that answered a ping (and so got nothing
    else yet); :class:`_locate.Unsure` or a :class:`FleetError` when the full path must
    decide. A supervisor started with other settings than this command's is one stderr line,
    as on the full path (``_daemon_client.warn_if_drifted``)."""
    env = os.environ
    home = _locate.home(env)
    settings = _locate.start_settings(env, _locate.file_settings(home))
    workspace = _locate.repo_root(os.getcwd(), env)
    root = os.path.join(home, "sessions", _locate.session_of(warm.session, workspace, env))
    runtime = session_runtime(root, env)  # SessionPaths.runtime, without attrs
    token = read_token(runtime / "control.token")
    connection = Connection.open(os.fspath(runtime / "control.sock"), token, timeout=5.0)
    try:
        answer = connection.request("ping", {}, timeout=5.0)
    except FleetError:
        connection.close()
        raise
    names = drifted(start_digests(settings, env, token), answer.get("settings", {}))
    if names:
        print(drift_warning(names, answer.get("pid", "?")), file=sys.stderr)
    return connection


def _run(warm: WarmVerb, connection: Connection) -> int:
    try:
        if warm.verb == "peek":
            data = connection.request("peek", {"agents": warm.agents}, timeout=op_timeout("peek"))
            _out(warm, data, _peek_text)
            return 0
        data = _wait(warm, connection)
        _out(warm, data, _settled_text)
        return 1 if any(note_failed(n) for n in data["settled"]) else 0
    except BrokenPipeError:
        raise
    except FleetError as exc:
        return error_code(exc, warm.verb, json_output=warm.json)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return internal_error_code(exc, warm.verb, json_output=warm.json, debug=warm.debug)
    finally:
        connection.close()


def _wait(warm: WarmVerb, connection: Connection) -> dict[str, Any]:
    """``fleet wait``: bounded slices on the one connection until something settles."""
    timeout = warm.timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = WAIT_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
        payload = {
            "agents": warm.agents,
            "all": warm.all,
            "timeout": min(WAIT_SLICE, remaining),
            "progress": True,
        }
        try:
            data = connection.request("wait", payload, timeout=op_timeout("wait"))
        except TimedOut:  # a supervisor from before progress rows
            data = {"timed_out": True}
        if not data.get("timed_out"):
            return data
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimedOut(
                f"nothing settled within {timeout:g} s (try again, or fleet peek)", data
            )


def _out(warm: WarmVerb, data: Any, human: Callable[[Any], str]) -> None:
    if warm.json:
        print(json.dumps(data, indent=None if not sys.stdout.isatty() else 2))
    else:
        text = human(data)
        if text:
            print(text)


def _peek_text(data: Any) -> str:
    import shutil  # noqa: PLC0415 - the human table only

    from orchestrator.cli import _render  # noqa: PLC0415

    return _render.peek_table(data, width=shutil.get_terminal_size().columns)


def _settled_text(data: Any) -> str:
    from orchestrator.cli import _render  # noqa: PLC0415 - the human text only

    return _render.settled_text(data["settled"])
