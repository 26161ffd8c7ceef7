"""The child's runtime: read the loadout, connect, hello, serve commands, run the backend.

A local child inherits its connection and loadout as descriptors (``--fd N --loadout-fd M``); a
pane's child reads a loadout file and connects to the supervisor's socket; a Ray node's child
inherits its loadout alone (``--loadout-fd M``) and dials the supervisor's door.

One turn runs at a time. Activity events are coalesced and sent at most every
:data:`EVENT_INTERVAL` seconds (tool start/end are never dropped; streamed-text updates are);
the buffer is flushed before a turn's ``settled``, behind any batch the pump is still writing,
so the parent sees every event of a turn before its ``settled``. The
process exits when the IPC connection ends.
"""

import contextlib
import functools
import logging
import os
import pathlib
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import trio

import ipc
from child._lease import Renewer, hold_lease
from child.backends import Backend, TurnAborted, TurnResult
from child.backends._egress import open_egress

if TYPE_CHECKING:
    from child._view import ActivityView

log = logging.getLogger("child")

EVENT_INTERVAL: Final = 0.1
MAX_BUFFERED_EVENTS: Final = 256
_COALESCED: Final = frozenset({"message", "tool_update", "usage", "todo"})
_KEPT: Final = frozenset({"tool_start", "tool_end"})


def make_backend(loadout: ipc.Loadout, host: "Runtime") -> Backend:
    """The backend a loadout names."""
    if loadout.backend == "builtin":
        from child.backends.builtin import BuiltinBackend  # noqa: PLC0415 - keep start-up lean

        return BuiltinBackend.from_loadout(loadout, host)
    if loadout.backend == "command":
        from child.backends._command import CommandBackend  # noqa: PLC0415

        return CommandBackend.from_loadout(loadout, host)
    if loadout.backend == "pi":
        from child.backends._pi import PiBackend  # noqa: PLC0415

        return PiBackend.from_loadout(loadout, host)
    if loadout.backend == "claude":
        from child.backends._claude import ClaudeBackend  # noqa: PLC0415

        return ClaudeBackend.from_loadout(loadout, host)
    if loadout.backend == "codex":
        from child.backends._codex import CodexBackend  # noqa: PLC0415

        return CodexBackend.from_loadout(loadout, host)
    raise ValueError(f"backend {loadout.backend!r} is not available in this child")


