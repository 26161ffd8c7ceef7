"""Children in tmux panes and cmux surfaces, driven through the real CLI.

tmux runs for real, on sockets these tests own: the fleet's private server under FLEET_HOME, and
a stand-in for "the user's" server started here. ``TMUX_TMPDIR`` points into the test's own
directory, so nothing can reach the real user's default server, and a test can check that no
default server was started either. cmux (macOS-only) is the loopback fake.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import psutil
import pytest

from tests.fakes.cmux_server import CmuxFake

if TYPE_CHECKING:
    from tests.e2e.conftest import Fleet

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs("tmux"),
]

WORK = """
turns:
  - steps:
      - tool: todo
        args: {op: write, items: [{text: read the README}, {text: report the answer}]}
      - tool: todo
        args: {op: start, id: "1"}
      - say: "Looking for the answer in the README"
      - tool: read
        args: {path: README.md}
      - tool: todo
        args: {op: done, id: "1"}
      - wait: WAIT
      - reply: "## Summary\\n{{task}}: {{tool:read}}"
"""
HANG = "turns:\n  - steps:\n      - hang: true\n"


def tmux(socket: Path | str, *args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["tmux", "-S", str(socket), *args], capture_output=True, text=True, timeout=10, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"tmux {args[0]}: {result.stderr.strip()}")
    return result.stdout


def until(predicate: Callable[[], object], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def kill_server(socket: Path) -> None:
    """Kill a server these tests own, and wait until its process is really gone."""
    server = psutil.Process(int(tmux(socket, "display", "-p", "#{pid}")))
    tmux(socket, "kill-server")
    until(
        lambda: not server.is_running() or server.status() == psutil.STATUS_ZOMBIE,
        "the tmux server to exit",
    )


def server_gone(socket: Path) -> bool:
    return tmux(socket, "list-sessions", check=False) == ""


def kept_loadout(fleet: "Fleet", key: str) -> Path:
    return fleet.scripts / f"{key}.loadout.json"


@contextlib.contextmanager
def keeping_loadout(fleet: "Fleet", key: str) -> Iterator[Path]:
    """Hard-link *key*'s loadout the moment the supervisor writes it (a pane's child unlinks
    it once read, the supervisor once the hello arrives), so a test can know the token; the
    copy is outside the state directory, where the child can read it too."""
    source = fleet.home / "sessions" / "t" / "loadouts" / f"{key}.json"
    kept = kept_loadout(fleet, key)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                os.link(source, kept)
                return
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield kept
        until(kept.exists, f"{key}'s loadout, kept")
    finally:
        done.set()
        watcher.join(5)


@attrs.define
class Surfaces:
    """The fleet plus what these tests need around it."""

    fleet: "Fleet"
    tmux_tmpdir: Path
    user_socket: Path

    @property
    def private(self) -> Path:
        return self.fleet.paths.tmux_socket

    def kept(self, key: str) -> Path:
        return kept_loadout(self.fleet, key)

    def keeping_loadout(self, key: str) -> contextlib.AbstractContextManager[Path]:
        return keeping_loadout(self.fleet, key)

    def token(self, key: str) -> str:
        return str(json.loads(self.kept(key).read_text())["token"])

    def pane(self, window: str) -> tuple[str, int]:
        out = tmux(
            self.private, "display", "-p", "-t", f"=fleet-t:={window}", "#{pane_id} #{pane_pid}"
        )
        pane_id, pid = out.split()
        return pane_id, int(pid)

    def screen(self, pane_id: str, *, history: bool = False) -> str:
        extra = ["-S", "-"] if history else []
        return tmux(self.private, "capture-pane", "-p", "-J", "-t", pane_id, *extra)

    def start_user_server(self, *, command: list[str] | None = None) -> str:
        """Stand in for the user's own tmux: session "mine", first window "editor"."""
        argv = ["new-session", "-d", "-s", "mine", "-n", "editor", "-x", "160", "-y", "50"]
        env = self.fleet.env
        subprocess.run(
            ["tmux", "-S", str(self.user_socket), "-f", "/dev/null", *argv, *(command or [])],
            check=True,
            env=env,
            timeout=10,
        )
        return tmux(self.user_socket, "display", "-p", "#{pid}").strip()


