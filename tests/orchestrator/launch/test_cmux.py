"""The cmux launcher against a loopback fake of cmux's socket (cmux itself is macOS-only).

The fake's surfaces are real shells, so the children here are real processes typed into them.
"""

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from orchestrator.launch._cmux import (
    CmuxError,
    CmuxLauncher,
    CmuxSurface,
    child_pid,
    command_line,
    exit_status,
)
from orchestrator.launch._launcher import LaunchSpec
from tests.fakes.cmux_server import DENIED, CmuxFake


class Sink:
    def __init__(self):
        self.chunks: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))

    def text(self) -> str:
        return b"".join(data for _, data in self.chunks).decode()


@pytest.fixture
def socket_path():
    # A short path of our own: sun_path is small, and pytest's tmp_path can be long.
    directory = Path(os.path.realpath("/tmp")) / f"cmx-{os.getpid()}-{time.monotonic_ns()}"
    directory.mkdir(mode=0o700)
    yield directory / "cmux.sock"
    for entry in directory.iterdir():
        entry.unlink()
    directory.rmdir()


@pytest.fixture
def cmux_binary(tmp_path):
    binary = tmp_path / "bin" / "cmux"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return str(binary)


def spec(code: str, tmp_path) -> LaunchSpec:
    return LaunchSpec(
        key="a1",
        name="scout-1",
        argv=(sys.executable, "-c", code, str(tmp_path / "loadout.json")),
        cwd=str(tmp_path),
        env={},
    )


def launcher(socket_path, binary, **kwargs) -> CmuxLauncher:
    return CmuxLauncher(socket=str(socket_path), binary=binary, **kwargs)


async def wait_for_screen(surface: CmuxSurface, text: str) -> None:
    with trio.fail_after(10):
        while text not in await surface.read_screen():  # noqa: ASYNC110 - polling a screen
            await trio.sleep(0.05)


@pytest.mark.slow
async def test_a_child_runs_in_a_new_surface_and_closing_keeps_its_screen(
    socket_path, cmux_binary, tmp_path, nursery
):
    code = "import time; print('child up', flush=True); time.sleep(60)"
    sink = Sink()
    with CmuxFake(socket_path) as cmux, trio.fail_after(30):
        surface = await launcher(socket_path, cmux_binary).launch(
            spec(code, tmp_path), sink, nursery
        )
        await wait_for_screen(surface, "child up")
        assert psutil.Process(surface.pid).cmdline() == list(spec(code, tmp_path).argv)
        assert cmux.methods() == [
            "system.ping",
            "surface.split",
            "surface.send_text",
            *["surface.read_text"] * (len(cmux.methods()) - 3),
        ]
        assert cmux.requests[1]["params"] == {"direction": "right"}
        [typed] = cmux.typed()
        assert typed == command_line(spec(code, tmp_path).argv) + "\n"
        assert typed.startswith("FLEET_CHILD=1 ")
        await surface.terminate(grace=2)
        assert surface.exited.is_set()
        assert surface.returncode == -15
        assert cmux.closed == [surface.surface_id]
        assert cmux.methods()[-1] == "surface.close"
    assert [stream for stream, _ in sink.chunks] == ["pane"]
    assert "child up" in sink.text()
    assert not psutil.pid_exists(surface.pid) or psutil.Process(surface.pid).status() == "zombie"


@pytest.mark.slow
@pytest.mark.parametrize(("keep", "closed"), [(False, True), (True, False)])
async def test_a_child_that_fails_on_its_own_reports_its_status_and_may_keep_its_surface(  # noqa: PLR0917 - fixtures
    socket_path, cmux_binary, tmp_path, nursery, keep, closed
):
    code = "import sys; print('broken', flush=True); sys.exit(3)"
    sink = Sink()
    with CmuxFake(socket_path) as cmux, trio.fail_after(30):
        cmux_launcher = launcher(socket_path, cmux_binary, keep_failed=keep)
        surface = await cmux_launcher.launch(spec(code, tmp_path), sink, nursery)
        assert await surface.wait() == 3
        await surface.terminate(grace=2)
        assert (cmux.closed == [surface.surface_id]) is closed
    assert "broken" in sink.text()
    assert "[fleet: child exited 3]" in sink.text()


