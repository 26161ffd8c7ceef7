"""``fleet serve``: one supervisor per session behind a control socket, started on demand.

The daemon holds an exclusive ``flock`` on ``supervisor.lock`` for its whole life, so two
commands racing to start one cannot both bind: the loser exits and the winner serves. The
control token is a fresh random secret in a 0600 file, never on argv.

While it runs, the daemon keeps a registry snapshot (``registry.json``, 0600) of its live
children and unresolved worktrees, rewritten within :data:`SNAPSHOT_INTERVAL` of a change. A
clean exit removes it (or keeps only what is still unresolved). A daemon that starts and finds
one was left by a supervisor that died: it warns once (the first command prints the warning),
lists the stale children in ``peek``, keeps their logs and worktrees, continues the key
numbering after theirs, and adopts each kept worktree so ``fleet stop`` can copy it back.
"""

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil
import trio

import ipc
from orchestrator._config import Config, SessionPaths
from orchestrator._errors import Refused
from orchestrator._records import ChildRecord, State, clip
from orchestrator.control._durable import Durability, open_durability
from orchestrator.control._server import ControlServer
from orchestrator.core._supervisor import Supervisor, open_supervisor
from orchestrator.workspace._worktree import Snapshot

log = logging.getLogger(__name__)

#: The registry snapshot is rewritten at most this often (seconds), and only when it changed.
SNAPSHOT_INTERVAL: Final = 0.25


@contextlib.contextmanager
def session_lock(path: Path) -> Iterator[None]:
    """Hold the session's supervisor lock, or raise :class:`Refused`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused(
                f"serve: another supervisor already runs for {path.parent.name}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


async def serve(
    config: Config, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the supervisor and its control socket until ``shutdown`` or SIGTERM/SIGINT."""
    paths = config.paths
    ipc.ensure_private_dir(config.home)
    ipc.ensure_private_dir(config.home / "sessions")
    ipc.ensure_private_dir(paths.root)
    with session_lock(paths.lock):
        token = secrets.token_hex(32)
        ipc.write_private(paths.control_token, token.encode())
        listener = ipc.Listener(paths.control_socket)
        stale = load_stale(paths)
        durability: Durability | None = None
        try:
            async with open_supervisor(config) as sup:
                sup.secrets.add(token)
                if stale is not None:
                    adopt_stale(sup, stale)
                server = ControlServer(sup=sup, token=token)
                async with trio.open_nursery() as nursery:
                    durability = open_durability(sup, nursery)
                    server.extra_ops.update(durability.ops())
                    nursery.start_soon(keep_registry, sup)
                    await nursery.start(listener.serve, server.handle_connection)
                    nursery.start_soon(_on_signals, server.shutdown)
                    if config.idle_exit_s > 0:
                        nursery.start_soon(exit_when_idle, server, config.idle_exit_s)
                    task_status.started()
                    await server.shutdown.wait()
                    nursery.cancel_scope.cancel()
            # Every child is stopped: only unresolved worktrees are left to remember.
            final = registry_snapshot(sup, clean=True)
            if final["children"]:
                ipc.write_private(paths.registry, json.dumps(final, sort_keys=True).encode())
            else:
                paths.registry.unlink(missing_ok=True)
        finally:
            if durability is not None:  # every handoff of the stop is in it
                durability.journal.close()
            with trio.CancelScope(shield=True):
                await listener.aclose()
            with contextlib.suppress(OSError):
                paths.control_token.unlink()


def registry_snapshot(sup: Supervisor, *, clean: bool = False) -> dict[str, Any]:
    """What a later supervisor of the session needs if this one dies: every live child and
    every retired one with an unresolved worktree, and the next free key."""
    children = []
    for key, record in sup.all_records().items():
        snapshot = sup.worktrees.snapshots.get(key)
        if key not in sup.registry.records and snapshot is None:
            continue
        worktree = None if snapshot is None else snapshot.as_json()
        children.append(
            {
                "key": key,
                "name": record.name,
                "agent": record.agent,
                "mode": record.mode,
                "backend": record.backend,
                "task": clip(record.task, 200),
                "state": str(record.state),
                "pid": record.pid,
                "log": str(sup.paths.logs / f"{key}.log"),
                "worktree": worktree,
            }
        )
    return {
        "version": 1,
        "pid": os.getpid(),
        "clean": clean,
        "next_key": sup.registry._next,
        "children": children,
    }