@pytest.fixture
def surfaces(fleet, tmp_path) -> Iterator[Surfaces]:
    tmux_tmpdir = Path(f"/tmp/tmt-{os.getpid()}-{time.monotonic_ns()}")
    tmux_tmpdir.mkdir(mode=0o700)
    fleet.env["TMUX_TMPDIR"] = str(tmux_tmpdir)
    for name in ("TMUX", "TMUX_PANE", "FLEET_KEEP_FAILED_PANES", "CMUX_SOCKET_PATH"):
        fleet.env.pop(name, None)
    found = Surfaces(fleet=fleet, tmux_tmpdir=tmux_tmpdir, user_socket=tmux_tmpdir / "user")
    try:
        yield found
    finally:
        if not server_gone(found.user_socket):
            kill_server(found.user_socket)
        shutil.rmtree(tmux_tmpdir, ignore_errors=True)


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def test_a_tmux_child_completes_its_task_in_a_pane_that_shows_its_activity(fleet, surfaces):
    user_pid = surfaces.start_user_server()
    user_windows = tmux(surfaces.user_socket, "list-windows", "-a")
    model = fleet.script("work", WORK.replace("WAIT", "3"))
    with surfaces.keeping_loadout("a1"):
        [agent] = fleet.json("spawn", "--surface", "tmux", "--model", model, "find the answer")[
            "agents"
        ]
    assert agent["key"] == "a1"
    until(lambda: not server_gone(surfaces.private), "the private tmux server")
    assert tmux(surfaces.private, "list-windows", "-a", "-F", "#{session_name} #{window_name}") == (
        "fleet-t a1-scout-1\n"
    )
    pane_id, pane_pid = surfaces.pane("a1-scout-1")
    until(lambda: "1/2 done" in surfaces.screen(pane_id), "the activity view")
    screen = surfaces.screen(pane_id)
    assert "a1 · scout-1 · scout (scout)" in screen
    assert "task   find the answer" in screen
    assert 'read {"path":"README.md"}' in screen
    assert "todo   1/2 done" in screen
    assert "next: report the answer" in screen
    assert "says   Looking for the answer in the README" in screen
    peek = fleet.json("peek")["agents"][0]
    assert peek["surface"] == "tmux"

    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"].startswith("## Summary\nfind the answer: ")
    assert "The answer is 42." in note["report"]
    until(lambda: "turn 1 report" in surfaces.screen(pane_id), "the report in the pane")

    token = surfaces.token("a1")
    assert token not in surfaces.screen(pane_id, history=True)
    for process in process_tree(pane_pid):
        assert token not in " ".join(process.cmdline())
        assert token not in json.dumps(process.environ())
    assert process_tree(pane_pid)[-1].environ()["FLEET_CHILD"] == "1"
    server = psutil.Process(int(tmux(surfaces.private, "display", "-p", "#{pid}")))
    assert token not in json.dumps(server.environ())
    assert "FLEET_CHILD" not in server.environ()

    [handoff] = fleet.json("stop", "a1")["handoffs"]
    assert handoff["state"] == "stopped"
    until(lambda: server_gone(surfaces.private), "the private server to exit with its last window")
    log = (fleet.home / "sessions" / "t" / "logs" / "a1.log").read_text()
    assert "launched tmux pane %0 (window @0 a1-scout-1)" in log
    assert "The answer is 42." not in log, "a healthy run wrote pane output to its log"
    # The user's server was never touched, and no default server was started.
    assert tmux(surfaces.user_socket, "display", "-p", "#{pid}").strip() == user_pid
    assert tmux(surfaces.user_socket, "list-windows", "-a") == user_windows
    assert sorted(p.name for p in surfaces.tmux_tmpdir.rglob("*")) == ["user"]


VIEW_DRIVER = """
import logging, sys, trio
from rich.console import Console
import ipc
from child._view import ActivityView

async def main():
    logging.basicConfig(level=logging.INFO, format="child %(levelname)s %(message)s")
    console = Console(file=sys.stdout, highlight=False)
    view = ActivityView(title="a9 · probe · scout (scout)", key="a9", console=console)
    async with trio.open_nursery() as nursery:
        await nursery.start(view.run)
        view.on_turn(1, "probe the view", side=False)
        view.on_event(ipc.Event(activity="tool_start", tool="grep", text='{"pattern":"x"}'))
        logging.getLogger("child").warning("disk almost full")
        print("stray write to stderr", file=sys.stderr)
        print("DRAWN")
        await trio.sleep(30)

trio.run(main)
"""