@attrs.define(eq=False)
class Runtime:
    """Serves the supervisor's commands and offers host services to the backend."""

    loadout: ipc.Loadout
    channel: ipc.Channel
    backend: Backend | None = None
    #: A remote child's key and leaf, renewed over the channel with its lease.
    certificate: Renewer | None = None
    _events: list[ipc.Event] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    # Held while a batch of events (and a turn's ``settled`` after the last one) is written, so
    # a turn that ends while the pump is mid-batch sends ``settled`` after that batch, never
    # between its events (trio's Lock is fair: the pump's next batch waits behind it).
    _sending: trio.Lock = attrs.Factory(trio.Lock)
    _turn: trio.CancelScope | None = None
    _busy: bool = False
    _nursery: trio.Nursery | None = None
    view: "ActivityView | None" = None
    #: Which of the loadout's ``models`` the backend runs on.
    _model: int = 0
    #: The usage of the backends replaced by a fallback; the last usage reported.
    _spent: ipc.Usage | None = None
    _last_usage: ipc.Usage | None = None

    # -- host services ------------------------------------------------------------------

    def emit(self, event: ipc.Event) -> None:
        if event.usage is not None:
            # Cumulative over the child's life: a CLI restarted on a fallback model counts
            # from zero again, so what the earlier processes spent is added back.
            event = attrs.evolve(event, usage=added(self._spent, event.usage))
            self._last_usage = event.usage
        if self.view is not None:
            self.view.on_event(event)
        if self._events and event.activity in _COALESCED:
            last = self._events[-1]
            if last.activity == event.activity and event.activity in _COALESCED:
                self._events[-1] = event
                return
        if len(self._events) >= MAX_BUFFERED_EVENTS:
            # Under a storm keep the newest of what is only shown (the parent shows the latest
            # activity); tool starts and ends are kept whole: the loop gate counts them.
            half = len(self._events) // 2
            self._events = [e for e in self._events[:half] if e.activity in _KEPT] + self._events[
                half:
            ]
        self._events.append(event)
        self._wake.set()

    async def ask_parent(self, question: str) -> str:
        answer = await self.channel.request(ipc.Question(text=question), timeout=None)
        if isinstance(answer, ipc.Answer):
            return answer.text
        return "The parent gave no answer."

    async def spawn(self, agent: str, task: str, name: str = "") -> str:
        try:
            reply = await self.channel.request(
                ipc.Spawn(agent=agent, task=task, name=name), timeout=None
            )
        except ipc.RemoteError as exc:
            return f"subagent refused: {exc}"
        if isinstance(reply, ipc.Reply):
            return str(reply.data.get("report", ""))
        return ""

    async def ownership(self, paths: Sequence[str]) -> str | None:
        try:
            await self.channel.request(ipc.Ownership(paths=list(paths)))
        except ipc.RemoteError as exc:
            return f"write refused: {exc}"
        except ipc.RequestError as exc:
            return f"write refused: ownership could not be confirmed ({exc})"
        return None

    async def discuss(self, op: str, **fields: str | None) -> str:
        message = ipc.Discuss(
            op=op,  # type: ignore[arg-type]
            text=fields.get("text") or "",
            to=fields.get("to"),
            question=fields.get("question"),
            since=fields.get("since"),
        )
        try:
            reply = await self.channel.request(message)
        except ipc.RemoteError as exc:
            return f"discuss failed: {exc}"
        return str(reply.data.get("text", "")) if isinstance(reply, ipc.Reply) else ""

    async def check_tool(self, start: ipc.Event) -> str | None:
        if self.view is not None:
            self.view.on_event(start)
        try:
            async with self._sending:
                await self._flush()  # the supervisor sees the last call's end before this start
                reply = await self.channel.request(start)
        except ipc.RemoteError as exc:
            log.info("tool check refused by the supervisor (%s); running the call", exc)
            return None
        except ipc.RequestError as exc:
            log.info("tool check got no answer (%s); running the call", exc)
            return None
        data = reply.data if isinstance(reply, ipc.Reply) else {}
        if data.get("stop"):
            raise TurnAborted(str(data["stop"]))
        refused = data.get("refused")
        return str(refused) if refused else None

    # -- event pump ----------------------------------------------------------------------

    async def _flush(self) -> None:
        """Send the buffered events; the caller holds ``_sending``."""
        batch, self._events = self._events, []
        self._wake = trio.Event()
        for event in batch:
            await self.channel.send_event(event)

    async def pump_events(self) -> None:
        while True:
            await self._wake.wait()
            async with self._sending:
                await self._flush()
            await trio.sleep(EVENT_INTERVAL)

    # -- commands ------------------------------------------------------------------------

    def immediate(self, body: ipc.Message) -> ipc.Message | None:
        """Start a turn on the reader itself, in frame order: an abort sent right behind the
        prompt then finds the turn begun, never a child that is not busy yet (through the
        handler task, the abort's task could run first and the turn would never be aborted).
        """
        if isinstance(body, (ipc.Prompt, ipc.Ask)) and self.backend is not None:
            return self._start_turn(body)
        return None  # the handler answers (a child still starting says so)

    def _start_turn(self, body: ipc.Prompt | ipc.Ask) -> ipc.Message | None:
        nursery = self._nursery
        if nursery is None:
            return None
        if self._busy:
            return ipc.Reply(ok=False, error="a turn is already running")
        self._busy = True
        nursery.start_soon(self._run_turn, body)
        return ipc.Reply(ok=True)

    async def handle(self, envelope: ipc.Envelope) -> ipc.Message:
        body = envelope.body
        if self.backend is None or self._nursery is None:
            return ipc.Reply(ok=False, error="the child is still starting")
        if isinstance(body, (ipc.Prompt, ipc.Ask)):
            return self._start_turn(body) or ipc.Reply(
                ok=False, error="the child is still starting"
            )
        if isinstance(body, ipc.Steer):
            if not self._busy:
                return ipc.Reply(ok=False, error="no turn is running to steer")
            if self.view is not None:
                self.view.on_steer(body.text)
            await self.backend.steer(body.text)
            return ipc.Reply(ok=True)
        if isinstance(body, ipc.Abort):
            if self._busy:
                await self.backend.abort()
            return ipc.Reply(ok=True, data={"working": self._busy})
        if isinstance(body, ipc.Shutdown):
            if self._busy:
                await self.backend.abort()
            self.channel.close("shutdown")
            return ipc.Reply(ok=True)
        return ipc.Reply(ok=False, error=f"{envelope.type} is not a command a child serves")

    async def _run_turn(self, body: ipc.Prompt | ipc.Ask) -> None:
        if self.backend is None:
            return
        side = isinstance(body, ipc.Ask)
        if self.view is not None:
            self.view.on_turn(body.turn, body.text, side=side)
        self.emit(ipc.Event(activity="status", text="working"))
        try:
            if isinstance(body, ipc.Prompt):
                await self._use_model(body.model)
            result = await self.backend.run_turn(body.text, side=side)
        except Exception as exc:
            log.exception("turn %s failed", body.turn)
            result = TurnResult(text="", ok=False, error=f"{type(exc).__name__}: {exc}")
        self._busy = False
        settled = ipc.Settled(
            turn=body.turn,
            text=result.text,
            ok=result.ok,
            aborted=result.aborted,
            error=result.error,
            side=side,
            context=dict(result.context),
        )
        if self.view is not None:
            self.view.on_settled(settled)
        try:
            async with self._sending:
                await self._flush()
                try:
                    await self.channel.send_event(settled)
                except ipc.FrameError:  # its context does not fit: the supervisor fetches it
                    if not settled.context:
                        raise
                    await self.channel.send_event(attrs.evolve(settled, context={}))
        except ipc.ChannelClosed:
            log.info("settled turn %s could not be delivered: channel closed", body.turn)

    async def _use_model(self, index: int) -> None:
        """Run on candidate *index* of the loadout's model role (the supervisor moved this
        child to a fallback after a quota error). The builtin agent swaps its model and keeps
        the conversation; an agent CLI is restarted on the new model (a fresh session)."""
        choices = self.loadout.models
        if index == self._model or not 0 <= index < len(choices) or self.backend is None:
            return
        choice = choices[index]
        loadout = attrs.evolve(self.loadout, model=choice.model, effort=choice.effort)
        switch = getattr(self.backend, "switch_model", None)
        if switch is not None:
            await switch(loadout)
        else:
            old, self.backend = self.backend, make_backend(loadout, self)
            await old.aclose()
            self._spent = self._last_usage
        self.loadout, self._model = loadout, index
        log.info("running on model %s", choice.spec)
        self.emit(ipc.Event(activity="status", text=f"model {choice.spec}"))

    async def on_event(self, envelope: ipc.Envelope) -> None:
        log.debug("ignoring %s event from the supervisor", envelope.type)

    async def serve(self) -> int:
        """Serve until the supervisor hangs up; the exit code (4: the backend cannot start)."""
        try:
            self.backend = make_backend(self.loadout, self)
        except Exception as exc:
            # One line the supervisor's diagnostics show as the failure's tail.
            print(f"child: backend {self.loadout.backend} cannot start: {exc}", file=sys.stderr)
            await self.channel.aclose("backend failed")
            return 4
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if _in_pane(self.loadout):
                    from child._view import ActivityView  # noqa: PLC0415 - only panes need rich

                    self.view = ActivityView.for_loadout(self.loadout, sys.stdout)
                    await nursery.start(self.view.run)
                nursery.start_soon(self.pump_events)
                if self.loadout.lease_s:
                    lease = functools.partial(hold_lease, certificate=self.certificate)
                    nursery.start_soon(lease, self.channel, self.loadout.lease_s)
                await self.channel.serve(self.handle, self.on_event, immediate=self.immediate)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.backend.aclose()
        return 0


