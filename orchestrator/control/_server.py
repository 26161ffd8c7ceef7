"""The control socket: the same framing and auth as children, owner ``control``.

:class:`ControlServer` maps ``Control{op, args}`` requests onto the :class:`Supervisor` API and
answers with a :class:`ipc.Reply` whose ``data`` is the CLI's ``--json`` shape; a refusal
carries ``data.kind`` so the client can raise the same :class:`FleetError` subclass.
:mod:`orchestrator.control._client` is the client side used by every CLI verb.
"""

import contextlib
import logging
import os
import shutil
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs
import trio

import ipc
from orchestrator._config import agent_dir_entries
from orchestrator._digests import start_digests
from orchestrator._errors import FleetError, OperationFailed, TimedOut, UsageError
from orchestrator._records import ACTIVE, SpawnRequest, State
from orchestrator.control._args import str_arg, strs_arg
from orchestrator.control._client import CONTROL_OWNER, WAIT_SLICE, ignore_event, refusal_frame
from orchestrator.control._land import land_op, queue_op
from orchestrator.control._map import map_op
from orchestrator.control._review import review_accept, review_apply, review_diff, review_revert
from orchestrator.coordination._democracy import DEFAULT_DEADLINE
from orchestrator.coordination._paper import PARENT
from orchestrator.core._supervisor import Supervisor
from orchestrator.launch._kill import in_child_tree
from orchestrator.launch._tmux import TmuxLauncher, TmuxPane

log = logging.getLogger(__name__)

Op = Callable[[Supervisor, Mapping[str, Any]], Awaitable[dict[str, Any]]]


def _agent_row(record: Any) -> dict[str, Any]:
    row = {
        "key": record.key,
        "name": record.name,
        "agent": record.agent,
        "mode": record.mode,
        "state": str(record.state),
    }
    if record.state is State.FAILED:  # failed at launch: say why, spawn exits 1
        row["error"] = record.error
    return row