def test_the_pane_view_keeps_logging_and_stray_writes_inside_its_frame(surfaces):
    repo_root = str(Path(__file__).resolve().parents[2])
    surfaces.start_user_server(command=["-c", repo_root, "--", sys.executable, "-c", VIEW_DRIVER])

    def screen() -> list[str]:
        out = tmux(surfaces.user_socket, "capture-pane", "-p", "-t", "mine:editor")
        return [line.rstrip() for line in out.splitlines() if line.strip()]

    until(lambda: any("DRAWN" in line for line in screen()), "the view to draw")
    lines = screen()
    assert lines[0].startswith("╭─ a9 · probe · scout (scout) ─")
    assert lines[-1].startswith("╰─")
    assert lines[-1].endswith(" ─╯")
    assert all(line.startswith("│") and line.endswith("│") for line in lines[1:-1])
    rows = [line.strip("│ ") for line in lines[1:-1]]
    assert "log   WARNING disk almost full" in rows
    assert "stray write to stderr" in rows
    assert "DRAWN" in rows


def test_fleet_attach_moves_a_client_to_the_childs_window(fleet, surfaces):
    model = fleet.script("hang", HANG)
    for name in ("left", "right"):
        fleet.json("spawn", "--surface", "tmux", "--model", model, "--name", name, "wait")
    target = fleet.json("attach", "a2")
    assert target == {
        "socket": str(surfaces.private),
        "target": target["target"],
        "window": "a2-right",
    }
    assert target["target"].startswith("@")
    assert fleet.json("attach")["target"] == "=fleet-t"

    # A terminal outside the fleet's server: `fleet attach a1` nests a client there.
    attach = [sys.executable, "-m", "orchestrator", "attach", "a1"]
    surfaces.start_user_server(command=["-c", str(fleet.repo), "--", *attach])

    def client_window() -> str:
        out = tmux(surfaces.private, "list-clients", "-F", "#{client_name} #{window_name}")
        return out.strip()

    until(lambda: client_window().endswith(" a1-left"), "a client on a1's window")
    client = client_window().split()[0]

    # Inside the fleet's own server: `fleet attach a2` switches that same client over.
    env = [f"FLEET_HOME={fleet.home}", "FLEET_SESSION=t"]
    switch = ["env", *env, sys.executable, "-m", "orchestrator", "attach", "a2"]
    tmux(
        surfaces.private,
        "new-window",
        "-d",
        "-t",
        "=fleet-t:",
        "-c",
        str(fleet.repo),
        "--",
        *switch,
    )
    until(
        lambda: (
            tmux(surfaces.private, "display", "-p", "-c", client, "#{window_name}").strip()
            == "a2-right"
        ),
        "the client to switch to a2's window",
    )
    fleet.json("stop", "--all")
    until(lambda: server_gone(surfaces.private), "the private server to exit")


def test_attach_refuses_a_process_child_in_one_line(fleet, surfaces):
    fleet.json("spawn", "--model", fleet.script("hang", HANG), "wait")
    result = fleet.run("attach", "a1")
    assert result.returncode == 2
    assert result.stderr == (
        "fleet attach: a1 runs as a plain process, not in tmux (spawn with --surface tmux)\n"
    )
    result = fleet.run("attach")
    assert result.returncode == 2
    assert "no child runs in the fleet's tmux session" in result.stderr