def added(base: ipc.Usage | None, usage: ipc.Usage) -> ipc.Usage:
    """*usage* on top of *base* (what replaced backends spent)."""
    if base is None:
        return usage
    costs = [c for c in (base.cost_usd, usage.cost_usd) if c is not None]
    return attrs.evolve(
        usage,
        tokens=base.tokens + usage.tokens,
        input_tokens=base.input_tokens + usage.input_tokens,
        output_tokens=base.output_tokens + usage.output_tokens,
        cache_read_tokens=base.cache_read_tokens + usage.cache_read_tokens,
        cache_write_tokens=base.cache_write_tokens + usage.cache_write_tokens,
        cost_usd=sum(costs) if costs else None,
    )


def _in_pane(loadout: ipc.Loadout) -> bool:
    """A child in a tmux or cmux pane shows its activity there, when it has a terminal."""
    surface = loadout.surface
    return (surface.startswith("tmux") or surface == "cmux") and sys.stdout.isatty()


async def run(loadout_path: str) -> int:
    """Run a child for the loadout file at *loadout_path* (a pane's child): the exit code.

    The file is unlinked as soon as it is read: its token is good for this launch only, and
    nobody else needs to find it (the supervisor unlinks it too, once the hello arrives).
    """
    loadout = ipc.Loadout.from_file(loadout_path)
    with contextlib.suppress(OSError):
        os.unlink(loadout_path)
    return await dial(loadout)