async def _spawn(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    raw = args.get("requests")
    if not isinstance(raw, list) or not raw:
        raise UsageError("spawn: requests must be a non-empty list")
    requests = [
        SpawnRequest.from_mapping(entry) if isinstance(entry, dict) else _bad_entry()
        for entry in raw
    ]
    for request in requests:
        _cli_present(sup, request)
    records = await sup.spawn(requests)
    return {"agents": [_agent_row(r) for r in records]}


#: The agent CLI each backend runs (``$FLEET_<BACKEND>_BIN`` overrides it, as in the child).
CLI_BACKENDS: Final = {"pi": "pi", "claude": "claude", "codex": "codex"}


def _cli_present(sup: Supervisor, request: SpawnRequest) -> None:
    """Refuse a spawn whose agent CLI is not on this host: the child would fail only at its
    first turn, after ``spawn`` had said all was well (a Ray node may have what we lack)."""
    definition = sup.agents().get(request.agent)
    backend = request.backend or (definition.backend if definition is not None else "")
    surface = request.surface or sup.config.surface
    if backend not in CLI_BACKENDS or surface == "ray":
        return
    variable = f"FLEET_{backend.upper()}_BIN"
    binary = os.environ.get(variable) or CLI_BACKENDS[backend]
    if shutil.which(binary) is None:
        raise OperationFailed(
            f"spawn: backend {backend}: {binary} is not on PATH (install it, or point "
            f"{variable} at it and restart the supervisor: fleet serve --stop)"
        )


def _bad_entry() -> SpawnRequest:
    raise UsageError("spawn: each batch entry must be a JSON object")


async def _peek(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """The fleet; with ``recent`` (and named agents), each one's recent activities too."""
    refs = strs_arg(args, "agents")
    seen = sup.peek(refs) | {"queue": sup.queue.show()}
    if args.get("recent") is True and refs:
        records = [sup.registry.find(ref) for ref in refs]
        seen["recent"] = {r.key: r.recent_activities() for r in records}
    return seen


async def _usage(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    keys = [sup.registry.find(ref).key for ref in strs_arg(args, "agents")]
    return sup.spend.report(keys)


async def _wait(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """Settle notes; with ``progress``, a timeout is a result too (``timed_out``), and both
    carry the open questions (oldest first) and a progress row per working child."""
    timeout = args.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
    ):
        raise UsageError("wait: timeout must be a number of seconds >= 0")
    refs = strs_arg(args, "agents")
    try:
        settled = await sup.wait(refs, every=bool(args.get("all")), timeout=timeout)
    except TimedOut:
        if not args.get("progress"):
            raise
        return {"timed_out": True, **_progress(sup, refs), "settled": []}
    if not args.get("progress"):
        return {"settled": settled}
    return {"timed_out": False, **_progress(sup, refs), "settled": settled}


def _progress(sup: Supervisor, refs: list[str]) -> dict[str, Any]:
    """The open questions, oldest first, and each working child's row (of *refs*, or all)."""
    records = [sup.registry.find(ref) for ref in refs] if refs else list(sup.registry.live())
    return {
        "questions": [{"id": q.id, "key": q.key, "text": q.text} for q in sup.questions.values()],
        "working": [r.progress_row() for r in records if r.state in ACTIVE or r.queued],
    }


async def _report(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    offset = args.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise UsageError("report: offset must be a whole number >= 0")
    part = str_arg(args, "part", required=False) or "report"
    return await sup.report(str_arg(args, "agent"), part, offset)


async def _steer(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    record = await sup.steer(str_arg(args, "agent"), str_arg(args, "text"))
    return {"key": record.key, "state": str(record.state)}


async def _pause(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    record, settled = await sup.pause(str_arg(args, "agent"))
    return {"key": record.key, "state": str(record.state), "settled": settled}


async def _resume(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    record = await sup.prompt(str_arg(args, "agent"), str_arg(args, "text"))
    return {"key": record.key, "state": str(record.state)}


async def _ask(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    ref = str_arg(args, "agent")
    answer = await sup.ask(ref, str_arg(args, "text"))
    return {"key": sup.registry.find(ref).key, "answer": answer}


async def _answer(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    question = sup.answer(str_arg(args, "question"), str_arg(args, "text"))
    return {"question": question.id, "key": question.key}


async def _stop(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    hold = args.get("hold", False)
    if not isinstance(hold, bool):
        raise UsageError("stop: hold must be true or false")
    if args.get("all"):
        return {"handoffs": await sup.stop_all(hold=hold)}
    refs = strs_arg(args, "agents")
    if not refs:
        raise UsageError("stop: name at least one agent, or pass --all")
    return {"handoffs": await sup.stop(refs, hold=hold)}


async def _discard(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"key": await sup.discard(str_arg(args, "agent")), "discarded": True}


async def _logs(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    tail = args.get("tail", 8192)
    if not isinstance(tail, int) or tail < 0:
        raise UsageError("logs: tail must be a whole number of characters")
    return sup.logs(str_arg(args, "agent"), tail)


async def _agents(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    scope = str_arg(args, "scope", required=False) or None
    return {
        "agents": [
            {
                "name": d.name,
                "description": d.description,
                "mode": d.mode,
                "tools": list(d.tools),
                "backend": d.backend,
                "source": d.source,
                "path": str(d.path),
                "warnings": list(d.warnings),
            }
            for d in sup.agents(scope).values()
        ]
    }


async def _mode(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"mode": sup.set_mode(str_arg(args, "name", required=False) or None)}


async def _configure(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``--max-subagents`` / ``--lane`` / ``--agent-dirs`` given to any command to the
    running supervisor."""
    cap, lane = args.get("max_subagents"), args.get("lane")
    if args.get("agent_dirs") is not None:
        sup.set_agent_dirs(agent_dir_entries(args["agent_dirs"], sup.config.workspace))
    if cap is not None:
        if not isinstance(cap, int):
            raise UsageError("max_subagents must be a whole number")
        sup.capacity.set_cap(cap)
    if lane is not None:
        if not isinstance(lane, int):
            raise UsageError("lane must be a whole number")
        sup.lane.set_capacity(lane)
    return {"cap": sup.capacity.cap, "lane": sup.lane.capacity, "agent_dirs": sup.agent_dirs}


async def _ping(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"session": sup.config.session, "pid": os.getpid(), "warnings": sup.warnings}


async def _attach(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """Where ``fleet attach`` goes: a child's tmux window, or the fleet's tmux session."""
    ref = str_arg(args, "agent", required=False)
    if not ref:
        launcher = sup.launchers.get("tmux")
        if not isinstance(launcher, TmuxLauncher):
            raise UsageError(
                "attach: no child runs in the fleet's tmux session (spawn one with --surface tmux)"
            )
        return await launcher.attach_target()
    run = sup.run_for(ref)
    if isinstance(run.launched, TmuxPane):
        return run.launched.attach_target()
    surface = run.record.surface
    if surface == "cmux":
        raise UsageError(f"attach: {run.key} runs in a cmux surface (switch to it in cmux)")
    if surface.startswith("tmux"):
        raise UsageError(f"attach: {run.key} has no tmux window yet (retry in a moment)")
    raise UsageError(
        f"attach: {run.key} runs as a plain process, not in tmux (spawn with --surface tmux)"
    )


async def _discuss(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """The parent's side of the discussion paper; it writes and reads as ``parent``."""
    action = str_arg(args, "action")
    if action in {"ask", "answer"}:
        text = str_arg(args, "text")
        if action == "ask":
            reply = await sup.paper.ask(
                PARENT, text, to=str_arg(args, "to", required=False) or None
            )
        else:
            reply = await sup.paper.answer(PARENT, str_arg(args, "question"), text)
        # The new id comes first; news addressed to the parent may follow it.
        return {"id": reply.split(maxsplit=1)[0], "text": reply}
    if action == "list":
        listed = await sup.paper.list(
            PARENT,
            since=str_arg(args, "since", required=False) or None,
            question=str_arg(args, "question", required=False) or None,
        )
        return {
            "entries": [attrs.asdict(entry) for entry in listed.entries],
            "omitted": listed.omitted,
            "latest": listed.latest,
            "text": listed.text,
        }
    raise UsageError(f"discuss: action {action!r} is not ask, answer or list")


async def _vote(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """Start a democracy round, wait one slice for its outcome, or abort it."""
    action = str_arg(args, "action")
    if action == "start":
        deadline = args.get("deadline")
        running = await sup.democracy.start(
            args.get("request"),
            agents=strs_arg(args, "agents"),
            voters=args.get("voters"),
            deadline=DEFAULT_DEADLINE if deadline is None else deadline,
            model=str_arg(args, "model", required=False) or None,
        )
        return {"round": running.id, "status": "running", "voters": running.voters}
    if action == "wait":
        round_id, timeout = str_arg(args, "round"), args.get("timeout", WAIT_SLICE)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise UsageError("vote: timeout must be a number of seconds")
        outcome = await sup.democracy.wait(round_id, min(max(timeout, 0.0), WAIT_SLICE))
        return {"round": round_id, "status": "running"} if outcome is None else outcome.to_json()
    if action == "abort":
        outcome = await sup.democracy.abort(str_arg(args, "round", required=False) or None)
        return outcome.to_json()
    raise UsageError(f"vote: action {action!r} is not start, wait or abort")


async def _moderator_brief(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"text": await sup.brief()}


OPS: Final[dict[str, Op]] = {
    "spawn": _spawn,
    "peek": _peek,
    "usage": _usage,
    "wait": _wait,
    "report": _report,
    "steer": _steer,
    "pause": _pause,
    "resume": _resume,
    "ask": _ask,
    "answer": _answer,
    "stop": _stop,
    "discard": _discard,
    "logs": _logs,
    "agents": _agents,
    "mode": _mode,
    "ping": _ping,
    "discuss": _discuss,
    "vote": _vote,
    "brief": _moderator_brief,
    "attach": _attach,
    "configure": _configure,
    "diff": review_diff,
    "accept": review_accept,
    "revert": review_revert,
    "apply": review_apply,
    "map": map_op,
    "land": land_op,
    "queue": queue_op,
}


#: The namespaces a control peer must share with the supervisor: every sandbox of every fleet
#: (bwrap's ``--unshare-user --unshare-pid``) has its own of both.
NAMESPACES: Final = ("user", "pid")


def other_namespace(pid: int) -> str | None:
    """Why the process *pid* lives in another user or pid namespace than ours (a sandboxed
    process of any fleet), or ``None`` when it shares both. Unreadable counts as other."""
    for kind in NAMESPACES:
        try:
            ours = os.stat(f"/proc/self/ns/{kind}")
        except OSError:
            continue  # a kernel without this namespace: nothing can be in another one
        try:
            theirs = os.stat(f"/proc/{pid}/ns/{kind}")
        except OSError as exc:
            return f"pid {pid}'s {kind} namespace is unreadable ({exc.strerror})"
        if (theirs.st_ino, theirs.st_dev) != (ours.st_ino, ours.st_dev):
            return f"pid {pid} is in another {kind} namespace (a sandboxed process)"
    return None


#: What a refused control peer is told (the reason, with its pids, goes to the journal only).
REFUSAL: Final = (
    "the control socket serves the parent only, not a fleet child or a sandboxed process "
    "(run fleet verbs from the parent's shell)"
)


@attrs.define(eq=False)
class ControlServer:
    """Serves control connections for one supervisor."""

    sup: Supervisor
    token: str
    shutdown: trio.Event = attrs.Factory(trio.Event)
    extra_ops: dict[str, Op] = attrs.Factory(dict)

    #: Control connections refused because their peer is inside a child's process tree.
    refused: int = 0
    #: When the last control request began or ended (``trio.current_time()``): the idle exit
    #: counts from it.
    last_request: float = 0.0
    #: Requests being served now (a ``wait`` may last long: it is not idleness).
    serving: int = 0

    def _lookup(self, owner: str) -> str | None:
        return self.token if owner == CONTROL_OWNER else None

    async def _from_a_child(self, stream: trio.SocketStream) -> str | None:
        """Why the peer of *stream* is one of our children (or inside one's tree), or a
        sandboxed process of any fleet (another user or pid namespace), or None.

        The socket serves the parent only: a child holding the control token (read from
        disk by an unsandboxed child, or leaked) must not spawn, stop or shut down anything,
        nor may any sandboxed process of another fleet of the user, token or not.
        """
        so_peercred = getattr(socket, "SO_PEERCRED", None)
        if so_peercred is None:
            return None  # macOS: the Seatbelt profile keeps children off the socket
        try:
            creds = stream.socket.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
        except OSError as exc:
            return f"its peer credentials are unreadable ({exc.strerror})"
        pid = struct.unpack("3i", creds)[0]
        if pid <= 0:
            return "its peer has no pid in our pid namespace"
        foreign = other_namespace(pid)
        if foreign is not None:
            return foreign
        children = {run.launched.pid for run in self.sup.runs.values() if run.launched}
        children.update(r.pid for r in self.sup.registry.live() if r.pid)
        children.discard(None)
        return await trio.to_thread.run_sync(
            in_child_tree, pid, frozenset(children), self.sup.config.session
        )

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        reason = await self._from_a_child(stream)
        if reason is not None:
            self.refused += 1
            log.warning("refused a control connection: %s (%d so far)", reason, self.refused)
            self.sup.reject("control-refused", CONTROL_OWNER, {"reason": reason})
            # The refusal is answered, not only hung up on: a verb that was refused fails at
            # once instead of waiting for a supervisor that answers. Its words name no pid.
            with (
                trio.move_on_after(1.0),
                contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                await stream.send_all(refusal_frame(REFUSAL))
            await stream.aclose()
            return
        try:
            channel, hello = await ipc.accept_hello(stream, self._lookup)
        except ipc.HandshakeError:
            return
        await channel.reply(
            hello.corr, ipc.Reply(ok=True, data={"session": self.sup.config.session})
        )
        await channel.serve(self._handle, ignore_event)

    async def _handle(self, envelope: ipc.Envelope) -> ipc.Message:
        body = envelope.body
        if not isinstance(body, ipc.Control):
            return ipc.Reply(ok=False, error=f"{envelope.type} is not a control request")
        if body.op == "shutdown":
            self.shutdown.set()
            return ipc.Reply(ok=True, data={"shutdown": True})
        op = self.extra_ops.get(body.op) or OPS.get(body.op)
        if op is None:
            return ipc.Reply(
                ok=False, error=f"unknown control op {body.op!r}", data={"kind": "usage"}
            )
        # Every reply is scrubbed of every secret the supervisor holds: a child's report, log
        # tail or failure may quote a sibling's token or the control token.
        scrub = self.sup.secrets.scrub_value
        self.serving += 1
        self.last_request = trio.current_time()
        try:
            data = await op(self.sup, body.args)
        except FleetError as exc:
            return ipc.Reply(ok=False, error=scrub(str(exc)), data={"kind": exc.kind})
        finally:
            self.serving -= 1
            self.last_request = trio.current_time()
        if body.op in {"peek", "ping"}:
            data = {**data, "control": {"refused": self.refused}}
        if body.op == "ping":
            # What this supervisor started with, so a verb can say when its own differ.
            data["settings"] = start_digests(self.sup.config, os.environ, self.token)
        return ipc.Reply(ok=True, data=scrub(data))
