"""The sandboxed fork server (real bwrap, real forks): what it refuses, and what the launcher
does then (starts the child under bwrap, as without the server)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import TYPE_CHECKING

import psutil
import pytest
import trio

import ipc
from orchestrator._config import Config
from orchestrator._runtime import ensure_session_runtime, session_runtime
from orchestrator.launch._forkserver import ForkServer, ForkServerError
from orchestrator.launch._launcher import LaunchSpec, ProcessLauncher, inherited_child_argv
from orchestrator.launch._sandboxing import fork_server_wrapper

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow
CEILING = 60
PYTHON = os.path.abspath(sys.executable)


def _config(tmp_path: Path) -> Config:
    config = Config(home=tmp_path / "state", session="s", workspace=tmp_path)
    # On the host, hidden in the server's view (as every session's loadouts are).
    config.paths.loadouts.mkdir(parents=True)
    return config


def _view(config: Config, *extra: list[str]) -> dict[str, object]:
    scratch = config.paths.scratch / "c1"
    scratch.mkdir(parents=True, exist_ok=True)
    ops = [
        ["--ro-bind", "/", "/"],
        ["--dev", "/dev"],
        ["--proc", "/proc"],
        ["--tmpfs", "/tmp"],
        ["--tmpfs", str(config.home)],
        *extra,
        ["--bind", str(scratch), str(scratch)],
    ]
    return {"ops": ops, "cwd": str(scratch)}


async def _started(nursery: trio.Nursery, wrapper: tuple[str, ...]) -> ForkServer:
    """A sandboxed fork server under *wrapper*, started and ready."""
    forks = ForkServer(
        python=PYTHON, label="t", env=dict(os.environ), nursery=nursery, wrapper=wrapper
    )
    forks.start()
    assert await forks.ready(), forks.failure
    return forks


async def _spawn(
    forks: ForkServer, view: dict[str, object] | None, output: int | None = None
) -> tuple[int, int]:
    """Fork a child of *forks* with *view*; its output to *output* (a pipe's write end,
    closed here), or to a pipe nobody reads."""
    out_r, out_w = (-1, output) if output is not None else os.pipe()
    pair = socket.socketpair()
    memfd = os.memfd_create("loadout")
    try:
        return await forks.spawn(
            cwd="/",
            env={},
            name="t",
            stdio=(out_w, out_w),
            inherit=(pair[1].fileno(), memfd),
            view=view,
        )
    finally:
        for fd in (out_r, out_w, memfd):
            if fd >= 0:
                os.close(fd)
        for end in pair:
            end.close()


async def test_the_server_refuses_a_plan_that_would_leak_and_a_plain_child(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    wrapper = fork_server_wrapper(config)
    assert wrapper is not None, "bwrap works on every test machine"
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            forks = ForkServer(
                python=PYTHON,
                label="t",
                env=dict(os.environ),
                nursery=nursery,
                wrapper=wrapper,
            )
            forks.start()
            assert await forks.ready(), forks.failure
            with pytest.raises(ForkServerError, match="forks only sandboxed children"):
                await _spawn(forks, None)
            leaky = _view(config)
            leaky["ops"] = [op for op in leaky["ops"] if op != ["--proc", "/proc"]]  # type: ignore[attr-defined]
            with pytest.raises(ForkServerError, match="lacks --proc /proc"):
                await _spawn(forks, leaky)
            unseen = _view(config, ["--ro-bind", str(config.paths.root / "loadouts"), "/x"])
            with pytest.raises(ForkServerError, match="cannot see"):
                await _spawn(forks, unseen)
            await forks.aclose()


async def test_a_child_the_server_cannot_fork_starts_under_its_bwrap_command(
    tmp_path: Path,
) -> None:
    """The launcher falls back to the spec's own argv, with the same descriptors."""
    config = _config(tmp_path)
    wrapper = fork_server_wrapper(config)
    assert wrapper is not None
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            forks = ForkServer(
                python=PYTHON,
                label="t",
                env=dict(os.environ),
                nursery=nursery,
                wrapper=wrapper,
            )
            ours, theirs = socket.socketpair()
            loadout = ipc.sealed_loadout(
                ipc.Loadout(
                    session="s",
                    owner="c1",
                    name="c1",
                    agent="scout",
                    token="0" * 64,
                    socket="",
                    workspace=str(tmp_path),
                    scratch=str(tmp_path),
                    model=ipc.ModelSpec(kind="scripted", script="/nonexistent"),
                )
            )
            argv = (
                "/bin/sh",
                "-c",
                "echo fell back; exit 7",
                *inherited_child_argv(sys.executable, theirs.fileno(), loadout),
            )
            unseen = _view(config, ["--ro-bind", str(config.paths.root / "loadouts"), "/x"])
            spec = LaunchSpec(
                key="c1",
                name="c1",
                argv=argv,
                cwd=str(tmp_path),
                env={"PATH": os.environ["PATH"]},
                inherit=(theirs.fileno(), loadout),
                view=unseen,
            )
            output: list[bytes] = []
            launched = await ProcessLauncher(boxed=forks).launch(
                spec, lambda _stream, chunk: output.append(chunk), nursery
            )
            assert await launched.wait() == 7
            await launched.drain(5)
            assert not launched.forked
            assert b"fell back" in b"".join(output)
            os.close(loadout)
            ours.close()
            theirs.close()
            await forks.aclose()


