"""The tmux launcher against real tmux servers on private sockets (never the user's default).

The "user's" server in these tests is one the test starts itself on its own socket.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from orchestrator._errors import UsageError
from orchestrator.launch._launcher import LaunchSpec
from orchestrator.launch._tmux import TmuxLauncher, TmuxPane, window_name

pytestmark = pytest.mark.needs("tmux")

UP = "import time; print('pane up', flush=True); time.sleep(60)"


class Sink:
    def __init__(self):
        self.chunks: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))

    def text(self) -> str:
        return b"".join(data for _, data in self.chunks).decode()


def tmux(socket: str, *args: str) -> str:
    result = subprocess.run(
        ["tmux", "-S", socket, *args], capture_output=True, text=True, timeout=10, check=True
    )
    return result.stdout


def server_alive(socket: str) -> bool:
    """Whether a server answers on *socket* with a session, a few seconds' grace to exit."""
    deadline = time.monotonic() + 5
    while True:
        result = subprocess.run(
            ["tmux", "-S", socket, "list-sessions"], capture_output=True, timeout=10, check=False
        )
        if result.returncode != 0 or time.monotonic() > deadline:
            return result.returncode == 0
        time.sleep(0.05)


def start_user_server(socket: str, env: dict[str, str]) -> None:
    """Stand in for the user's own tmux: a session "mine" with one window, "editor"."""
    subprocess.run(
        [
            "tmux",
            "-S",
            socket,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "mine",
            "-n",
            "editor",
        ],
        check=True,
        env=env,
        timeout=10,
    )


@pytest.fixture
def session_dir():
    # sun_path is short: keep the socket path well under it, whatever pytest's tmp_path is.
    directory = Path(f"/tmp/tmx-{os.getpid()}-{time.monotonic_ns()}")
    directory.mkdir(mode=0o700)
    yield directory
    socket = str(directory / "tmux.sock")
    subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True, check=False)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def base_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}


def spec(code: str, tmp_path, base_env, key="a1", name="scout-1") -> LaunchSpec:
    return LaunchSpec(
        key=key,
        name=name,
        argv=(sys.executable, "-c", code),
        cwd=str(tmp_path),
        env={**base_env, "FLEET_CHILD": "1", "TMPDIR": str(tmp_path)},
    )


async def screen_shows(pane: TmuxPane, text: str) -> str:
    with trio.fail_after(10):
        while True:
            screen = tmux(pane.server.socket, "capture-pane", "-p", "-t", pane.pane_id)
            if text in screen:
                return screen
            await trio.sleep(0.05)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.slow
async def test_a_child_runs_in_its_own_named_window_of_a_private_server(
    session_dir, tmp_path, base_env, nursery
):
    launcher = TmuxLauncher.private(session_dir / "tmux.sock", "t", base_env=base_env)
    sink = Sink()
    with trio.fail_after(30):
        pane = await launcher.launch(spec(UP, tmp_path, base_env), sink, nursery)
        await screen_shows(pane, "pane up")
        socket = str(session_dir / "tmux.sock")
        windows = tmux(socket, "list-windows", "-a", "-F", "#{session_name} #{window_name}")
        assert windows.split("\n")[0] == "fleet-t a1-scout-1"
        assert tmux(socket, "display", "-p", "-t", pane.pane_id, "#{pane_pid}").strip() == str(
            pane.pid
        )
        assert tmux(socket, "show-options", "-w", "-v", "-t", pane.window_id, "remain-on-exit") == (
            "on\n"
        )
        env = environ(pane.pid)
        assert env["FLEET_CHILD"] == "1"
        assert env["TMPDIR"] == str(tmp_path)
        assert env["PATH"] == base_env["PATH"]
        assert os.stat(session_dir).st_mode & 0o777 == 0o700
        await pane.terminate(grace=2)
        assert pane.returncode == -signal.SIGTERM
        assert not server_alive(socket), "the private server outlived its last window"
    assert [stream for stream, _ in sink.chunks] == ["pane"]
    assert sink.text() == "pane up\n"


@pytest.mark.slow
@pytest.mark.parametrize(("keep", "kept"), [(False, False), (True, True)])
async def test_a_pane_that_fails_on_its_own_reports_its_status_and_may_stay(  # noqa: PLR0917 - fixtures
    session_dir, tmp_path, base_env, nursery, keep, kept
):
    code = "import sys; print('about to fail', flush=True); sys.exit(3)"
    launcher = TmuxLauncher.private(
        session_dir / "tmux.sock", "t", base_env=base_env, keep_failed=keep
    )
    sink = Sink()
    with trio.fail_after(30):
        pane = await launcher.launch(spec(code, tmp_path, base_env), sink, nursery)
        assert await pane.wait() == 3
        await pane.terminate(grace=2)
    socket = str(session_dir / "tmux.sock")
    if kept:
        assert tmux(socket, "display", "-p", "-t", pane.pane_id, "#{pane_dead}") == "1\n"
    else:
        assert not server_alive(socket)
    assert sink.text().startswith("about to fail\n")