async def keep_registry(sup: Supervisor) -> None:
    """Rewrite the registry snapshot whenever it changed, at most every SNAPSHOT_INTERVAL.

    A write that fails (a full disk) is retried on every tick until it succeeds, so the file
    never stays behind the fleet once space returns; the supervisor goes on meanwhile, and
    warns once per outage.
    """
    written = b""
    failing = False
    while True:
        data = json.dumps(registry_snapshot(sup), sort_keys=True).encode()
        if data != written:
            try:
                ipc.write_private(sup.paths.registry, data)
            except OSError as exc:
                if not failing:
                    log.warning(
                        "registry snapshot %s not written (%s); retrying",
                        sup.paths.registry,
                        exc.strerror or exc,
                    )
                failing = True
            else:
                written, failing = data, False
        await trio.sleep(SNAPSHOT_INTERVAL)


def _still_running(pid: object, loadout: Path) -> bool:
    """Whether *pid* is still that child (its argv names its loadout: pids get reused)."""
    if not isinstance(pid, int):
        return False
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and str(loadout) in process.cmdline()
    except psutil.Error:
        return False


def load_stale(paths: SessionPaths) -> dict[str, Any] | None:
    """The registry snapshot a previous supervisor left (we hold the session lock, so it has
    ended), each child marked ``running`` and ``recoverable``; ``None`` if there is none."""
    try:
        data = json.loads(paths.registry.read_bytes())
        children = [dict(child) for child in data["children"]]
        for child in children:
            worktree = child.get("worktree") or {}
            child["running"] = _still_running(
                child.get("pid"), paths.loadouts / f"{child['key']}.json"
            )
            child["recoverable"] = bool(worktree) and Path(worktree["path"]).is_dir()
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return {"pid": None, "clean": False, "next_key": 1, "children": [], "error": str(exc)}
    return {**data, "children": children}


def adopt_stale(sup: Supervisor, stale: dict[str, Any]) -> None:
    """Report a previous supervisor's children and make their kept worktrees recoverable."""
    # Keys continue after the old ones: a new a1 must not reuse the old a1's log or worktree.
    sup.registry._next = max(sup.registry._next, int(stale.get("next_key") or 1))
    children = stale["children"]
    for child in children:
        worktree = child["worktree"]
        if not child["recoverable"] or child["running"]:
            continue
        key = child["key"]
        sup.registry.retired[key] = ChildRecord(
            key=key,
            name=child["name"],
            agent=child["agent"],
            mode=child["mode"],
            task=child["task"],
            workspace=worktree["path"],
            backend=child["backend"],
            state=State.FAILED,
            error=f"its supervisor (pid {stale['pid']}) ended; the worktree was kept",
        )
        sup.worktrees.snapshots[key] = Snapshot.from_json(worktree)
    sup.stale = [
        {
            "key": c["key"],
            "name": c["name"],
            "agent": c["agent"],
            "state": c["state"],
            "pid": c["pid"],
            "log": c["log"],
            "worktree": (c["worktree"] or {}).get("path"),
            "recoverable": c["recoverable"],
            "running": c["running"],
        }
        for c in children
    ]
    if "error" in stale:
        sup.warnings.append(
            f"the registry snapshot {sup.paths.registry} of a previous supervisor is "
            f"unreadable ({stale['error']}); its children's logs and worktrees are under "
            f"{sup.paths.root}"
        )
    elif children:
        how = "stopped" if stale.get("clean") else "died"
        listed = ", ".join(f"{c['key']} ({c['agent']}, {c['state']})" for c in children)
        line = (
            f"the previous supervisor of this session (pid {stale['pid']}) {how} leaving "
            f"{listed}; their logs are kept in {sup.paths.logs}"
        )
        kept = [c["key"] for c in children if c["recoverable"] and not c["running"]]
        if kept:
            line += (
                f"; the worktrees of {', '.join(kept)} are kept (fleet stop KEY copies one "
                "back, fleet discard KEY deletes it)"
            )
        running = [str(c["pid"]) for c in children if c["running"]]
        if running:
            line += f"; still running: pid {', '.join(running)} (stop them with kill)"
        sup.warnings.append(line)


async def exit_when_idle(server: ControlServer, idle_s: float) -> None:
    """Shut down once the supervisor has held nothing and served nothing for *idle_s*.

    A supervisor with live or retained children (idle ones too), an unread note, an open
    question or an unresolved worktree stays; so does one that is serving a request.
    """
    sup = server.sup
    quiet_since = trio.current_time()
    while True:
        await trio.sleep(min(max(idle_s / 4, 0.05), 5.0))
        now = trio.current_time()
        if server.serving or not sup.holds_nothing():
            quiet_since = now
            continue
        since = max(quiet_since, server.last_request)
        if now - since >= idle_s:
            log.warning("no child and no request for %g s: the supervisor exits", idle_s)
            server.shutdown.set()
            return


async def _on_signals(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            shutdown.set()
            return
