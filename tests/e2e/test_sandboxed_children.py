"""Children inside the OS sandbox, driven through the real supervisor (bubblewrap required)."""

import json
import shlex
import socket
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs("sandbox"),
]


def _spawn_command(fleet, script: str) -> str:
    command = shlex.join(["sh", "-c", script])
    data = fleet.json("spawn", "--backend", "command", "--command", command, "task")
    return str(data["agents"][0]["key"])


def test_a_command_child_is_sandboxed_read_only_with_a_writable_scratch(fleet):
    target = fleet.repo / "src" / "pwned.py"
    key = _spawn_command(
        fleet,
        f'touch "{target}" 2>&1 | tail -1; touch "$HOME/.pwned" 2>&1 | tail -1; '
        'echo scratch > "$TMPDIR/ok" && cat "$TMPDIR/ok"',
    )
    [note] = fleet.json("wait", key, "--timeout", "60")["settled"]
    assert "Read-only file system" in note["report"] or "Permission denied" in note["report"]
    assert note["report"].rstrip().endswith("scratch")
    assert not target.exists()
    [agent] = fleet.json("peek", key)["agents"]
    assert agent["sandboxed"] is True
    [handoff] = fleet.json("stop", key)["handoffs"]
    assert handoff["sandboxed"] is True


def test_a_sandboxed_child_is_not_killed_when_trios_idle_threads_retire(fleet):
    # PDEATHSIG fires when the forking *thread* exits; trio retires idle threads after 10 s.
    started = time.monotonic()
    key = _spawn_command(fleet, "sleep 13; echo survived")
    [note] = fleet.json("wait", key, "--timeout", "60")["settled"]
    assert note["state"] == "idle", note
    assert note["report"].strip() == "survived"
    assert time.monotonic() - started >= 13


def test_network_is_denied_inside_the_sandbox(fleet):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        probe = (
            "import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n"
        )
        command = shlex.join(["python3", "-c", probe])
        data = fleet.json("spawn", "--backend", "command", "--command", command, "net")
        key = data["agents"][0]["key"]
        [note] = fleet.json("wait", key, "--timeout", "60")["settled"]
        assert note["report"].startswith("refused"), note
    finally:
        listener.close()


def test_without_a_sandbox_a_shell_child_is_refused_unless_allowed(fleet):
    fleet.env["PATH"] = "/nonexistent-for-bwrap"  # the CLI finds python by absolute path
    fleet.env["FLEET_SESSION"] = "nobwrap"
    result = fleet.run("spawn", "--backend", "command", "--command", "/bin/true", "--json", "x")
    assert result.returncode == 4, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "policy"
    assert "--allow-unsandboxed" in error["message"]
    fleet.run("serve", "--stop")