@pytest.mark.slow
async def test_a_killed_pane_process_reports_the_signal_and_its_screen(
    session_dir, tmp_path, base_env, nursery
):
    launcher = TmuxLauncher.private(session_dir / "tmux.sock", "t", base_env=base_env)
    sink = Sink()
    with trio.fail_after(30):
        pane = await launcher.launch(spec(UP, tmp_path, base_env), sink, nursery)
        await screen_shows(pane, "pane up")
        os.kill(pane.pid, signal.SIGKILL)
        assert await pane.wait() == -signal.SIGKILL
        await pane.terminate(grace=2)
    assert sink.text().startswith("pane up\n")


@pytest.mark.slow
async def test_a_closed_pane_is_a_hang_up_and_says_so(session_dir, tmp_path, base_env, nursery):
    launcher = TmuxLauncher.private(session_dir / "tmux.sock", "t", base_env=base_env)
    sink = Sink()
    with trio.fail_after(30):
        pane = await launcher.launch(spec(UP, tmp_path, base_env), sink, nursery)
        await screen_shows(pane, "pane up")
        tmux(pane.server.socket, "kill-pane", "-t", pane.pane_id)
        assert await pane.wait() == -signal.SIGHUP
        await pane.terminate(grace=2)
        assert pane.closed
    assert sink.text() == (
        f"[fleet] tmux pane {pane.pane_id} was closed; there is no screen to capture\n"
    )


@pytest.mark.slow
async def test_concurrent_launches_share_one_session_with_distinct_windows(
    session_dir, tmp_path, base_env, nursery
):
    launcher = TmuxLauncher.private(session_dir / "tmux.sock", "t", base_env=base_env)
    panes: list[TmuxPane] = []

    async def one(index: int) -> None:
        launch_spec = spec(UP, tmp_path, base_env, key=f"a{index}", name=f"w{index}")
        panes.append(await launcher.launch(launch_spec, Sink(), nursery))

    with trio.fail_after(30):
        async with trio.open_nursery() as starting:
            for index in range(1, 5):
                starting.start_soon(one, index)
        socket = str(session_dir / "tmux.sock")
        names = tmux(socket, "list-windows", "-t", "=fleet-t", "-F", "#{window_name}").split()
        assert sorted(names) == ["a1-w1", "a2-w2", "a3-w3", "a4-w4"]
        assert tmux(socket, "list-sessions", "-F", "#{session_name}").split() == ["fleet-t"]
        for pane in panes:
            await pane.terminate(grace=2)
    assert not server_alive(socket)


@pytest.mark.slow
async def test_tmux_current_uses_the_users_session_and_leaves_the_rest_alone(
    session_dir, tmp_path, base_env, nursery
):
    user = str(session_dir / "user.sock")
    start_user_server(user, base_env)
    try:
        server_pid = tmux(user, "display", "-p", "#{pid}").strip()
        session_id = tmux(user, "display", "-p", "-t", "mine", "#{session_id}").strip()
        environ_ = {**base_env, "TMUX": f"{user},{server_pid},{session_id[1:]}"}
        launcher = TmuxLauncher.current(environ_)
        with trio.fail_after(30):
            pane = await launcher.launch(spec(UP, tmp_path, environ_), Sink(), nursery)
            await screen_shows(pane, "pane up")
            names = tmux(user, "list-windows", "-t", "mine", "-F", "#{window_name}").split()
            assert names == ["editor", "a1-scout-1"]
            await pane.terminate(grace=2)
        assert tmux(user, "list-windows", "-t", "mine", "-F", "#{window_name}").split() == [
            "editor"
        ]
        assert tmux(user, "display", "-p", "#{pid}").strip() == server_pid
    finally:
        tmux(user, "kill-server")


def test_tmux_current_without_tmux_is_a_one_line_usage_error():
    with pytest.raises(UsageError) as caught:
        TmuxLauncher.current({"PATH": "/usr/bin"})
    assert "\n" not in str(caught.value)
    assert "--surface tmux:current needs $TMUX" in str(caught.value)


def test_only_what_the_supervisor_added_goes_on_the_window_argv(session_dir):
    base = {"PATH": "/usr/bin", "OPENAI_API_KEY": "sk-secret", "http_proxy": "http://p"}
    child = {"PATH": "/usr/bin", "OPENAI_API_KEY": "sk-secret", "FLEET_CHILD": "1"}
    private = TmuxLauncher.private(session_dir / "tmux.sock", "t", base_env=base)
    inherited, flags = private.window_env(child)
    assert inherited == {"PATH": "/usr/bin", "OPENAI_API_KEY": "sk-secret"}
    assert flags == ["-e", "FLEET_CHILD=1"]
    current = TmuxLauncher.current({**base, "TMUX": "/tmp/x,1,0"})
    assert current.window_env(child)[1] == ["-e", "FLEET_CHILD=1", "-e", "http_proxy="]


def test_window_names_are_key_dash_name_without_tmux_syntax():
    assert window_name("a1", "scout-1") == "a1-scout-1"
    assert window_name("a2", "fix: the.bug #3") == "a2-fix-the.bug-3"
