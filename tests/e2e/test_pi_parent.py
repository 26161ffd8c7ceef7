"""The real Pi parent: `pi --mode rpc -e <fleet's extension>` driven by the scripted model server.

The parent's model calls fleet_spawn; a scripted scout runs under a real supervisor; the
parent is woken by one coalesced message carrying exactly the scout's final report and nothing of
its transcript; the parent's model stops the scout and nothing is left running.
"""

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.parents._install_pi import PiInstaller
from tests.e2e.conftest import fleet_processes, running_fleet
from tests.fakes._agent_clis import CliCommand, open_cli, pi_command
from tests.fakes.model_server import ModelServer

pytestmark = pytest.mark.slow

CEILING = 150
MARKER = "TRANSCRIPT-ONLY-7731"
REPORT = "REPORT: the entry point is src/app.py"
BINARIES = ["pi", "pi-next"]  # 0.73.1 and 1.6.0
TOOLS = ["spawn", "wait", "peek", "control", "stop", "apply", "report", "review", "paper", "info"]


def parent_command(
    fleet: Any, base_url: str, state: Path, extension: Path, binary: str
) -> CliCommand:
    command = pi_command(base_url=base_url, workspace=fleet.repo, state_dir=state, binary=binary)
    argv = list(command.argv)
    # The parent's tools: read plus fleet's (Pi's --tools allowlist covers extension tools too).
    argv[argv.index("--tools") + 1] = ",".join(["read", *(f"fleet_{t}" for t in TOOLS)])
    argv += ["--extension", str(extension)]
    env = dict(command.env)
    for name in ("FLEET_HOME", "FLEET_SESSION", "FLEET_ALLOW_UNSANDBOXED", "FLEET_SANDBOX"):
        if name in fleet.env:
            env[name] = fleet.env[name]
    env.update({k: v for k, v in fleet.env.items() if k.startswith("GIT_")})
    return CliCommand(argv=tuple(argv), env=env, cwd=command.cwd)


def last_user_text(request: Any) -> str:
    [message] = [m for m in request.body["messages"] if m.get("role") == "user"][-1:]
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


@pytest.mark.parametrize("binary", BINARIES)
async def test_a_pi_parent_spawns_is_woken_with_the_report_and_stops_the_scout(
    tmp_path, binary
) -> None:
    with running_fleet(tmp_path, prefix="fpp-") as fleet:
        (fleet.repo / "NOTES.md").write_text(f"{MARKER}: only the scout's transcript has this\n")
        scout = fleet.script(
            "scout",
            f"""
            turns:
              - steps:
                  - tool: read
                    args: {{path: NOTES.md}}
                  - reply: "{REPORT}"
            """,
        )
        # The file `fleet install pi --project` writes, with this fleet's absolute path baked in.
        fleet_bin = Path(sys.executable).parent / "fleet"
        installer = PiInstaller([str(fleet_bin)])
        installer.install("project", home=tmp_path / "home", project=fleet.repo)
        extension = fleet.repo / ".pi" / "extensions" / "fleet" / "index.js"
        async with ModelServer() as srv:
            spawn = {
                "task": "find the entry point",
                "name": "finder",
                "model": scout,
                "budget": {"hard_tokens": 5000, "hard_usd": 1},
            }
            srv.script(
                "parent",
                [
                    {"tool_calls": [{"name": "fleet_spawn", "arguments": spawn}]},
                    {"text": "spawned the finder; I will be woken when it settles"},
                    {"tool_calls": [{"name": "fleet_stop", "arguments": {"agents": ["a1"]}}]},
                    {"text": "done: the entry point is src/app.py"},
                ],
            )
            command = parent_command(
                fleet, srv.base_url("parent"), tmp_path / "pi", extension, binary
            )
            with trio.fail_after(CEILING):
                async with open_cli(command, tmp_path / "pi.stderr") as pi:
                    await pi.send({"type": "prompt", "id": "p1", "message": "find the entry"})
                    await pi.until(lambda e: e.get("type") == "agent_end")
                    # No prompt from us: the settle wake-up alone starts the second turn.
                    await pi.until(lambda e: e.get("type") == "agent_end")
                    requests = srv.requests("parent")
                    assert len(requests) == 4, [r.turn for r in requests]
                    spawned = json.loads(requests[1].tool_results()[-1])
                    assert spawned["agents"][0]["key"] == "a1"
                    woken = requests[2]
                    text = last_user_text(woken)
                    assert text.startswith("[fleet] 1 child settled or asked:")
                    # The report, framed as the child's words (as every parent gets it).
                    assert "a1 (finder) idle:\n[fleet: a1's report follows" in text
                    assert f"\n│ {REPORT}\n[fleet: end of a1's report]" in text
                    # The report reached the parent's model; the scout's transcript did not.
                    assert MARKER not in json.dumps(woken.body)
                    assert MARKER not in json.dumps(requests[3].body)
                    # The moderator brief rode along, hidden: in the model's context only.
                    assert "[fleet moderator brief]" in json.dumps(woken.body)
                    # Once its only child is stopped no fleet exists: no brief any more.
                    assert "[fleet moderator brief]" not in json.dumps(requests[3].body)
                    [handoff] = json.loads(requests[3].tool_results()[-1])["handoffs"]
                    assert handoff["key"] == "a1"
                    assert handoff["state"] == "stopped"
                    await pi.send({"type": "get_messages", "id": "m"})
                    reply = await pi.until(lambda e: e.get("id") == "m")
                    shown = [
                        m
                        for m in reply["data"]["messages"]
                        if m.get("role") == "custom" and m.get("customType") == "fleet-settled"
                    ]
                    assert len(shown) == 1  # one coalesced, visible message
                    assert not any(
                        m.get("customType") == "fleet-brief" for m in reply["data"]["messages"]
                    )
                    assert await pi.finish() == 0
            # The stopped scout, Pi and its watcher are gone; only the supervisor (and its fork
            # server) remain, for the next parent, until the fixture stops it.
            left = [" ".join(p.cmdline()) for p in fleet_processes(fleet.home)]
            assert all("orchestrator serve" in c or "fork" in c for c in left), left
            peek = fleet.json("peek")
            assert [(a["key"], a["state"]) for a in peek["agents"]] in ([], [("a1", "stopped")])
            # The spawn tool's budget reached the child (the ledger outlives it).
            [usage] = fleet.json("usage", "a1")["agents"]
            assert usage["budget"] == {"hard_tokens": 5000, "hard_usd": 1.0}