@pytest.mark.slow
async def test_a_child_killed_by_a_signal_reports_the_signal(
    socket_path, cmux_binary, tmp_path, nursery
):
    code = "import time; print('up', flush=True); time.sleep(60)"
    with CmuxFake(socket_path), trio.fail_after(30):
        surface = await launcher(socket_path, cmux_binary).launch(
            spec(code, tmp_path), Sink(), nursery
        )
        await wait_for_screen(surface, "up")
        os.kill(surface.pid, 9)
        assert await surface.wait() == -9
        await surface.terminate(grace=2)


def test_the_exit_marker_is_parsed_from_the_newest_occurrence():
    assert exit_status("$ x\n[fleet: child exited 0]\n$ y\n[fleet: child exited 137]\n") == -9
    assert exit_status("[fleet: child exited 2]") == 2
    assert exit_status("no marker here") is None


def test_the_typed_line_announces_the_childs_pid_and_quotes_every_argument():
    line = command_line(["/opt/my python/bin/python", "-I", "-m", "child", "/s/it's.json"])
    assert line == (
        'FLEET_CHILD=1 sh -c \'echo "[fleet: child pid $$]"; exec "$@"\' fleet-child '
        "'/opt/my python/bin/python' -I -m child '/s/it'\"'\"'s.json'; "
        'echo "[fleet: child exited $?]"'
    )
    assert child_pid("[fleet: child pid $$]\n[fleet: child pid 4242]\n") == 4242


async def classified(launcher_, tmp_path, nursery, sink=None) -> CmuxError:
    with pytest.raises(CmuxError) as caught:
        await launcher_.launch(spec("print(1)", tmp_path), sink or Sink(), nursery)
    error = caught.value
    assert "\n" not in str(error)
    assert str(error).startswith(f"cmux {error.failure}: ")
    return error


async def test_binary_missing(socket_path, tmp_path, nursery):
    with CmuxFake(socket_path) as cmux, trio.fail_after(10):
        error = await classified(
            launcher(socket_path, "fleet-no-such-cmux-binary"), tmp_path, nursery
        )
        assert cmux.requests == []
    assert error.failure == "binary-missing"
    assert "fleet-no-such-cmux-binary" in str(error)


async def test_socket_unreachable_when_nothing_listens(socket_path, cmux_binary, tmp_path, nursery):
    with trio.fail_after(10):
        error = await classified(launcher(socket_path, cmux_binary), tmp_path, nursery)
    assert error.failure == "socket-unreachable"
    assert error.method == "system.ping"
    assert str(socket_path) in str(error)


@pytest.mark.parametrize(
    ("mode", "failure", "words"),
    [
        ("denied", "auth-rejected", DENIED),
        ("hangup", "auth-rejected", "only processes started inside cmux"),
        ("auth", "auth-rejected", "auth_required"),
        ("garbage", "socket-unreachable", "not cmux's protocol"),
        ("split-fails", "surface-creation-failed", "could not create a terminal surface"),
    ],
)
async def test_each_refusal_is_classified(  # noqa: PLR0917 - fixtures and parameters
    socket_path, cmux_binary, tmp_path, nursery, mode, failure, words
):
    with CmuxFake(socket_path, mode=mode), trio.fail_after(10):
        error = await classified(launcher(socket_path, cmux_binary), tmp_path, nursery)
    assert error.failure == failure
    assert words in str(error)


async def test_a_split_that_never_answers_fails_after_one_second(
    socket_path, cmux_binary, tmp_path, nursery
):
    with CmuxFake(socket_path, mode="split-silent") as cmux, trio.fail_after(10):
        started = time.monotonic()
        error = await classified(launcher(socket_path, cmux_binary), tmp_path, nursery)
        elapsed = time.monotonic() - started
        assert cmux.methods() == ["system.ping", "surface.split"]
    assert error.failure == "surface-creation-failed"
    assert error.method == "surface.split"
    assert "within 1 s" in str(error)
    assert 0.9 <= elapsed < 3


@pytest.mark.slow
async def test_a_child_that_never_starts_fails_and_its_surface_is_closed(
    socket_path, cmux_binary, tmp_path, nursery
):
    sink = Sink()
    with CmuxFake(socket_path, mode="no-start") as cmux, trio.fail_after(20):
        cmux_launcher = launcher(socket_path, cmux_binary, start_timeout=1.5)
        error = await classified(cmux_launcher, tmp_path, nursery, sink)
        assert cmux.closed == ["SURFACE-1"]
    assert error.failure == "surface-creation-failed"
    assert "did not start in surface SURFACE-1 within 1.5 s" in str(error)
    assert [stream for stream, _ in sink.chunks] == ["pane"]
