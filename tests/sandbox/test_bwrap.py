"""Real bubblewrap: what a sandboxed child can and cannot do (DESIGN.md §7, §10)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
import trio
from trio._core import _thread_cache as trio_thread_cache

from sandbox import Policy, SandboxSpec, wrap
from tests.sandbox.conftest import with_runtime

if TYPE_CHECKING:
    from collections.abc import Callable

WRITE_DENIED = {"EROFS", "EPERM", "EACCES"}


def _listener() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0)  # non-blocking: accept() says at once whether a connection is queued
    return server


async def _wait_until(predicate: Callable[[], bool], *, within: float) -> None:
    """Poll OS state (a process table, a listen queue) that offers nothing to wait on."""
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - there is no event for another process's state
            await trio.sleep(0.02)


def _pending_connection(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


async def test_read_only_reads_repo_and_writes_only_scratch(layout, attempt):
    home_probe = Path.home() / f".fleet-sandbox-test-{secrets.token_hex(6)}"
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, visible=(layout.repo,))
    try:
        result = await attempt(
            spec,
            f"read:{layout.repo / 'README'}",
            f"append:{layout.repo / 'README'}",
            f"create:{layout.repo / 'new'}",
            f"create:{home_probe}",
            f"create:{layout.scratch / 'out'}",
        )
        assert not home_probe.exists()
    finally:
        with contextlib.suppress(FileNotFoundError):
            home_probe.unlink()
    assert result[f"read:{layout.repo / 'README'}"] == "ok:original"
    assert result[f"append:{layout.repo / 'README'}"] == "EROFS"
    assert result[f"create:{layout.repo / 'new'}"] == "EROFS"
    assert result[f"create:{home_probe}"] == "EROFS"
    assert result[f"create:{layout.scratch / 'out'}"] == "ok"
    assert (layout.repo / "README").read_text() == "original"
    assert not (layout.repo / "new").exists()
    assert (layout.scratch / "out").read_text() == "created"


async def test_read_only_cannot_reach_a_loopback_listener_the_host_can(layout, attempt):
    with _listener() as server:
        host, port = server.getsockname()
        with socket.create_connection((host, port), timeout=5):
            pass
        await _wait_until(lambda: _pending_connection(server), within=5)
        spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
        result = await attempt(spec, f"tcp:{host}:{port}")
        assert result[f"tcp:{host}:{port}"] in {"ECONNREFUSED", "ENETUNREACH"}
        assert not _pending_connection(server)


async def test_review_reaches_a_loopback_listener(layout, attempt):
    with _listener() as server:
        host, port = server.getsockname()
        spec = SandboxSpec(policy=Policy.REVIEW, scratch=layout.scratch, visible=(layout.repo,))
        result = await attempt(spec, f"tcp:{host}:{port}", f"append:{layout.repo / 'README'}")
        assert result[f"tcp:{host}:{port}"] == "ok"
        assert result[f"append:{layout.repo / 'README'}"] == "EROFS"
        assert _pending_connection(server)


async def test_path_unix_socket_in_private_dir_is_reachable_and_peer_is_our_uid(layout, attempt):
    path = layout.ipc / "s"
    abstract = f"fleet-sandbox-test-{secrets.token_hex(6)}"
    with (
        socket.socket(socket.AF_UNIX) as server,
        socket.socket(socket.AF_UNIX) as abstract_server,
    ):
        server.bind(str(path))
        server.listen()
        abstract_server.bind("\0" + abstract)
        abstract_server.listen()
        spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, sockets=(layout.ipc,))
        result = await attempt(spec, f"unix:{path}", f"abstract:{abstract}")
        assert result[f"unix:{path}"] == "ok"
        # Abstract sockets live in the network namespace, which the sandbox replaced.
        assert result[f"abstract:{abstract}"] == "ECONNREFUSED"
        server.settimeout(5)
        conn, _ = server.accept()
        with conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", creds)
            assert uid == os.getuid()
            assert pid > 0
            assert conn.recv(16) == b"hello"


async def test_root_child_cannot_remount_root_and_has_no_capabilities(layout, run_inside):
    script = (
        "mount -o remount,rw / 2>/dev/null; echo mount=$?; "
        "grep CapEff /proc/self/status; "
        "mkdir /fleet-sandbox-remount-test 2>/dev/null; echo mkdir=$?"
    )
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    done = await run_inside(spec, "/bin/sh", "-c", script)
    found = dict(re.findall(r"^(\w+)[=:]\s*(\w+)$", done.stdout.decode(), re.MULTILINE))
    assert found["mount"] != "0"
    assert found["CapEff"] == "0000000000000000"
    assert found["mkdir"] != "0"
    assert not await trio.Path("/fleet-sandbox-remount-test").exists()
    if os.getuid() == 0:
        # The same process outside the sandbox does hold capabilities: the check can fail.
        status = await trio.Path("/proc/self/status").read_text()
        assert "CapEff:\t0000000000000000" not in status


async def test_killing_bwrap_kills_a_setsid_grandchild(layout, bwrap_works):
    marker = f"fleet-sandbox-grandchild-{secrets.token_hex(6)}"
    sleeper = "import time; time.sleep(60)"
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]],"
        " start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap([sys.executable, "-c", code, sleeper, marker], with_runtime(spec))
    # Spawned on the trio thread on purpose: --die-with-parent is tied to the spawning thread.
    proc = subprocess.Popen(wrapped.argv, env={**os.environ, **wrapped.env})  # noqa: ASYNC220
    found: list[psutil.Process] = []

    def find_grandchild() -> bool:
        found.extend(
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if _cmdline(p)[1:] == ["-c", sleeper, marker]
        )
        return bool(found)

    grandchild: psutil.Process | None = None
    try:
        await _wait_until(find_grandchild, within=10)
        grandchild = found[0]
        # It escaped the child's session, so only the pid namespace can still reach it.
        assert os.getsid(grandchild.pid) == grandchild.pid
        proc.send_signal(signal.SIGKILL)
        await _wait_until(lambda: proc.poll() is not None, within=5)
        await _wait_until(lambda: not _alive(grandchild), within=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if grandchild is not None and _alive(grandchild):
            grandchild.kill()


async def test_sandbox_dies_with_the_process_that_spawned_it(layout, bwrap_works):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    sleeper = ("-c", "import time; time.sleep(60)")
    wrapped = wrap([sys.executable, *sleeper], with_runtime(spec))
    spawner_code = (
        "import json, subprocess, sys, time\n"
        "child = subprocess.Popen(json.loads(sys.argv[1]))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    spawner = subprocess.Popen(  # noqa: ASYNC220 - killed below; no trio reaping wanted
        [sys.executable, "-c", spawner_code, json.dumps(wrapped.argv)],
        env={**os.environ, **wrapped.env},
        stdout=subprocess.PIPE,
    )
    sandbox: psutil.Process | None = None
    try:
        assert spawner.stdout is not None
        with trio.fail_after(10):
            line = await trio.to_thread.run_sync(spawner.stdout.readline)
        sandbox = psutil.Process(int(line))
        # bwrap sets PDEATHSIG as it starts; a parent dying before that is not noticed (a
        # start-up race bwrap cannot close), so wait until the command runs inside.
        await _wait_until(
            lambda: any(_cmdline(p)[1:] == list(sleeper) for p in sandbox.children(recursive=True)),
            within=10,
        )
        # The launched pid is bwrap itself (the seccomp shell execs it).
        assert sandbox.name() == "bwrap"
        spawner.kill()
        spawner.wait()
        # PR_SET_PDEATHSIG: the spawner's death SIGKILLs bwrap, and with it the namespace.
        await _wait_until(lambda: not _alive(sandbox), within=5)
    finally:
        spawner.kill()
        spawner.wait()
        if spawner.stdout is not None:
            spawner.stdout.close()
        if sandbox is not None and _alive(sandbox):
            sandbox.kill()


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # exited (or became a zombie) while we looked
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
async def test_child_spawned_from_main_thread_outlives_trio_thread_retirement(
    layout, bwrap_works, monkeypatch
):
    # --die-with-parent fires when the spawning *thread* exits; trio retires idle worker
    # threads after IDLE_TIMEOUT (10 s; 0.3 s here, so the test waits for no real 10 s).
    # Spawned from the main (trio) thread, the child must live on; the control, spawned from
    # a worker thread, dies once that thread retires (so a retirement did happen meanwhile).
    monkeypatch.setattr(trio_thread_cache, "IDLE_TIMEOUT", 0.3)
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap([sys.executable, "-c", "import time; time.sleep(15)"], with_runtime(spec))
    env = {**os.environ, **wrapped.env}
    # Spawned on the trio thread on purpose: --die-with-parent is tied to the spawning thread.
    proc = subprocess.Popen(wrapped.argv, env=env)  # noqa: ASYNC220
    control = await trio.to_thread.run_sync(lambda: subprocess.Popen(wrapped.argv, env=env))
    try:
        # The worker thread retires 0.3 s after its job; its child dies with it. (Polled on
        # the trio thread: a wait in a worker thread would keep that very thread busy.)
        with trio.fail_after(10):
            while control.poll() is None:  # noqa: ASYNC110
                await trio.sleep(0.05)
        await trio.sleep(0.5)
        assert proc.poll() is None
    finally:
        for process in (proc, control):
            process.kill()
            process.wait()


async def test_worker_writes_its_worktree_but_not_the_repo(layout, attempt):
    spec = SandboxSpec(
        policy=Policy.WORKER,
        scratch=layout.scratch,
        visible=(layout.repo,),
        writable=(layout.worktree,),
    )
    result = await attempt(
        spec,
        f"create:{layout.worktree / 'edit.py'}",
        f"append:{layout.repo / 'README'}",
        f"create:{layout.repo / 'new'}",
    )
    assert result == {
        f"create:{layout.worktree / 'edit.py'}": "ok",
        f"append:{layout.repo / 'README'}": "EROFS",
        f"create:{layout.repo / 'new'}": "EROFS",
    }
    assert (layout.worktree / "edit.py").read_text() == "created"
    assert (layout.repo / "README").read_text() == "original"


async def test_symlink_in_scratch_into_the_repo_cannot_write_it(layout, attempt):
    link = layout.scratch / "sneaky"
    link.symlink_to(layout.repo / "README")
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, visible=(layout.repo,))
    result = await attempt(spec, f"append:{link}")
    assert result[f"append:{link}"] in WRITE_DENIED
    assert (layout.repo / "README").read_text() == "original"


async def test_symlink_in_worktree_to_home_cannot_write_home(layout, attempt):
    link = layout.worktree / "home"
    link.symlink_to(Path.home())
    target = f".fleet-sandbox-test-{secrets.token_hex(6)}"
    spec = SandboxSpec(policy=Policy.WORKER, scratch=layout.scratch, writable=(layout.worktree,))
    try:
        result = await attempt(spec, f"create:{link / target}")
        assert not (Path.home() / target).exists()
    finally:
        with contextlib.suppress(FileNotFoundError):
            (Path.home() / target).unlink()
    assert result[f"create:{link / target}"] in WRITE_DENIED


async def test_child_runs_in_cwd_with_venv_and_scratch_temp(layout, run_inside):
    code = (
        "import json, os, sys, tempfile, attrs\n"
        "print(json.dumps([os.getcwd(), sys.prefix != sys.base_prefix, tempfile.gettempdir(),"
        " sys.pycache_prefix, os.getsid(0)]))"
    )
    spec = SandboxSpec(
        policy=Policy.READ_ONLY, scratch=layout.scratch, visible=(layout.repo,), cwd=layout.repo
    )
    done = await run_inside(spec, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr.decode()
    cwd, in_venv, tmp, pycache, session = json.loads(done.stdout)
    assert cwd == str(layout.repo.resolve())
    assert in_venv is True
    assert tmp == str(layout.scratch.resolve())
    assert pycache == str(layout.scratch.resolve() / ".pycache")
    # --new-session: a session begun inside the sandbox (our own session's leader is outside
    # its pid namespace and would read as 0), so it cannot push input into our terminal.
    assert session != 0
