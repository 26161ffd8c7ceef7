"""The web server's lifetime beside its session's supervisor."""

import fcntl
import json
import os
import socket
import stat
import sys

import httpx
import pytest
import trio

from orchestrator._config import SessionPaths
from orchestrator.web._server import ORPHAN_EXIT, _while_supervised
from tests.e2e.conftest import running_fleet


async def test_the_server_ends_once_its_session_has_no_supervisor(tmp_path, autojump_clock):
    lock = tmp_path / "supervisor.lock"
    lock.write_text("4242")
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a supervisor holds the session
    quit_ = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_while_supervised, lock, quit_)
        await trio.sleep(ORPHAN_EXIT * 3)
        assert not quit_.is_set()
        os.close(fd)  # it ended
        gone = trio.current_time()
        await quit_.wait()
        assert ORPHAN_EXIT <= trio.current_time() - gone <= ORPHAN_EXIT + 10


@pytest.mark.slow
def test_fleet_web_starts_once_reuses_its_server_and_each_url_logs_in_once(tmp_path):
    with running_fleet(tmp_path) as fleet:
        try:
            first = fleet.json("web")
            assert first["started"] is True
            state = SessionPaths(root=fleet.home / "sessions" / "t").runtime / "web.json"
            assert stat.S_IMODE(state.stat().st_mode) == 0o600
            second = fleet.json("web")
            assert second["started"] is False
            assert (second["port"], second["pid"]) == (first["port"], first["pid"])
            assert second["url"] != first["url"]  # a new one-time token each time
            base = f"http://127.0.0.1:{first['port']}"
            assert httpx.get(base + "/").status_code == 401
            for url in (first["url"], second["url"]):
                with httpx.Client(follow_redirects=True) as http:
                    assert http.get(url).status_code == 200  # redirected to the fleet
                    assert http.get(url, follow_redirects=False).status_code == 401  # spent
            human = fleet.run("web")
            assert human.returncode == 0
            assert human.stdout.startswith(f"open {base}/login?token=")
            assert fleet.json("web", "--stop") == {"stopped": True}
            assert not state.exists()
            assert fleet.json("web", "--stop") == {"stopped": False}
        finally:
            fleet.run("web", "--stop")


PROBE = """
import json, socket, sys
port, state = int(sys.argv[1]), sys.argv[2]
found = {}
try:
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    found["connect"] = "ok"
except OSError as exc:
    found["connect"] = f"refused: {exc}"
try:
    found["state"] = "ok: " + open(state).read()
except OSError as exc:
    found["state"] = f"refused: {exc}"
open("web-probe.json", "w").write(json.dumps(found))
print("probed")
"""


@pytest.mark.slow
@pytest.mark.needs("sandbox")
def test_a_sandboxed_child_reaches_neither_the_web_view_nor_its_key(tmp_path):
    with running_fleet(tmp_path) as fleet:
        try:
            web = fleet.json("web")
            state = SessionPaths(root=fleet.home / "sessions" / "t").runtime / "web.json"
            (fleet.repo / "probe.py").write_text(PROBE)
            command = f"{sys.executable} probe.py {web['port']} {state}"
            [child] = fleet.json(
                "spawn", "--agent", "worker", "--backend", "command", "--command", command, "p"
            )["agents"]
            [note] = fleet.json("wait", child["key"], "--timeout", "60", timeout=90)["settled"]
            assert "probed" in note["report"], note
            [probe] = fleet.home.glob("**/web-probe.json")
            found = json.loads(probe.read_text())
            assert found["connect"].startswith("refused"), found  # its own network namespace
            assert found["state"].startswith("refused"), found  # the runtime root is hidden
            # The host can, for contrast: the probe would have seen a live server.
            socket.create_connection(("127.0.0.1", web["port"]), timeout=3).close()
        finally:
            fleet.run("web", "--stop")
