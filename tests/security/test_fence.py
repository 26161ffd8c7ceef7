"""No child reaches another fleet of the same user (issue 36, critical).

Two real supervisors under the real CLI: fleet A (its home under /tmp) and fleet B (its home
under /var/tmp, which no sandbox's tmpfs covers), both with ``XDG_RUNTIME_DIR`` outside /tmp
so that only the explicit hiding of the runtime root keeps B's sockets and token out of view.
B runs a child in a pane of its private tmux server. A sandboxed hostile ``command`` child of A,
handed every path of B and B's real control token, tries to list and read B's home and the
runtime root, read B's token, connect to B's control socket and ping with the token, connect
to B's IPC listener, and ``tmux -S <B's socket> run-shell 'touch <marker>'``. Every attempt
fails, the marker never appears, and B serves its parent as before — with B started before
A's child and, the second time, after it (the child waits for a go file in its workspace).

A bwrap'd process that is handed a bound control socket and the real token is refused by the
namespace check alone, and counted.
"""

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator._runtime import runtime_root
from tests.e2e.conftest import Fleet, running_fleet

pytestmark = pytest.mark.slow

HOLD = "turns:\n  - steps:\n      - wait: 120\n        until: steer\n      - reply: held\n"

ATTACK = textwrap.dedent(
    r"""
    import errno, json, os, socket, subprocess, sys, time

    from orchestrator.control._blocking import Connection

    go = os.path.join(os.getcwd(), "go.json")
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.2)
    t = json.load(open(go))
    out = {}

    def attempt(name, fn):
        try:
            out[name] = "ok:" + json.dumps(fn())[:300]
        except Exception as exc:
            code = errno.errorcode.get(getattr(exc, "errno", None) or 0)
            out[name] = "failed:" + (code or f"{type(exc).__name__}: {exc}")[:120]

    def read(path):
        with open(path) as f:
            return f.read()

    def connect(path):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            return "connected"

    def ping(path, token):
        connection = Connection.open(path, token, timeout=5)
        try:
            return connection.request("ping", {}, timeout=5)
        finally:
            connection.close()

    def tmux(sock, marker):
        done = subprocess.run(
            ["tmux", "-S", sock, "run-shell", "touch " + marker],
            capture_output=True, text=True, timeout=20,
        )
        if done.returncode != 0:
            raise OSError(done.stderr.strip()[:100] or f"exit {done.returncode}")
        return "ran"

    attempt("list-home", lambda: sorted(os.listdir(t["home"])))
    attempt("list-session", lambda: sorted(os.listdir(t["session"])))
    attempt("read-journal", lambda: read(t["journal"]))
    attempt("list-runtime-root", lambda: sorted(os.listdir(t["runtime_root"])))
    attempt("list-registry", lambda: sorted(os.listdir(t["runtime_root"] + "/homes")))
    attempt("list-runtime", lambda: sorted(os.listdir(t["runtime"])))
    attempt("read-token", lambda: read(t["token_file"]))
    attempt("connect-control", lambda: connect(t["control"]))
    attempt("ping-control", lambda: ping(t["control"], t["token"]))
    attempt("connect-ipc", lambda: connect(t["ipc"]))
    attempt("tmux", lambda: tmux(t["tmux"], t["marker"]))
    with open(os.path.join(os.environ["TMPDIR"], "fence.json"), "w") as f:
        json.dump(out, f)
    print("done")
    """
)


