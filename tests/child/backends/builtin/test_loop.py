"""The builtin agent loop against the loop gate's answers (the supervisor's side is
tests/orchestrator/core/test_loop_gate.py): a stop asks the model nothing more."""

import pytest
import trio

import ipc
from child.backends import TurnAborted
from child.backends.builtin import BuiltinBackend
from tests.child.backends._backends import Host, make_loadout
from tests.fakes.model_server import ModelServer

READ = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}
LINE = "loop gate: the third trip"


class GateHost(Host):
    """A supervisor whose gate stops the child at its *at*-th checked event."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.checked = 0

    async def check_tool(self, start: ipc.Event) -> str | None:
        self.events.append(start)
        self.checked += 1
        if self.checked == self.at:
            raise TurnAborted(LINE)
        return None


@pytest.mark.parametrize(
    ("at", "ran"),
    [(3, 1), (4, 2)],
    ids=["stopped-before-the-second-call", "stopped-on-the-second-result"],
)
async def test_a_gate_stop_asks_the_model_nothing_more_and_waits_for_the_abort(tmp_path, at, ran):
    # Checked events: start 1, end 1, start 2 (3), end 2 (4).
    async with ModelServer() as srv:
        srv.script("a", [READ, READ, {"text": "never"}])
        spec = ipc.ModelSpec(kind="openai", name="fake-model", base_url=f"{srv.base_url('a')}/v1")
        host = GateHost(at)
        backend = BuiltinBackend.from_loadout(make_loadout(tmp_path, model=spec), host)
        results = []
        try:
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:

                    async def turn() -> None:
                        results.append(await backend.run_turn("read it"))

                    nursery.start_soon(turn)
                    while host.checked < at:  # noqa: ASYNC110 - the turn reaches the stop
                        await trio.sleep(0.01)
                    await trio.sleep(0.5)  # time enough for a model request, were one sent
                    assert not results  # it waits for the abort, not the model
                    await backend.abort()
        finally:
            await backend.aclose()
        asked = [r for r in srv.requests("a") if r.api]
    assert len(asked) == 2
    [result] = results
    assert result.aborted
    assert len(host.activities("tool_end")) == ran


@pytest.mark.parametrize("inline", [True, False])
async def test_a_node_childs_turn_result_carries_the_transcript_it_saved(tmp_path, inline):
    """With ``context_inline`` (a child on a node) each turn's result carries the transcript
    just saved, byte for byte; a side question's does not, nor does any without the flag."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    async with ModelServer() as srv:
        srv.script("a", [{"text": "first"}, {"text": "aside"}])
        spec = ipc.ModelSpec(kind="openai", name="fake-model", base_url=f"{srv.base_url('a')}/v1")
        loadout = make_loadout(
            tmp_path, model=spec, resume=str(scratch / "transcript.json"), context_inline=inline
        )
        backend = BuiltinBackend.from_loadout(loadout, Host())
        try:
            with trio.fail_after(20):
                result = await backend.run_turn("go")
                saved = (scratch / "transcript.json").read_text()
                side = await backend.run_turn("what?", side=True)
        finally:
            await backend.aclose()
    assert result.text == "first"
    assert result.context == ({"transcript.json": saved} if inline else {})
    assert side.context == {}
