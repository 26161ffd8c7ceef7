"""A background shell's watch reaches the builtin agent's model: mid-turn, or by waking it."""

import trio

import ipc
from child.backends.builtin import BuiltinBackend
from tests.child.backends._backends import Host, make_loadout
from tests.fakes.model_server import ModelServer

TOOLS = ["read", "bash"]


def call(name, **arguments):
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def user_lines(request):
    return [m["content"] for m in request.body["messages"] if m["role"] == "user"]


def backend_for(tmp_path, srv, host):
    spec = ipc.ModelSpec(kind="openai", name="fake-model", base_url=f"{srv.base_url('a')}/v1")
    loadout = make_loadout(tmp_path, model=spec, tools=TOOLS)
    return BuiltinBackend.from_loadout(loadout, host)


async def test_a_watch_that_matches_mid_turn_joins_the_conversation(tmp_path):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                call("shell", action="start", command="sleep 0.1; echo up ready", watch="ready"),
                call("bash", command="sleep 0.6"),  # the watch fires while this runs
                {"text": "done"},
            ],
        )
        host = Host()
        backend = backend_for(tmp_path, srv, host)
        assert "shell" in backend.tools
        try:
            with trio.fail_after(20):
                result = await backend.run_turn("start the server")
        finally:
            await backend.aclose()
        requests = srv.requests("a")
    assert result.text == "done"
    assert [len(user_lines(r)) for r in requests] == [1, 1, 2]
    note = user_lines(requests[2])[1]
    assert note.startswith("[background] background shell s1 (sleep 0.1; echo up ready)")
    assert "matched: up ready" in note
    assert host.activities("wake") == []  # a turn was running: nothing to wake


async def test_a_watch_that_matches_while_idle_asks_for_a_wake_and_leads_the_next_turn(tmp_path):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                call("shell", action="start", command="sleep 0.5; echo BUILD OK", watch="OK$"),
                {"text": "started"},
                {"text": "the build is done"},
            ],
        )
        host = Host()
        backend = backend_for(tmp_path, srv, host)
        try:
            with trio.fail_after(20):
                assert (await backend.run_turn("build in the background")).text == "started"
                assert host.activities("wake") == []
                while not host.activities("wake"):  # noqa: ASYNC110 - the shell's own time
                    await trio.sleep(0.02)
                [wake] = host.activities("wake")
                assert "watch /OK$/ matched: BUILD OK" in wake.text
                result = await backend.run_turn("wake up")
        finally:
            await backend.aclose()
        third = srv.requests("a")[2]
    assert result.text == "the build is done"
    lines = user_lines(third)
    assert lines[1].startswith("[background] background shell s1")
    assert lines[2] == "wake up"  # the note comes before the prompt it woke
    assert len(host.activities("wake")) == 1


async def test_closing_the_backend_stops_its_shells(tmp_path):
    async with ModelServer() as srv:
        srv.script("a", [call("shell", action="start", command="exec sleep 60"), {"text": "ok"}])
        backend = backend_for(tmp_path, srv, Host())
        with trio.fail_after(20):
            await backend.run_turn("go")
            [shell] = backend.tools["shell"].shells.values()
            await backend.aclose()
    assert shell.finished.is_set()
    assert shell.process.returncode is not None
