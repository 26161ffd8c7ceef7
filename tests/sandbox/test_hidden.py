"""Hidden paths: a state directory under a visible tree vanishes, and only what is named shows.

Real bubblewrap for the Linux view; the Seatbelt profile is checked as text.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox import Policy, ProbeResult, SandboxSpec, wrap
from sandbox._seccomp import nosuid_filter

if TYPE_CHECKING:
    from collections.abc import Iterator

SEATBELT = ProbeResult(available=True, launcher="sandbox-exec", reason="", version="14.5")
BWRAP = ProbeResult(available=True, launcher="bwrap", reason="", version="0.8.0")


def _state(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A state dir holding a secret, a socket file, a loadout and a child's scratch."""
    state = tmp_path / "state"
    session = state / "sessions" / "t"
    (session / "scratch" / "a1").mkdir(parents=True)
    (session / "loadouts").mkdir()
    (session / "control.token").write_text("secret-token")
    (session / "loadouts" / "a1.json").write_text("mine")
    (session / "loadouts" / "a2.json").write_text("sibling")
    sock = session / "ipc.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.close()
    return state, session, session / "scratch" / "a1", sock


def test_bwrap_hides_then_binds_back_in_order(tmp_path):
    state, session, scratch, sock = _state(tmp_path)
    repo = tmp_path  # a visible tree that holds the state dir: it must be hidden again
    spec = SandboxSpec(
        policy=Policy.READ_ONLY,
        scratch=scratch,
        visible=(repo, session / "loadouts" / "a1.json"),
        sockets=(sock,),
        hidden=(state, tmp_path / "missing"),
    )
    argv = wrap(["/bin/true"], spec, platform="linux", probe_result=BWRAP).argv
    real = {p: str(p.resolve()) for p in (repo, state, scratch, sock)}
    loadout = str((session / "loadouts" / "a1.json").resolve())
    repo_bind = argv.index(real[repo])
    hide = argv.index(real[state])
    assert argv[hide - 1] == "--tmpfs"
    # The repository before the hiding tmpfs; everything inside the state dir after it.
    assert (
        repo_bind < hide < argv.index(loadout) < argv.index(real[sock]) < argv.index(real[scratch])
    )
    assert str(tmp_path / "missing") not in argv
    assert argv[argv.index("--seccomp") + 1] == "3"


def test_a_hidden_file_is_replaced_by_dev_null(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spec = SandboxSpec(
        policy=Policy.READ_ONLY, scratch=scratch, visible=(tmp_path,), hidden=(secret,)
    )
    argv = wrap(["/bin/true"], spec, platform="linux", probe_result=BWRAP).argv
    at = argv.index(str(secret.resolve()))
    assert argv[at - 2 : at] == ("--ro-bind", "/dev/null")


def test_a_hidden_path_under_tmp_gets_a_mount_only_where_a_bound_tree_holds_it(tmp_path):
    """The view's own ``/tmp`` is a fresh tmpfs: a fleet home below ``/tmp`` that no bound
    path holds is gone already and costs no mount (a box that runs test suites registered
    89, a mount each in every sandboxed child); one inside a visible tree is hidden after that
    tree's bind, as before. Outside ``/tmp`` every hidden path gets its mount."""
    other, token, work, scratch = (
        tmp_path / name for name in ("other-home", "token", "work", "scratch")
    )
    inside = work / "fleet-home"
    for directory in (other, inside, scratch):
        directory.mkdir(parents=True)
    token.write_text("x")
    spec = SandboxSpec(
        policy=Policy.READ_ONLY, scratch=scratch, visible=(work,), hidden=(other, inside, token)
    )
    argv = wrap(["/bin/true"], spec, platform="linux", probe_result=BWRAP).argv
    assert str(other.resolve()) not in argv  # gone under the view's /tmp already
    assert str(token.resolve()) not in argv
    at = argv.index(str(inside.resolve()))
    assert argv[at - 1] == "--tmpfs"
    assert argv.index(str(work.resolve())) < at  # hidden after the tree that holds it
    home = Path(os.path.realpath(os.path.expanduser("~")))
    away = SandboxSpec(policy=Policy.READ_ONLY, scratch=scratch, hidden=(home,))
    argv = wrap(["/bin/true"], away, platform="linux", probe_result=BWRAP).argv
    assert argv[argv.index(str(home)) - 1] == "--tmpfs"


@pytest.fixture
def in_shm() -> Iterator[Path]:
    """Two Ray children's node directories in this machine's memory file system."""
    root = Path(tempfile.mkdtemp(prefix="fleet-node-t-shm-", dir="/dev/shm"))
    for name in ("mine/scratch", "sibling/scratch"):
        (root / name).mkdir(parents=True)
    (root / "sibling" / "scratch" / "key.pem").write_text("sibling's key")
    yield root
    shutil.rmtree(root)


async def test_a_node_directory_in_dev_shm_shows_only_to_its_child(in_shm, attempt):
    """A Ray node keeps its children's directories in ``/dev/shm``: a view hides the whole
    memory root without a mount of its own (the view's ``/dev`` is its own), and the child's
    own scratch comes back writable, nothing of a sibling's."""
    scratch, sibling = in_shm / "mine" / "scratch", in_shm / "sibling" / "scratch"
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=scratch, hidden=(Path("/dev/shm"),))
    argv = wrap(["/bin/true"], spec, platform="linux", probe_result=BWRAP).argv
    assert "/dev/shm" not in argv  # no mount: gone under the view's own /dev already
    result = await attempt(
        spec,
        f"read:{sibling / 'key.pem'}",
        f"create:{sibling / 'planted'}",
        f"create:{scratch / 'out'}",
    )
    assert result[f"read:{sibling / 'key.pem'}"] == "ENOENT", result
    assert result[f"create:{sibling / 'planted'}"] in ("ENOENT", "EROFS"), result
    assert result[f"create:{scratch / 'out'}"] == "ok", result
    assert not (sibling / "planted").exists()


