"""The supervisor's copy of a remote child's resume context (:mod:`orchestrator.launch._context`).

A child on a Ray node keeps its backend's session store on its node, which may be gone by the
time the child is revived. So at each turn end, before the turn's settle note goes out, the
supervisor keeps what the backend resumes from: as the child sent it with its ``Settled``
(:func:`keep_sent`: the builtin agent's transcript, when it fits the frame), else fetched
from its node (:func:`fetch_context`), and keeps it in the child's own scratch place
in the state directory (``scratch/KEY``, 0700; laid out as the node's scratch, so a revive's
checks read it as a local child's), replacing the copy before. A context over the cap is not
kept: ``scratch/KEY/context-refused`` says why in one line and the child cannot be revived. A
revive ships the kept copy into the new node directory (``core._launching``).
"""

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

import ipc
from orchestrator.governance._diagnostics import RunLog
from orchestrator.launch import _context
from orchestrator.launch._ray_launched import LaunchedRay

__all__ = [
    "FETCH_TIMEOUT_S",
    "LATER_FETCH_S",
    "LATE_WRITERS",
    "fetch_context",
    "keep_sent",
    "kept_context",
    "refusal",
]

#: How long a turn end waits for its context to come from its node before it settles anyway.
FETCH_TIMEOUT_S = 30.0
#: Backends that may write their session a moment after a turn ended (the agent CLIs), and
#: the pauses before each further fetch after a turn end (at 1 s and 5 s).
LATE_WRITERS = frozenset({"claude", "codex", "pi"})
LATER_FETCH_S = (1.0, 4.0)


async def fetch_context(
    place: Path,
    launched: LaunchedRay,
    backend: str,
    resume: str,
    *,
    log: RunLog,
    ended: Callable[[], bool],
) -> None:
    """Fetch the context of the child *launched* from its node and keep it at *place*; a
    failure is one line in its run log (the copy before stays, or, over the cap, goes).
    Nothing is written once *ended* says the child is ending (its place goes with it)."""
    needs = _context.wants(backend, resume)
    if not needs:
        return
    try:
        with trio.fail_after(FETCH_TIMEOUT_S):
            got = await launched.context(backend, resume)
    except Exception as exc:  # the node or its actor is gone, or slow: the last copy stays
        log.write(f"context not fetched from its node: {type(exc).__name__}: {exc}")
        return
    await _keep_or_refuse(place, got, needs, log=log, ended=ended)


async def keep_sent(
    place: Path,
    sent: Mapping[str, Any],
    backend: str,
    resume: str,
    *,
    log: RunLog,
    ended: Callable[[], bool],
) -> None:
    """Keep at *place* the context the child sent with its turn's ``Settled`` (*sent*: a name
    below its scratch → its text), checked as a fetched one is: only its backend's files,
    within the caps; anything else is refused in one line and the child cannot be revived
    (what it sends is its own scratch's, so it can only cost itself that)."""
    needs = _context.wants(backend, resume)
    if not needs:
        return
    await _keep_or_refuse(place, _as_files(sent), needs, log=log, ended=ended)


def _as_files(sent: Mapping[str, Any]) -> dict[str, bytes] | str:
    """*sent*'s texts as the files they are, or the one line why they are not."""
    files: dict[str, bytes] = {}
    for name, value in sent.items():
        data = None
        if isinstance(value, str):
            with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate in it
                data = value.encode()
        if data is None:
            return f"its context's {str(name)[:64]!r} is not text"
        files[str(name)] = data
    return files


async def _keep_or_refuse(
    place: Path,
    got: dict[str, bytes] | str,
    needs: list[_context.Want],
    *,
    log: RunLog,
    ended: Callable[[], bool],
) -> None:
    """Keep *got* (files, or the one line why they are not sent) at *place*, replacing the
    copy before; a context that is not one is refused there, in one line."""
    if ended():
        return
    why = ""
    if isinstance(got, str):
        why = got
    else:
        try:
            await trio.to_thread.run_sync(_keep, place, got, needs)
        except (ValueError, _context.ContextRefused) as exc:
            why = str(exc)
        except OSError as exc:  # a full state directory: the copy before stays
            log.write(f"context not kept: {exc.strerror or exc}")
    if why:
        line = f"{why}; it cannot be revived"
        log.write(f"context not kept: {line}")
        await trio.to_thread.run_sync(_refuse, place, line)


def _keep(place: Path, files: dict[str, bytes], needs: list[_context.Want]) -> None:
    ipc.ensure_private_dir(place.parent)
    _context.keep(str(place), files, needs)


def _refuse(place: Path, line: str) -> None:
    ipc.ensure_private_dir(place.parent)
    _context.refuse(str(place), line)


def refusal(place: Path) -> str:
    """Why the context of the remote child whose place is *place* was not kept ("" if it was)."""
    return _context.refused(str(place))


def kept_context(place: Path, backend: str, resume: str, workspace: str) -> dict[str, bytes]:
    """The context kept at *place*, as a revived remote child's new scratch gets it; a Claude
    Code session goes under the project of its new checkout (*workspace*) too, as Claude Code
    files a session by the directory it runs in, and a Pi session's header names the new
    checkout as its directory (Pi refuses a session whose directory is gone). Blocking: runs
    in a thread."""
    files = _context.read_kept(str(place), _context.wants(backend, resume))
    if backend == "pi" and workspace and "pi-session.jsonl" in files:
        files["pi-session.jsonl"] = _rehome_pi(files["pi-session.jsonl"], workspace)
    if backend == "claude" and workspace and files:
        # The longest copy is the newest: a session file is only ever appended to (an earlier
        # revive may have left the session under an older checkout's project as well).
        name, data = max(files.items(), key=lambda item: len(item[1]))
        project = re.sub(r"[^A-Za-z0-9]", "-", workspace)[:255]
        files[f"claude/home/.claude/projects/{project}/{name.rsplit('/', 1)[-1]}"] = data
    return files


def _rehome_pi(data: bytes, workspace: str) -> bytes:
    """Pi session file *data* with its header's ``cwd`` (its first line) set to *workspace*;
    as it is when that line is not a session header."""
    head, newline, rest = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        return data
    if not isinstance(header, dict) or header.get("type") != "session":
        return data
    header["cwd"] = workspace
    return json.dumps(header, separators=(",", ":")).encode() + newline + rest
