"""The child runtime's event pump on a real channel: a turn's events come before its settled."""

import os

import attrs
import pytest
import trio

import ipc
from child import _runtime
from child._runtime import Runtime, main
from child.backends import TurnResult

TOOLS_BEFORE_THE_END = 60
STORM = 3 * _runtime.MAX_BUFFERED_EVENTS


@attrs.define(eq=False)
class BurstBackend:
    """A backend whose turn ends with a burst of tool events, right after the pump took them."""

    host: Runtime

    storm: bool = False

    async def run_turn(self, text: str, *, side: bool = False) -> TurnResult:
        if self.storm:
            # More events than the buffer holds, with no checkpoint for the pump: only shown
            # activity may be dropped, never a tool start or end (the loop gate counts them).
            for n in range(STORM):
                self.host.emit(ipc.Event(activity="status", text=f"s{n}"))
                if n % 7 == 0:
                    self.host.emit(ipc.Event(activity="tool_start", tool="read", text=str(n)))
            return TurnResult(text="done")
        for n in range(TOOLS_BEFORE_THE_END):
            self.host.emit(ipc.Event(activity="tool_start", tool="read", text=str(n)))
        # Let the pump take the whole burst and start writing it; then end the turn at once.
        while self.host._events:
            await trio.lowlevel.checkpoint()
        return TurnResult(text="done")

    async def steer(self, text: str) -> None:
        pass

    async def abort(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


@attrs.define(eq=False)
class ContextBackend(BurstBackend):
    """A backend whose turn ends with its resume context in its result."""

    context: dict[str, str] = attrs.Factory(dict)

    async def run_turn(self, text: str, *, side: bool = False) -> TurnResult:
        return TurnResult(text="done", context=self.context)


async def one_turn(
    monkeypatch: pytest.MonkeyPatch,
    *,
    storm: bool = False,
    backend: BurstBackend | None = None,
    settles: list[ipc.Settled] | None = None,
) -> list[str]:
    """Serve a real runtime over a socket pair, prompt one turn; what the parent received
    (*settles*: the turn's ``Settled`` too)."""
    key = ipc.new_session_key()
    token = ipc.derive_token(key, "a1")
    loadout = ipc.Loadout(
        session="t", owner="a1", name="n", agent="scout", token=token, socket="", workspace="/"
    )
    monkeypatch.setattr(
        _runtime,
        "make_backend",
        lambda _loadout, host: backend if backend is not None else BurstBackend(host, storm),
    )
    near, far = trio.socket.socketpair()
    child = ipc.Channel(stream=trio.SocketStream(near), owner="a1", token=token)
    parent = ipc.Channel(stream=trio.SocketStream(far), owner="a1", token=token)
    received: list[str] = []
    settled = trio.Event()

    async def on_event(envelope: ipc.Envelope) -> None:
        body = envelope.body
        if isinstance(body, ipc.Settled):
            received.append("settled")
            if settles is not None:
                settles.append(body)
            settled.set()
        elif isinstance(body, ipc.Event) and body.activity == "tool_start":
            received.append(body.text)

    async def no_requests(envelope: ipc.Envelope) -> ipc.Message:
        return ipc.Reply(ok=False, error="none")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Runtime(loadout=loadout, channel=child).serve)
            nursery.start_soon(parent.serve, no_requests, on_event)
            while True:
                try:
                    await parent.request(ipc.Prompt(text="go", turn=1))
                    break
                except ipc.RemoteError:  # "the child is still starting"
                    await trio.sleep(0.01)
            await settled.wait()
            # Anything the pump still had in flight would arrive now.
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    return received


async def test_every_event_of_a_turn_arrives_before_its_settled(monkeypatch):
    for _ in range(5):
        received = await one_turn(monkeypatch)
        assert received == [*map(str, range(TOOLS_BEFORE_THE_END)), "settled"]


@pytest.mark.parametrize("size", [1000, 2 * ipc.MAX_FRAME])
async def test_a_turns_context_rides_its_settled_or_stays_behind_when_it_does_not_fit(
    monkeypatch, size
):
    """A context that fits the frame goes with the ``Settled``; one that does not is left out
    (the supervisor fetches it from the node) and the turn still settles."""
    context = {"transcript.json": "x" * size}
    backend = ContextBackend(host=None, context=context)  # type: ignore[arg-type]
    settles: list[ipc.Settled] = []
    assert await one_turn(monkeypatch, backend=backend, settles=settles) == ["settled"]
    [settled] = settles
    assert settled.text == "done"
    assert settled.context == (context if size < ipc.MAX_FRAME else {})


async def test_a_storm_of_events_drops_shown_activity_but_never_a_tool_start(monkeypatch):
    received = await one_turn(monkeypatch, storm=True)
    assert received == [*(str(n) for n in range(0, STORM, 7)), "settled"]


def test_usage_after_a_fallback_restart_adds_what_the_replaced_backend_spent():
    before = ipc.Usage(tokens=120, input_tokens=100, output_tokens=20, cost_usd=0.5)
    now = ipc.Usage(tokens=30, input_tokens=20, output_tokens=5, cache_read_tokens=5, model="b")
    total = _runtime.added(before, now)
    assert (total.tokens, total.input_tokens, total.output_tokens) == (150, 120, 25)
    assert (total.cache_read_tokens, total.cost_usd, total.model) == (5, 0.5, "b")
    assert _runtime.added(None, now) is now
    assert _runtime.added(ipc.Usage(tokens=1), now).cost_usd is None


def test_a_node_child_takes_its_loadout_alone_from_a_sealed_descriptor(capsys, monkeypatch):
    """``python -m child --loadout-fd M`` (a Ray node's fork, which dials its door itself)
    reads its loadout from the descriptor, closes it, and fails a bad one in one line."""
    # ``main`` marks its process a fleet child: this test's worker is one only until it ends
    # (every later CLI test in the worker would be refused as one).
    monkeypatch.setenv("FLEET_CHILD", "0")
    fd = ipc.sealed_loadout(b"{}")
    assert main(["--loadout-fd", str(fd)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"child: loadout fd {fd}: "), err
    assert err.count("\n") == 1
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once read
    assert main(["--loadout-fd", "x"]) == 2
    assert main(["--loadout-fd"]) == 2
    monkeypatch.undo()
    assert "FLEET_CHILD" not in os.environ or os.environ["FLEET_CHILD"] != "1"