def test_a_killed_pane_is_a_classified_failure_with_its_screen_redacted(fleet, surfaces):
    # The tools refuse the state directory (the loadout too), so the test plants the token in
    # the workspace for the child to print, standing in for a leaked secret.
    leak = fleet.repo / "leak.txt"
    model = fleet.script(
        "leak",
        """
        turns:
          - steps:
              - wait: 2
              - tool: grep
                args: {pattern: '"token"', path: "leak.txt"}
              - say: "{{last}}"
              - hang: true
        """,
    )
    with surfaces.keeping_loadout("a1"):
        fleet.json("spawn", "--surface", "tmux", "--max-subagents", "2", "--model", model, "leak")
    token = surfaces.token("a1")
    leak.write_text(f'"token": "{token}"\n')
    pane_id, pane_pid = surfaces.pane("a1-scout-1")
    until(lambda: token in surfaces.screen(pane_id), "the token on the pane's screen")

    os.kill(pane_pid, signal.SIGKILL)
    result = fleet.run("wait", "a1", "--timeout", "30", "--json")
    assert result.returncode == 1, result.stderr
    [note] = json.loads(result.stdout)["settled"]
    failure = note["failure"]
    assert note["state"] == "failed"
    assert (failure["kind"], failure["transport"]) == ("killed", "tmux")
    assert failure["error"] == "child killed by SIGKILL"
    assert "│ task   leak" in failure["tail"]
    assert "─ a1 working · turn 1 · " in failure["tail"]
    assert "[redacted]" in failure["tail"]
    assert token not in failure["tail"]
    log = Path(failure["log"]).read_text()
    assert "--- recent output ---" in log
    assert "│ task   leak" in log
    assert token not in log
    until(lambda: server_gone(surfaces.private), "the failed child's window to close")
    peek = fleet.json("peek", "--locks")
    assert (peek["agents"], peek["lane"]["working"], peek["locks"]) == ([], 0, {})
    # Both slots of a cap of 2 are free again.
    again = fleet.script("hang", HANG)
    for _ in range(2):
        fleet.json("spawn", "--surface", "tmux", "--max-subagents", "2", "--model", again, "x")
    fleet.json("stop", "--all")


def test_kept_failed_windows_stay_for_a_person_to_read(fleet, surfaces):
    fleet.env["FLEET_KEEP_FAILED_PANES"] = "1"
    model = fleet.script(
        "crash", "turns:\n  - steps:\n      - say: going down\n      - wait: 1\n      - crash: 3\n"
    )
    fleet.json("spawn", "--surface", "tmux", "--model", model, "crash")
    result = fleet.run("wait", "a1", "--timeout", "30", "--json")
    [note] = json.loads(result.stdout)["settled"]
    assert (note["failure"]["kind"], note["failure"]["error"]) == (
        "exited",
        "child exited with code 3",
    )
    assert "going down" in note["failure"]["tail"]
    pane_id, _ = surfaces.pane("a1-scout-1")
    assert tmux(surfaces.private, "display", "-p", "-t", pane_id, "#{pane_dead}") == "1\n"
    kill_server(surfaces.private)  # the person closes it


def test_tmux_current_uses_the_users_session_and_never_kills_it(fleet, surfaces):
    user_pid = surfaces.start_user_server()
    session = tmux(surfaces.user_socket, "display", "-p", "-t", "mine", "#{session_id}").strip()
    model = fleet.script("hang", HANG)
    result = fleet.run("spawn", "--surface", "tmux:current", "--model", model, "x")
    assert result.returncode == 2
    assert result.stderr.startswith("fleet spawn: --surface tmux:current needs $TMUX")
    fleet.run("serve", "--stop")

    fleet.env["TMUX"] = f"{surfaces.user_socket},{user_pid},{session[1:]}"
    fleet.json("spawn", "--surface", "tmux:current", "--model", model, "x")
    names = lambda: tmux(surfaces.user_socket, "list-windows", "-t", "mine", "-F", "#{window_name}")  # noqa: E731
    assert names() == "editor\na1-scout-1\n"
    fleet.json("stop", "a1")
    until(lambda: names() == "editor\n", "only the user's own window")
    assert tmux(surfaces.user_socket, "display", "-p", "#{pid}").strip() == user_pid
    assert not surfaces.private.exists()