async def test_a_server_whose_forks_cannot_sandbox_themselves_fails_at_start(
    tmp_path: Path,
) -> None:
    """Without the capabilities of its namespace no fork could build its sandbox: the server
    says so and is never ready (the launcher then starts every sandboxed child under bwrap)."""
    config = _config(tmp_path)
    wrapper = fork_server_wrapper(config)
    assert wrapper is not None
    at = wrapper.index("--cap-add")
    crippled = (*wrapper[:at], "--cap-drop", "ALL", *wrapper[at + 4 :])
    log = tmp_path / "server.log"
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            forks = ForkServer(
                python=PYTHON,
                label="t",
                env=dict(os.environ),
                nursery=nursery,
                wrapper=crippled,
                log_path=log,
            )
            forks.start()
            assert not await forks.ready()
            await forks.aclose()
    assert "a fork cannot sandbox itself" in log.read_text()


async def test_the_servers_view_hides_every_fleets_runtime_directory_but_its_own_egress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server keeps the host's /tmp; the runtime root (every fleet's sockets and tokens)
    is hidden in it all the same, and only this session's egress sockets come back."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    config = _config(tmp_path)
    other = ensure_session_runtime(session_runtime(tmp_path / "other" / "sessions" / "t"))
    (other / "control.token").write_text("another fleet's token")
    wrapper = fork_server_wrapper(config)
    assert wrapper is not None
    own = str(config.paths.egress)
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            forks = await _started(nursery, wrapper)
            for unseen in (other / "control.token", xdg / "fleet" / "homes", other):
                with pytest.raises(ForkServerError, match="cannot see"):
                    await _spawn(forks, _view(config, ["--ro-bind", str(unseen), "/x"]))
            pid, pidfd = await _spawn(forks, _view(config, ["--ro-bind", own, own]))
            os.close(pidfd)
            await forks.exit_status(pid)
            await forks.aclose()


async def test_nothing_the_server_started_outlives_its_close(tmp_path: Path) -> None:
    """bwrap's inner process (the pid namespace's init: a session of its own, deaf to SIGTERM)
    killed out from under before it set its parent-death signal waited for its gone parent for
    ever; one was found after a test run. Played here by a wrapper that leaves such a process
    behind the server: whatever the server's tree held is gone once it is closed."""
    marker = tmp_path / "sleeper.pid"
    wrapper = (
        "/bin/sh",
        "-c",
        f'setsid sh -c \'trap "" TERM HUP; echo $$ > {marker}; exec sleep 300\' & exec "$@"',
        "sh",
    )
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            forks = await _started(nursery, wrapper)
            while not marker.exists() or not marker.read_text().strip():  # noqa: ASYNC110
                await trio.sleep(0.01)
            sleeper = psutil.Process(int(marker.read_text()))
            await forks.aclose()
        with contextlib.suppress(psutil.Error):
            sleeper.wait(timeout=5)
    with contextlib.suppress(psutil.NoSuchProcess):
        assert sleeper.status() == psutil.STATUS_ZOMBIE, "the server's leftover still runs"


async def test_a_hidden_path_gone_before_the_fork_hides_nothing_and_fails_nothing(
    tmp_path: Path,
) -> None:
    """A fleet home in the plan can be removed before the fork builds the view (another
    fleet's run ends). Below a read-only visible tree its mount point cannot be made: the fork
    failed with ``EROFS`` once in a full run. There is nothing left to hide: the child starts."""
    config = _config(tmp_path)
    wrapper = fork_server_wrapper(config)
    assert wrapper is not None
    visible = tmp_path / "visible"
    visible.mkdir()
    gone_dir, gone_file = visible / "fleet-home", visible / "fleet.token"
    view = _view(
        config,
        ["--ro-bind", str(visible), str(visible)],
        ["--tmpfs", str(gone_dir)],
        ["--ro-bind", os.devnull, str(gone_file)],
    )
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            forks = await _started(nursery, wrapper)
            out_r, out_w = os.pipe()
            await _spawn(forks, view, output=out_w)
            with os.fdopen(out_r, "rb") as out:
                said = await trio.to_thread.run_sync(out.read)
            await forks.aclose()
    assert b"could not start the child" not in said, said
    assert not gone_dir.exists()
    assert not gone_file.exists()
