"""A child's view holds its own capability and nothing else (containment issue, items 1 and 4).

Each test runs a hostile ``command``-backend child under real bubblewrap that tries to reach
what the state directory holds (another child's loadout, the control token, the session
listing, the tmux socket), the supervisor through ``/proc``, a setuid file on the host, and a
write outside its workspace; every attempt must fail while an honest child in the same fleet
still completes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator._errors import PolicyError
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import open_supervisor
from tests.security._view_util import World, results, world

__all__ = ["world"]

pytestmark = pytest.mark.slow
CEILING = 90
SUID_BITS = stat.S_ISUID | stat.S_ISGID


def _failed(result: str) -> bool:
    return not result.startswith("ok")


async def _settle(sup: Any, key: str) -> dict[str, Any]:
    [note] = await sup.wait([key], timeout=60)
    return dict(note)


def _start_tmux(socket: Path) -> None:
    subprocess.run(
        ["tmux", "-S", str(socket), "new-session", "-d", "-s", "view", "sleep 600"],
        check=True,
        capture_output=True,
        env={k: v for k, v in os.environ.items() if k != "TMUX"},
    )


def _stop_tmux(socket: Path) -> None:
    subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True, check=False)


def _assert_no_setuid(*paths: Path) -> None:
    for path in paths:
        if path.exists():
            mode = os.stat(path).st_mode
            assert not mode & SUID_BITS, f"{path} is {oct(mode)} on the host"


async def _hostile_run(
    world: World, tmp_path: Path, *, mode: str | None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Run an honest scout, then a hostile child attacking it, then an honest scout again."""
    session = world.session
    marker = tmp_path / "tmux-ran-on-the-host"
    outside = tmp_path / "outside-written"
    with trio.fail_after(CEILING):
        async with open_supervisor(world.config()) as sup:
            [first] = await sup.spawn([world.honest()])
            assert "honest:" in (await _settle(sup, first.key))["report"]
            # The secrets the hostile child goes for, some on paths the fleet may not create.
            token_file = sup.paths.control_token
            if not token_file.exists():
                token_file.write_text(secrets.token_hex(16))
            # The session journal (a daemon keeps one): every child's facts and resume ids.
            journal = session / "journal.jsonl"
            if not journal.exists():
                journal.write_text(json.dumps({"v": 1, "resume": secrets.token_hex(16)}) + "\n")
                journal.chmod(0o600)
            tmux_socket = sup.paths.tmux_socket
            _start_tmux(tmux_socket)
            try:
                # A process child's loadout is a sealed memfd, never a file; a pane child's is a
                # file here until its hello. Plant one holding the honest child's real token.
                victim = session / "loadouts" / f"{first.key}.json"
                victim.parent.mkdir(mode=0o700, exist_ok=True)
                victim.write_text(json.dumps({"token": sup.runs[first.key].token}))
                victim.chmod(0o600)
                pid = os.getpid()
                ops = [
                    f"read:{victim}",
                    f"read:{token_file}",
                    f"read:{journal}",
                    f"list:{session / 'checkouts'}",
                    f"list:{session}",
                    f"list:{session / 'loadouts'}",
                    f"list:{world.home}",
                    f"list:{session / 'scratch'}",
                    f"unix:{tmux_socket}",
                    f"tmux:{tmux_socket} {marker}",
                    f"read:/proc/{pid}/environ",
                    f"read:/proc/{pid}/cmdline",
                    f"readlink:/proc/{pid}/cwd",
                    f"readlink:/proc/{pid}/root",
                    f"read:/proc/{first.pid}/environ",
                    "procs:",
                    "status:",
                    "setuid:$TMPDIR/suid",
                    f"write:{world.repo / 'README.md'}",
                    f"write:{outside}",
                    f"write:{world.home / 'planted'}",
                    f"write:{session / 'registry.json'}",
                    # After the listings: a write lands in the child's own tmpfs, never here.
                    f"write:{journal}",
                ]
                if mode == "worktree":
                    ops += ["setuid:suid-in-worktree", "write:written-in-worktree"]
                [hostile] = await sup.spawn([World.hostile(ops, mode=mode)])
                note = await _settle(sup, hostile.key)
                got = results(world, hostile.key)
                scratch = session / "scratch" / hostile.key
                worktree = Path(hostile.workspace)
                # Checked before stop: a worker's worktree is discarded or copied back then.
                _assert_no_setuid(scratch / "suid", scratch / "suid.new")
                if mode == "worktree":
                    _assert_no_setuid(
                        worktree / "suid-in-worktree", worktree / "suid-in-worktree.new"
                    )
                    assert (worktree / "written-in-worktree").read_text() == "hostile"
                assert hostile.sandboxed is True
                [peeked] = sup.peek([hostile.key])["agents"]
                assert peeked["sandboxed"] is True
                assert peeked["unsandboxed_reason"] == ""
                # The fleet still serves the honest.
                [second] = await sup.spawn([world.honest("honest-2")])
                assert "honest:" in (await _settle(sup, second.key))["report"]
                secrets_seen = {
                    "victim token": first_token(victim),
                    "control token": token_file.read_text(),
                    "journal": journal.read_text(),
                }
                host_cmdline = _cmdline(pid)
            finally:
                _stop_tmux(tmux_socket)
    extra = {
        "report": note["report"],
        "secrets": secrets_seen,
        "marker": marker,
        "outside": outside,
        "host_cmdline": host_cmdline.decode(errors="replace"),
        "hostile_key": hostile.key,
        "mode": mode,
        "tmux_socket": tmux_socket,
    }
    return got, extra


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")