def test_fleet_top_draws_one_live_table_and_clears_when_the_fleet_empties(fleet, surfaces):
    model = fleet.script("work", WORK.replace("WAIT", "4"))
    fleet.json("spawn", "--surface", "tmux", "--model", model, "--name", "reader", "find it")
    fleet.json("spawn", "--model", fleet.script("hang", HANG), "--name", "sleeper", "wait")
    top = [sys.executable, "-m", "orchestrator", "top"]
    surfaces.start_user_server(
        command=["-c", str(fleet.repo), "--", "sh", "-c", f"{' '.join(top)}; sleep 30"]
    )

    def view() -> str:
        return tmux(surfaces.user_socket, "capture-pane", "-p", "-t", "mine:editor")

    until(
        lambda: "a1   reader" in view() and "a2   sleeper" in view(), "both children in the table"
    )
    lines = view().splitlines()
    assert lines[0] == "session t · mode build · cap 4 · lane 2/3 working, 0 queued"
    assert lines[1].split() == [
        "KEY",
        "NAME",
        "STATE",
        "MODE",
        "DONE",
        "AGE",
        "SURFACE",
        "ACTIVITY",
    ]
    assert lines[2].split()[:3] == ["a1", "reader", "working"]
    assert "tmux" in lines[2].split()
    assert lines[3].split()[:7] == [
        "a2",
        "sleeper",
        "working",
        "scout",
        "-",
        lines[3].split()[5],
        "process",
    ]
    fleet.json("stop", "a2")
    until(lambda: "a2   sleeper" not in view(), "a2 to leave the table")
    fleet.json("stop", "a1")
    until(lambda: view().startswith("fleet is empty\n"), "the view to clear")


def test_peek_watch_without_a_terminal_prints_one_line_per_change(fleet, surfaces):
    model = fleet.script("work", WORK.replace("WAIT", "1"))
    fleet.json("spawn", "--surface", "tmux", "--model", model, "go")
    watch = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "peek", "--watch"],
        cwd=fleet.repo,
        env=fleet.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    stdout = watch.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in stdout))
    reader.start()
    try:
        fleet.json("wait", "a1", "--timeout", "30")
        # The watch samples the fleet: stop only once it has shown the settled child.
        deadline = time.monotonic() + 30
        while not any(" done " in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        fleet.json("stop", "a1")
        watch.wait(timeout=30)
    finally:
        watch.kill()
        reader.join(timeout=10)
        stdout.close()
    # A settled child reads done; an activity that repeats the state is not said twice.
    assert lines[-2] == "a1 scout-1 done scout 1/2 tmux"
    assert lines[-1] == "a1 scout-1 stopped scout 1/2 tmux (left the fleet)"
    assert len(lines) == len(set(lines)), "a line repeated without a change"


@pytest.fixture
def cmux(fleet, tmp_path) -> Iterator[CmuxFake]:
    socket = Path(f"/tmp/cmx-{os.getpid()}-{time.monotonic_ns()}.sock")
    binary = tmp_path / "cmux-bin" / "cmux"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    fleet.env["CMUX_SOCKET_PATH"] = str(socket)
    fleet.env["PATH"] = f"{binary.parent}:{fleet.env['PATH']}"
    with CmuxFake(socket) as fake:
        yield fake


def test_a_cmux_child_completes_its_task_and_its_surface_closes(fleet, cmux):
    model = fleet.script("work", WORK.replace("WAIT", "0"))
    with keeping_loadout(fleet, "a1") as kept:
        fleet.json("spawn", "--surface", "cmux", "--model", model, "find it")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert "The answer is 42." in note["report"]
    assert not (fleet.home / "sessions" / "t" / "loadouts" / "a1.json").exists()
    token = kept.read_text()
    [typed] = cmux.typed()
    assert "FLEET_CHILD=1 sh -c" in typed
    assert json.loads(token)["token"] not in typed
    fleet.json("stop", "a1")
    assert cmux.closed == ["SURFACE-1"]


def test_a_refused_cmux_launch_is_shown_once_with_its_class(fleet, cmux):
    cmux.mode = "denied"
    # A child that failed at launch: spawn says so (exit 1 with the reason), and wait shows it.
    [spawned] = fleet.json(
        "spawn", "--surface", "cmux", "--model", fleet.script("hang", HANG), "x", code=1
    )["agents"]
    assert spawned["state"] == "failed", spawned
    assert "cmux" in spawned["error"], spawned
    result = fleet.run("wait", "a1", "--timeout", "30", "--json")
    assert result.returncode == 1
    [note] = json.loads(result.stdout)["settled"]
    assert note["failure"]["kind"] == "auth-rejected"
    assert note["failure"]["transport"] == "cmux"
    assert note["failure"]["error"].startswith("cmux auth-rejected: ERROR: Access denied")
    log = Path(note["failure"]["log"]).read_text()
    assert log.count("failed (auth-rejected) over cmux: cmux auth-rejected") == 1
    assert cmux.requests == [], "cmux refused before reading any request"
