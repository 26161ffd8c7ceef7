"""Every secret the supervisor holds is redacted on every surface (containment issue, item 6).

Hostile ``command`` children are handed a sibling's token and the control token (the test reads
them and puts them in a file in the workspace) and print them everywhere they can: the report
(stdout), the turn's error (stderr of a failing command), the run's stderr and thus its failure
tail (they write straight to the child process's stderr, then kill it). Neither secret may
reach ``wait``, ``peek``, ``logs``, ``stop``'s handoffs, any run log, the reject log or the
session journal — sandboxed or not — and the fleet keeps serving an honest child.
"""

import json
import os
import re
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.durability import fold, last_supervisor, parse_journal
from tests.security._control_util import (
    control_token,
    hand_over,
    honest_child_works,
    hostile_fleet,
    session_root,
    spawn_payload,
)

__all__ = ["hostile_fleet"]

pytestmark = pytest.mark.slow

LEAK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    handed = json.loads(Path({handed!r}).read_text())
    line = "sibling=" + handed["sibling"] + " control=" + handed["control"]
    # Split across writes, so a redactor that only looks at whole chunks misses it.
    for piece in (line[:40], line[40:90], line[90:]):
        sys.stdout.write(piece); sys.stdout.flush(); time.sleep(0.05)
    print(); sys.stdout.flush()
    sys.stderr.write(line + "\\n"); sys.stderr.flush()
    mode = {mode!r}
    if mode == "fail":
        raise SystemExit(3)  # the turn's error quotes stderr's last line
    if mode == "crash":
        # Straight into the child process's own stderr (the supervisor's pipe), then kill it:
        # the run fails and its failure tail is what it printed last.
        with open(f"/proc/{{os.getppid()}}/fd/2", "w") as err:
            err.write(line + "\\n")
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)
    """
)


_TOKEN_IN_JSON = re.compile(rb'"token":\s*"([0-9a-f]{64})"')


def _processes_of(fleet, key: str) -> list[Path]:
    """*key*'s processes under this session's supervisor: its launched process (from the
    session journal's ``pid`` record) and whatever carries its run marker with that
    supervisor's pid (its ``serve`` record)."""
    try:
        records = parse_journal((session_root(fleet) / "journal.jsonl").read_bytes()).records
    except OSError:
        return []
    facts, serving = fold(records).get(key), last_supervisor(records)
    if serving is None:
        return []
    pids = {facts.pid} if facts is not None and facts.pid else set()
    marker = f"/{key}/{serving.fields['pid']}".encode()
    # A sandboxed fork's launched process is its namespace's init; the child runs below it.
    for pid in list(pids):
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                pids.update(int(child) for child in children.read_text().split())
            except OSError:
                continue
    found = [Path(f"/proc/{pid}") for pid in pids]
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"FLEET_RUN=") and e.endswith(marker) for e in environ):
            found.append(proc)
    return found


def _token_in_memory(proc: Path) -> str | None:
    """The loadout's token, from the bytes the child read its loadout into (root reads any
    process's memory): how an attacker with the sibling's privileges would find it."""
    try:
        maps = (proc / "maps").read_text().splitlines()
        with (proc / "mem").open("rb", buffering=0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                if end - start > 1 << 28:
                    continue
                try:
                    mem.seek(start)
                    found = _TOKEN_IN_JSON.search(mem.read(end - start))
                except OSError:
                    continue
                if found:
                    return found.group(1).decode()
    except OSError:
        return None
    return None


def _sibling_token(fleet, key: str) -> str:
    """The sibling's token, as a hostile child that got hold of it would have it.

    A sandboxed child's loadout memfd stays open in its bwrap process; an unsandboxed (forked)
    child closes it once read, so the token is taken from the child's memory instead.
    """
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for proc in _processes_of(fleet, key):
            try:
                fds = list((proc / "fd").iterdir())
            except OSError:  # it ended since it was listed (a sandbox's set-up process)
                continue
            for fd in fds:
                try:
                    if os.readlink(fd).startswith("/memfd:"):
                        return str(json.loads(fd.read_text())["token"])
                except (OSError, ValueError, KeyError):
                    continue
            token = _token_in_memory(proc)
            if token is not None:
                return token
        time.sleep(0.05)
    raise AssertionError(f"no process of {key} holds its loadout")


def _files_under(root: Path) -> dict[str, str]:
    """Every file a person or the parent reads: logs, the reject log, the session journal
    (not the loadouts or the control token, which must hold the secrets)."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and path.parent.name != "loadouts" and path.name != "control.token":
            found[str(path)] = path.read_bytes().decode(errors="replace")
    return found


def test_no_surface_shows_a_siblings_token_or_the_control_token(hostile_fleet):
    fleet = hostile_fleet
    sibling = spawn_payload(fleet, "import time; time.sleep(120)", task="stay")
    secrets = {"sibling": _sibling_token(fleet, sibling), "control": control_token(fleet)}
    assert all(len(value) == 64 for value in secrets.values())
    surfaces: dict[str, str] = {}
    keys = {}
    for mode in ("ok", "fail", "crash"):
        handed = hand_over(fleet, f"leak-{mode}", secrets)
        keys[mode] = spawn_payload(fleet, LEAK.format(handed=str(handed), mode=mode))
    for mode, key in keys.items():
        result = fleet.run("wait", key, "--timeout", "60", "--json")
        # A failed turn (fail) and a crashed child both exit 1 (wait's exit codes).
        assert result.returncode == (0 if mode == "ok" else 1), result
        surfaces[f"wait {mode}"] = result.stdout
        [note] = json.loads(result.stdout)["settled"]
        shown = {"ok": note["report"], "fail": note["error"]}.get(mode)
        if shown is None:
            shown = note["failure"]["tail"]
        assert "sibling=[redacted] control=[redacted]" in shown, note
    surfaces["peek"] = json.dumps(fleet.json("peek", *keys.values()))
    for mode, key in keys.items():
        logs = fleet.json("logs", key)
        surfaces[f"logs {mode}"] = json.dumps(logs)
    assert fleet.json("peek", keys["crash"])["agents"][0]["state"] == "failed"
    surfaces["stop"] = json.dumps(fleet.json("stop", keys["ok"], keys["fail"], code=0))
    surfaces["stop crash"] = fleet.run("stop", keys["crash"], "--json").stdout
    time.sleep(0.6)  # the journal is flushed within its interval of a change
    surfaces.update(_files_under(session_root(fleet)))
    for where, text in surfaces.items():
        for name, secret in secrets.items():
            assert secret not in text, f"the {name} token leaked through {where}"
    fleet.json("stop", sibling)
    honest_child_works(fleet)