@pytest.mark.parametrize(
    ("binary", "verb", "args"),
    [
        ("pi", "stop", {"agents": ["a1"]}),
        ("pi-next", "stop", {"agents": ["a1"]}),
        # by name: the wake-up is the key's
        ("pi", "control", {"action": "pause", "agent": "finder", "text": "handled it"}),
    ],
)
async def test_stop_and_pause_cancel_the_pending_wake_up_of_the_child_they_handle(
    tmp_path, binary, verb, args
) -> None:
    with running_fleet(tmp_path, prefix="fpq-") as fleet:
        scout = fleet.script("scout", f'turns:\n  - steps:\n      - reply: "{REPORT}"\n')
        extension = Path(__file__).parents[2] / "orchestrator/parents/pi_extension/fleet.js"
        async with ModelServer() as srv:
            spawn = {"task": "find the entry point", "name": "finder", "model": scout}
            srv.script(
                "parent",
                [
                    {"tool_calls": [{"name": "fleet_spawn", "arguments": spawn}]},
                    # The parent is still busy when the scout settles: its wake-up waits.
                    {"delay": 8, "tool_calls": [{"name": "fleet_peek", "arguments": {}}]},
                    {"tool_calls": [{"name": f"fleet_{verb}", "arguments": args}]},
                    {"text": "handled the finder myself"},
                ],
            )
            command = parent_command(
                fleet, srv.base_url("parent"), tmp_path / "pi", extension, binary
            )
            env = dict(command.env) | {"FLEET_BIN": str(Path(sys.executable).parent / "fleet")}
            command = CliCommand(argv=command.argv, env=env, cwd=command.cwd)
            with trio.fail_after(CEILING):
                async with open_cli(command, tmp_path / "pi.stderr") as pi:
                    await pi.send({"type": "prompt", "id": "p1", "message": "find the entry"})
                    await pi.until(lambda e: e.get("type") == "agent_end")
                    [peeked] = json.loads(srv.requests("parent")[2].tool_results()[-1])["agents"]
                    assert peeked["state"] == "idle"  # it had settled while the parent worked
                    await trio.sleep(4)  # a wake-up would have come by now
                    assert len(srv.requests("parent")) == 4
                    await pi.send({"type": "get_messages", "id": "m"})
                    reply = await pi.until(lambda e: e.get("id") == "m")
                    kinds = [m.get("customType") for m in reply["data"]["messages"]]
                    assert "fleet-settled" not in kinds
                    assert await pi.finish() == 0


@pytest.mark.parametrize("binary", BINARIES)
async def test_pi_discovers_the_project_install_and_forgets_it_after_uninstall(
    tmp_path, binary
) -> None:
    with running_fleet(tmp_path, prefix="fpd-") as fleet:
        installer = PiInstaller([str(Path(sys.executable).parent / "fleet")])
        async with ModelServer() as srv:
            srv.script("parent", [{"text": "hello"}, {"text": "hello again"}])
            offered = []
            for installed in (True, False):
                if installed:
                    installer.install("project", home=tmp_path / "home", project=fleet.repo)
                else:
                    installer.uninstall("project", home=tmp_path / "home", project=fleet.repo)
                base = parent_command(
                    fleet, srv.base_url("parent"), tmp_path / "pi", Path("/dev/null"), binary
                )
                # Discovery on: no --extension, no --no-extensions. Pi 1.x loads a project's
                # extensions only once the project is trusted (/trust, or --approve per run).
                argv = [a for a in base.argv[:-2] if a != "--no-extensions"]
                argv += ["--approve"] if binary == "pi-next" else []
                command = CliCommand(argv=tuple(argv), env=base.env, cwd=base.cwd)
                with trio.fail_after(CEILING):
                    async with open_cli(command, tmp_path / "pi.stderr") as pi:
                        await pi.send({"type": "prompt", "id": "p", "message": "hi"})
                        await pi.until(lambda e: e.get("type") == "agent_end")
                        assert await pi.finish() == 0
                tools = srv.requests("parent")[-1].body.get("tools") or []
                offered.append({t["function"]["name"] for t in tools})
    assert {f"fleet_{t}" for t in TOOLS} <= offered[0]
    assert not any(name.startswith("fleet_") for name in offered[1])
    assert not (fleet.repo / ".pi").exists()