def first_token(loadout: Path) -> str:
    token: str = json.loads(loadout.read_text())["token"]
    return token


def _check_contained(world: World, got: dict[str, str], extra: dict[str, Any]) -> None:
    session = world.session
    key = extra["hostile_key"]
    for name, secret in extra["secrets"].items():
        assert secret not in extra["report"], f"the hostile child got the {name}"
    pid = os.getpid()
    for op, result in got.items():
        if op.startswith(("read:", "readlink:")) and not op.startswith("read:/proc/self"):
            assert _failed(result), (op, result)
    # Listings show only the mount points of what was bound back for this child.
    own = {"scratch", "ipc.sock", "loadouts", "worktrees"}
    listed_session = got[f"list:{session}"]
    assert listed_session.startswith("ok:"), listed_session
    assert set(filter(None, listed_session[3:].split(","))) <= own, listed_session
    # A process child inherits its loadout, so nothing of loadouts/ is bound back at all.
    listed_loadouts = got[f"list:{session / 'loadouts'}"]
    assert _failed(listed_loadouts) or set(filter(None, listed_loadouts[3:].split(","))) <= {
        f"{key}.json"
    }, listed_loadouts
    assert set(filter(None, got[f"list:{session / 'scratch'}"][3:].split(","))) <= {key}
    assert set(filter(None, got[f"list:{world.home}"][3:].split(","))) <= {"sessions"}
    # tmux: neither the socket nor the client reaches the host's server.
    assert _failed(got[f"unix:{extra['tmux_socket']}"])
    assert not got[f"tmux:{extra['tmux_socket']} {extra['marker']}"].startswith("exit 0")
    assert not extra["marker"].exists()
    # /proc: only the sandbox's own pid namespace; no supervisor, no sibling.
    assert _failed(got[f"read:/proc/{pid}/environ"])
    procs = got["procs:"]
    assert "pytest" not in procs, procs
    assert extra["host_cmdline"].strip() not in procs
    # No capability, and no setuid bit anywhere.
    status = got["status:"]
    assert "CapEff:\t0000000000000000" in status or "CapEff:0000000000000000" in status, status
    assert "=ok" not in got["setuid:$TMPDIR/suid"], got["setuid:$TMPDIR/suid"]
    # Writes outside the workspace never reach the host.
    assert (world.repo / "README.md").read_text() == "# repo\n"
    assert not extra["outside"].exists()
    assert not (world.home / "planted").exists()
    # The supervisor keeps no registry file (the journal is its record), and the child's
    # attempt to plant one never reached the session directory.
    assert not (session / "registry.json").exists()
    assert "hostile" not in (session / "journal.jsonl").read_text()
    # Remote children's checkouts are bound only into their own child's view.
    assert _failed(got[f"list:{session / 'checkouts'}"]), got[f"list:{session / 'checkouts'}"]
    if extra["mode"] == "worktree":
        assert "=ok" not in got["setuid:suid-in-worktree"], got["setuid:suid-in-worktree"]
        assert got["write:written-in-worktree"] == "ok"