async def test_inside_bwrap_the_state_dir_shows_only_what_is_bound_back(tmp_path, attempt):
    state, session, scratch, sock = _state(tmp_path)
    spec = SandboxSpec(
        policy=Policy.READ_ONLY,
        scratch=scratch,
        visible=(session / "loadouts" / "a1.json",),
        sockets=(sock,),
        hidden=(state,),
    )
    result = await attempt(
        spec,
        f"read:{session / 'control.token'}",
        f"read:{session / 'loadouts' / 'a2.json'}",
        f"read:{session / 'loadouts' / 'a1.json'}",
        f"create:{scratch / 'out'}",
        f"create:{session / 'planted'}",
    )
    assert result[f"read:{session / 'control.token'}"] == "ENOENT"
    assert result[f"read:{session / 'loadouts' / 'a2.json'}"] == "ENOENT"
    assert result[f"read:{session / 'loadouts' / 'a1.json'}"] == "ok:mine"
    assert result[f"create:{scratch / 'out'}"] == "ok"
    assert not (session / "planted").exists()


SETUID = r"""
import errno, os, sys
d = sys.argv[1]
out = []
path = os.path.join(d, "f")
open(path, "w").close()
for name, call in (
    ("chmod", lambda: os.chmod(path, 0o4755)),
    ("chmod-gid", lambda: os.chmod(path, 0o2755)),
    ("fchmod", lambda: os.fchmod(os.open(path, os.O_RDONLY), 0o4755)),
    ("create", lambda: os.close(os.open(path + "2", os.O_CREAT | os.O_WRONLY, 0o6755))),
    ("plain", lambda: os.chmod(path, 0o755)),
):
    try:
        call()
        out.append(name + "=ok")
    except OSError as exc:
        out.append(name + "=" + errno.errorcode[exc.errno])
print(" ".join(out))
"""


async def test_no_setuid_or_setgid_file_reaches_the_host(tmp_path, run_inside):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=scratch)
    done = await run_inside(spec, sys.executable, "-c", SETUID, str(scratch))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == [
        "chmod=EPERM",
        "chmod-gid=EPERM",
        "fchmod=EPERM",
        "create=EPERM",
        "plain=ok",
    ]
    for path in scratch.iterdir():
        assert not os.stat(path).st_mode & (stat.S_ISUID | stat.S_ISGID), path


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_checks_the_arch_first_and_ends_allowing(machine):
    program = nosuid_filter(machine)
    assert len(program) % 8 == 0
    # ld [arch]; jeq AUDIT_ARCH ... ; ret KILL_PROCESS
    assert program[:8] == bytes.fromhex("2000000004000000")
    assert program[-8:] == bytes.fromhex("060000000000ff7f")


def test_seatbelt_denies_hidden_reads_and_allows_back_what_is_named(tmp_path):
    state, session, scratch, sock = _state(tmp_path)
    loadout = session / "loadouts" / "a1.json"
    spec = SandboxSpec(
        policy=Policy.READ_ONLY,
        scratch=scratch,
        visible=(loadout,),
        sockets=(sock,),
        hidden=(state,),
    )
    argv = wrap(["/bin/sh"], spec, platform="darwin", probe_result=SEATBELT).argv
    profile = argv[2]
    params = dict(arg[2:].split("=", 1) for arg in argv[3 : argv.index("--")])
    hidden = [name for name, value in params.items() if value == str(state.resolve())]
    assert hidden
    deny = profile.index("(deny file-read* file-write*")
    assert f'(subpath (param "{hidden[0]}"))' in profile[deny:]
    assert "(deny network-outbound" in profile
    shown = {params[name] for name in params if name.startswith("SHOWN_")}
    assert {str(loadout.resolve()), str(scratch.resolve()), str(sock.resolve())} <= shown
    # Later rules win in Seatbelt: the allow-backs and writes come after the deny.
    assert deny < profile.index("(allow file-read*\n") < profile.index("(allow file-write*\n")
    assert deny < profile.rindex("(allow network-outbound")
    assert str(state) not in profile


@pytest.mark.needs("sandbox")
def test_a_hidden_path_deleted_before_the_fork_server_starts_is_left_out(tmp_path):
    """Another fleet's home, listed a moment before and deleted since, has nothing left to
    hide: the fork server still starts (it was a crash of every supervisor starting then)."""
    from sandbox._wrap import wrap_fork_server  # noqa: PLC0415

    kept, gone, work = tmp_path / "kept", tmp_path / "gone", tmp_path / "work"
    kept.mkdir()
    work.mkdir()
    argv = wrap_fork_server(hidden=[kept, gone], writable=[work], readable=[])
    assert argv is not None
    assert str(kept) in argv
    assert str(gone) not in argv
    with pytest.raises(FileNotFoundError):  # what must be reachable still must exist
        wrap_fork_server(hidden=[], writable=[gone], readable=[])
