"""Containment 2: the loadout is not a file siblings can race for (DESIGN.md §3).

A hostile ``command`` child loops over every way to speak for a sibling — loadout files, other
processes' memfds and sockets through ``/proc``, the session's listener with every token it
finds — while twenty honest siblings spawn and report. None is impersonated, and every hello it
presents is refused and counted. The same holds with the hostile child unsandboxed.

A pane's child (real tmux on the session's private socket) still needs a loadout file and the
listener; an impostor outside the pane's process tree that read the token from that file is
refused and counted, the pane's child connects, and the file is gone once it has.
"""

import json
import subprocess
import sys

import pytest
import trio

import sandbox
from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor
from tests.security._impostor_util import HOSTILE, OUTSIDER, World
from tests.security._impostor_util import world as world  # noqa: PLC0414 - the fixture

pytestmark = pytest.mark.slow

CEILING = 240
SIBLINGS = 20
BATCH = 5
MINE = """
turns:
  - steps:
      - reply: "mine: {{task}}"
"""


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_a_hostile_child_never_speaks_for_a_sibling(world: World, sandboxed: bool) -> None:
    if sandboxed:
        assert sandbox.probe().available, sandbox.probe().reason  # bubblewrap must work here
        config = world.config(max_subagents=8, reject_log=True)
    else:
        config = world.config(
            max_subagents=8, reject_log=True, sandbox="off", allow_unsandboxed=True
        )
    stop = world.repo / ".git" / "impostor-stop"
    hostile = world.payload("hostile", HOSTILE)
    mine = world.script("mine", MINE)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            command = (
                sys.executable,
                hostile,
                str(world.home),
                str(sup.paths.ipc_socket),
                str(stop),
            )
            [bad] = await sup.spawn(
                [SpawnRequest(task="impostor", backend="command", command=command)]
            )
            assert bad.sandboxed is sandboxed
            reports: dict[str, str] = {}
            for first in range(0, SIBLINGS, BATCH):
                tasks = [f"sibling-{n}" for n in range(first, first + BATCH)]
                records = await sup.spawn([SpawnRequest(task=task, model=mine) for task in tasks])
                notes = await sup.wait([r.key for r in records], every=True)
                for note in notes:
                    reports[note["key"]] = note["report"]
                # No sibling had a loadout file anyone could read.
                assert not list(sup.paths.loadouts.glob("*.json"))
                await sup.stop([r.key for r in records])
            assert bad.state is State.WORKING, bad.error  # it was trying all along
            stop.write_text("")
            [note] = await sup.wait([bad.key])
            found = json.loads(note["report"])
            refused = dict(sup.refusals.counts)

    expected = {f"a{n + 2}": f"mine: sibling-{n}" for n in range(SIBLINGS)}
    assert reports == expected  # each sibling's report is its own
    assert found["wins"] == []
    assert found["sockets_opened"] == 0
    # Every hello it presented was refused and counted (the supervisor may count more: a
    # connection it dropped before its hello).
    assert sum(refused.values()) >= found["attempts"]
    logged = [r for r in world.rejected() if r["kind"] == "hello-refused"]
    assert len(logged) == sum(refused.values())
    if not sandboxed:
        # Unsandboxed it sees the listener and tries in earnest; tokens it may find in a
        # sibling's memfd are no use there (a process child never speaks on the listener).
        assert found["listener"] is True
        assert found["attempts"] > SIBLINGS
        assert refused.get("token", 0) >= found["attempts"]


PANE = """
turns:
  - steps:
      - reply: "pane: {{task}}"
"""


@pytest.mark.needs("tmux")
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_a_pane_hello_from_outside_the_pane_is_refused(world: World, sandboxed: bool) -> None:
    # The impostor polls for the file every half millisecond; the pane's child needs a tenth
    # of a second or more to start an interpreter and read it: the impostor hellos first.
    overrides = {} if sandboxed else {"sandbox": "off", "allow_unsandboxed": True}
    config = world.config(reject_log=True, **overrides)
    outsider = world.payload("outsider", OUTSIDER)
    pane = world.script("pane", PANE)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            loadout = sup.paths.loadouts / "a1.json"
            impostor = subprocess.Popen(  # noqa: ASYNC220 - awaited in a thread below
                [sys.executable, outsider, str(loadout), str(sup.paths.ipc_socket), "a1"],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                [record] = await sup.spawn(
                    [SpawnRequest(task="the real one", model=pane, surface="tmux")]
                )
                out, _ = await trio.to_thread.run_sync(impostor.communicate, None, 60)
            finally:
                if impostor.poll() is None:
                    impostor.kill()
                    impostor.wait()
            [note] = await sup.wait([record.key])
            assert record.sandboxed is sandboxed
            refused = dict(sup.refusals.counts)
            assert not loadout.exists()  # unlinked once read (and once the hello arrived)
            await sup.stop([record.key])
    tried = json.loads(out)
    assert tried["token"] is True  # it read the token from the pane's loadout file
    assert tried["wins"] == 0
    assert tried["attempts"] >= 1
    # Its hellos before the child connected carried the right token and were refused for
    # their pid; once the child connected, the token was spent.
    assert refused.get("peer-pid", 0) >= 1
    assert refused.get("peer-pid", 0) + refused.get("token", 0) >= tried["attempts"]
    assert note["report"] == "pane: the real one"
    logged = [r for r in world.rejected() if r["args"].get("reason") == "peer-pid"]
    assert logged
    assert logged[0]["owner"] == "a1"