async def test_a_hostile_scout_sees_nothing_of_the_state_directory(world, tmp_path) -> None:
    got, extra = await _hostile_run(world, tmp_path, mode=None)
    _check_contained(world, got, extra)


async def test_a_hostile_worker_writes_its_worktree_and_nothing_else(world, tmp_path) -> None:
    got, extra = await _hostile_run(world, tmp_path, mode="worktree")
    _check_contained(world, got, extra)


async def test_an_unsandboxed_scripted_scouts_read_of_another_sessions_token_is_refused(
    world, tmp_path
) -> None:
    other = world.home / "sessions" / "other"
    other.mkdir(parents=True)
    token = secrets.token_hex(16)
    (other / "control.token").write_text(token)
    # A symlink in the workspace into the state directory is refused too.
    (world.repo / "innocent.txt").symlink_to(other / "control.token")
    reads = [str(other / "control.token"), "innocent.txt"]
    requests = []
    for index, path in enumerate(reads):
        model = world.script(
            f"reader{index}",
            f"""
            turns:
              - steps:
                  - tool: read
                    args: {{path: "{path}"}}
                  - reply: "read: {{{{last}}}}"
            """,
        )
        requests.append(SpawnRequest(task="read it", name=f"reader{index}", model=model))
    config = world.config(sandbox="off", allow_unsandboxed=True)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            records = await sup.spawn([*requests, world.honest()])
            notes = {
                n["key"]: n
                for n in await sup.wait([r.key for r in records], timeout=60, every=True)
            }
            for record in records[:-1]:
                report = notes[record.key]["report"]
                assert token not in report
                assert "inside the fleet state directory" in report, report
                assert record.sandboxed is False
            assert "honest:" in notes[records[-1].key]["report"]
            [peeked] = sup.peek([records[0].key])["agents"]
            assert peeked["sandboxed"] is False
            assert "--allow-unsandboxed" in peeked["unsandboxed_reason"]
            [handoff] = await sup.stop([records[0].key])
            assert handoff["sandboxed"] is False
            assert "--allow-unsandboxed" in handoff["unsandboxed_reason"]


async def test_without_a_working_sandbox_every_spawn_fails_closed(world, monkeypatch) -> None:
    # Hide bwrap from the probe (a fresh probe, cached again afterwards).
    import sandbox  # noqa: PLC0415

    empty = world.scripts / "nobin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    sandbox.probe(refresh=True)
    try:
        with trio.fail_after(CEILING):
            async with open_supervisor(world.config()) as sup:
                with pytest.raises(PolicyError) as refused:
                    await sup.spawn([world.honest()])
                message = str(refused.value)
                assert "\n" not in message
                assert "install bubblewrap" in message
                assert "--allow-unsandboxed" in message
            async with open_supervisor(world.config(sandbox="off")) as sup:
                with pytest.raises(PolicyError, match="--allow-unsandboxed"):
                    await sup.spawn([world.honest()])
    finally:
        monkeypatch.undo()
        sandbox.probe(refresh=True)
    assert shutil.which("bwrap") is not None


def test_fleet_demo_says_in_one_line_that_its_scripted_scouts_run_unsandboxed(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "demo", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "unsandboxed" in data["note"]
    assert "\n" not in data["note"]
    assert all(report["state"] == "stopped" for report in data["reports"])