@pytest.fixture
def runtime_dir() -> Iterator[str]:
    """An ``XDG_RUNTIME_DIR`` of ours outside /tmp: only explicit hiding keeps it unseen."""
    path = tempfile.mkdtemp(prefix="fence-xdg-", dir="/var/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _spawn_attacker(fleet: Fleet) -> str:
    command = shlex.join([sys.executable, "-c", ATTACK])
    data = fleet.json("spawn", "--backend", "command", "--command", command, "attack")
    key = str(data["agents"][0]["key"])
    peeked = fleet.json("peek", key)["agents"][0]
    assert peeked["sandboxed"] is True, peeked
    return key


def _start_victim(fleet: Fleet) -> str:
    """B's own child, in a pane of B's private tmux server (so that server runs)."""
    model = fleet.script("hold", HOLD)
    data = fleet.json("spawn", "--surface", "tmux", "--model", model, "hold")
    key = str(data["agents"][0]["key"])
    deadline = time.monotonic() + 60
    while not fleet.paths.tmux_socket.exists():
        assert time.monotonic() < deadline, "B's tmux server never started"
        time.sleep(0.2)
    return key


def _targets(fleet: Fleet, marker: Path) -> dict[str, Any]:
    paths = fleet.paths
    return {
        "home": str(fleet.home),
        "session": str(paths.root),
        "journal": str(paths.journal),
        "runtime_root": str(runtime_root(fleet.env)),
        "runtime": str(paths.runtime),
        "token_file": str(paths.control_token),
        "token": paths.control_token.read_text().strip(),
        "control": str(paths.control_socket),
        "ipc": str(paths.ipc_socket),
        "tmux": str(paths.tmux_socket),
        "marker": str(marker),
    }


def _results(fleet: Fleet, key: str) -> dict[str, str]:
    [note] = fleet.json("wait", key, "--timeout", "120", timeout=150)["settled"]
    assert note["state"] == "idle", note
    assert note["report"].strip() == "done", note
    path = fleet.paths.root / "scratch" / key / "fence.json"
    data: dict[str, str] = json.loads(path.read_text())
    return data


def _empty_or_failed(result: str) -> bool:
    """A listing shows nothing: it failed, or it shows the empty tmpfs of a hidden tree."""
    return result.startswith("failed:") or result == "ok:[]"


@pytest.mark.parametrize("order", ["b-first", "b-after-the-child"])
def test_a_sandboxed_child_of_one_fleet_reaches_nothing_of_another(tmp_path, runtime_dir, order):
    marker = Path(tempfile.mkdtemp(prefix="fence-", dir="/var/tmp")) / "marker"
    env = {"XDG_RUNTIME_DIR": runtime_dir, "FLEET_REJECT_LOG": "1"}
    try:
        with running_fleet(tmp_path, prefix="fla-", env=env) as fleet_a:
            attacker = None
            if order == "b-after-the-child":
                attacker = _spawn_attacker(fleet_a)  # launched before B exists at all
            with running_fleet(
                tmp_path,
                prefix="flb-",
                env=env,
                home_dir="/var/tmp",
            ) as fleet_b:
                victim = _start_victim(fleet_b)
                if attacker is None:
                    attacker = _spawn_attacker(fleet_a)
                targets = _targets(fleet_b, marker)
                (fleet_a.repo / "go.json").write_text(json.dumps(targets))
                got = _results(fleet_a, attacker)
                assert set(got) == {
                    "list-home",
                    "list-session",
                    "read-journal",
                    "list-runtime-root",
                    "list-registry",
                    "list-runtime",
                    "read-token",
                    "connect-control",
                    "ping-control",
                    "connect-ipc",
                    "tmux",
                }, got
                # Every socket and secret of B is out of view, whenever B started.
                for op in ("read-token", "connect-control", "ping-control", "connect-ipc", "tmux"):
                    assert got[op].startswith("failed:"), (op, got[op])
                for op in ("list-runtime-root", "list-registry", "list-runtime"):
                    assert _empty_or_failed(got[op]), (op, got[op])
                if order == "b-first":
                    # B's home existed when the child was made: hidden whole.
                    assert _empty_or_failed(got["list-home"]), got["list-home"]
                    assert got["list-session"].startswith("failed:"), got["list-session"]
                    assert got["read-journal"].startswith("failed:"), got["read-journal"]
                assert not marker.exists(), "tmux ran a command for the child on the host"
                # B serves its parent as before: nothing spawned, nothing refused or counted.
                peek_b = fleet_b.json("peek")
                assert [a["key"] for a in peek_b["agents"]] == [victim]
                assert peek_b["control"]["refused"] == 0
                fleet_b.json("stop", victim)
            fleet_a.json("stop", attacker)
    finally:
        shutil.rmtree(marker.parent, ignore_errors=True)


PING = textwrap.dedent(
    """
    import sys
    from orchestrator.control._blocking import Connection
    from orchestrator._errors import FleetError
    path, token = sys.argv[1], sys.stdin.read().strip()
    try:
        connection = Connection.open(path, token, timeout=5)
        print("ok", connection.request("ping", {}, timeout=5)["session"])
    except FleetError as exc:
        print("refused", exc)
    """
)


def _ping_from(prefix: list[str], fleet: Fleet) -> str:
    paths = fleet.paths
    done = subprocess.run(
        [*prefix, sys.executable, "-I", "-c", PING, str(paths.control_socket)],
        input=paths.control_token.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_sandboxed_process_with_the_socket_and_the_real_token_is_refused(tmp_path):
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    with running_fleet(tmp_path, prefix="fln-", env={"FLEET_REJECT_LOG": "1"}) as fleet:
        assert fleet.json("peek")["control"]["refused"] == 0
        # The same process outside a sandbox is served: the token and the socket are good.
        assert _ping_from([], fleet) == "ok t"
        # In bwrap's own user and pid namespaces, with the host's whole tree (the socket
        # too) in view and the real token on its stdin: refused at the connection.
        sandbox = [
            bwrap,
            "--die-with-parent",
            "--unshare-user",
            "--unshare-pid",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
        ]
        answer = _ping_from(sandbox, fleet)
        assert answer.startswith("refused"), answer
        # The peer is not told why: the refusal is a closed connection.
        assert "namespace" not in answer
        assert fleet.json("peek")["control"]["refused"] == 1
        rejected = (fleet.paths.root / "logs" / "rejected.jsonl").read_text().splitlines()
        [entry] = [json.loads(line) for line in rejected]
        assert entry["kind"] == "control-refused"
        assert "namespace" in entry["args"]["reason"], entry
        assert _ping_from([], fleet) == "ok t"  # the parent is still served