async def run_sealed(loadout_fd: int) -> int:
    """Run a child whose loadout is an inherited descriptor (a sealed memfd, closed once read)
    and whose connection it dials itself: a Ray node's child. Its loadout is never a file that
    the backend it starts next, in the same sandbox, could read."""
    return await dial(ipc.Loadout.from_fd(loadout_fd))


async def dial(loadout: ipc.Loadout) -> int:
    """Dial the socket *loadout* names (the session's, or a Ray door over mutual TLS) and serve
    as the child it describes: the exit code."""
    with contextlib.suppress(OSError):
        os.chdir(loadout.workspace)  # tools resolve relative paths against the workspace
    hello = ipc.Hello(pid=os.getpid(), backend=loadout.backend)
    if loadout.socket.startswith(ipc.TLS_SCHEME):
        # A child on another node: TCP + mutual TLS, through the egress relay when sandboxed
        # (its namespace has no network; the supervisor's proxy lets only its door through).
        from child._tls import Credentials  # noqa: PLC0415 - cryptography: remote children only

        credentials, context = Credentials.take(
            pathlib.Path(loadout.tls), loadout.session, loadout.owner
        )
        async with open_egress(loadout) as relayed:
            channel, _ = await ipc.open_tls_client(
                relayed.socket,
                context,
                owner=relayed.owner,
                token=relayed.token,
                hello=hello,
                request_timeout=relayed.request_timeout,
            )
            return await Runtime(loadout=relayed, channel=channel, certificate=credentials).serve()
    channel, _ = await ipc.open_client(
        loadout.socket,
        owner=loadout.owner,
        token=loadout.token,
        hello=hello,
        request_timeout=loadout.request_timeout,
    )
    async with open_egress(loadout) as relayed:
        return await Runtime(loadout=relayed, channel=channel).serve()


async def run_inherited(connection_fd: int, loadout_fd: int) -> int:
    """Run a child whose connection and loadout are inherited descriptors: the exit code.

    *connection_fd* is this child's end of a socket pair the supervisor made for it alone;
    *loadout_fd* a sealed memfd or a pipe (closed once read).
    """
    loadout = ipc.Loadout.from_fd(loadout_fd)
    try:
        sock = socket.socket(fileno=connection_fd)
    except OSError as exc:
        raise ipc.HandshakeError(f"connection fd {connection_fd}: {exc}", reason="fd") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ipc.HandshakeError(
            f"connection fd {connection_fd}: not a Unix stream socket", reason="fd"
        )
    sock.set_inheritable(False)  # never handed on to a backend's processes
    with contextlib.suppress(OSError):
        os.chdir(loadout.workspace)
    channel, _ = await ipc.hello_on(
        trio.SocketStream(trio.socket.from_stdlib_socket(sock)),
        owner=loadout.owner,
        token=loadout.token,
        hello=ipc.Hello(pid=os.getpid(), backend=loadout.backend),
        request_timeout=loadout.request_timeout,
    )
    async with open_egress(loadout) as loadout:
        return await Runtime(loadout=loadout, channel=channel).serve()


USAGE: Final = (
    "usage: python -m child <loadout> | python -m child --fd N --loadout-fd M"
    " | python -m child --loadout-fd M"
)


def _inherited(args: Sequence[str]) -> tuple[int, ...] | None:
    """``--fd N --loadout-fd M`` as ``(N, M)``, ``--loadout-fd M`` as ``(M,)``; ``None`` for
    any other argv."""
    if len(args) == 2 and args[0] == "--loadout-fd" and args[1].isdigit():
        return (int(args[1]),)
    if len(args) != 4 or args[0] != "--fd" or args[2] != "--loadout-fd":
        return None
    if not (args[1].isdigit() and args[3].isdigit()):
        return None
    return int(args[1]), int(args[3])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fds = _inherited(args)
    if fds is None and (len(args) != 1 or args[0].startswith("-")):
        print(USAGE, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="child %(levelname)s %(message)s")
    os.environ["FLEET_CHILD"] = "1"
    try:
        if fds is not None and len(fds) == 1:
            return trio.run(run_sealed, fds[0])
        if fds is not None:
            return trio.run(run_inherited, fds[0], fds[1])
        return trio.run(run, args[0])
    except ipc.IpcError as exc:
        print(f"child: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
