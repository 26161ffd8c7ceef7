"""The per-user runtime root: where it is, what it refuses, and the registry of fleet homes."""

import os
import stat
from pathlib import Path

import pytest

from orchestrator._config import Config
from orchestrator._runtime import (
    RuntimeRootError,
    ensure_session_runtime,
    fenced_paths,
    register_home,
    registered_homes,
    remove_session_runtime,
    runtime_root,
    session_runtime,
)


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``XDG_RUNTIME_DIR``: the test's registry is its own."""
    path = tmp_path / "xdg"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    return path


def test_the_root_is_the_xdg_runtime_dir_when_private_and_ours_else_one_per_uid_in_tmp(
    tmp_path: Path,
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert runtime_root({"XDG_RUNTIME_DIR": str(private)}) == private / "fleet"
    fallback = Path(f"/tmp/fleet-{os.geteuid()}")
    assert runtime_root({}) == fallback
    assert runtime_root({"XDG_RUNTIME_DIR": "relative/run"}) == fallback
    assert runtime_root({"XDG_RUNTIME_DIR": str(tmp_path / "missing")}) == fallback
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    assert runtime_root({"XDG_RUNTIME_DIR": str(shared)}) == fallback


@pytest.mark.parametrize("flaw", ["symlink", "open", "not-ours", "file"])
def test_a_root_that_is_a_symlink_open_or_not_ours_is_refused_in_one_line(
    xdg: Path, tmp_path: Path, flaw: str
) -> None:
    root = xdg / "fleet"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if flaw == "symlink":
        root.symlink_to(elsewhere)
    elif flaw == "file":
        root.write_text("x")
    else:
        root.mkdir(mode=0o700)
        if flaw == "open":
            root.chmod(0o755)
        elif os.geteuid() == 0:
            os.chown(root, 12345, 12345)
        else:
            pytest.skip("making a directory of another user needs root")
    runtime = session_runtime(tmp_path / "home" / "sessions" / "t")
    with pytest.raises(RuntimeRootError) as caught:
        ensure_session_runtime(runtime)
    message = str(caught.value)
    assert "\n" not in message
    assert str(root) in message
    assert not runtime.exists()
    # Never tightened or taken over: someone else made it.
    if flaw == "open":
        assert stat.S_IMODE(root.lstat().st_mode) == 0o755


def test_a_session_has_one_runtime_directory_however_its_path_is_spelled(
    xdg: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "sessions" / "t").mkdir(parents=True)
    (tmp_path / "link").symlink_to(home)
    direct = Config(home=home, session="t", workspace=tmp_path).paths
    linked = Config(home=tmp_path / "link", session="t", workspace=tmp_path).paths
    assert direct.runtime == linked.runtime == session_runtime(home / "sessions" / "t")
    assert direct.runtime.parent == xdg / "fleet"
    other = Config(home=home, session="u", workspace=tmp_path).paths
    assert other.runtime != direct.runtime
    # Sockets and secrets there, never under FLEET_HOME; persistent state stays in the home.
    for path in (
        direct.control_socket,
        direct.control_token,
        direct.ipc_socket,
        direct.tmux_socket,
        direct.egress / "a1.sock",
    ):
        assert path.parent in (direct.runtime, direct.egress)
        assert home not in path.parents
    assert direct.journal.parent == home / "sessions" / "t"
    made = ensure_session_runtime(direct.runtime)
    assert stat.S_IMODE(made.stat().st_mode) == stat.S_IMODE((xdg / "fleet").stat().st_mode)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    remove_session_runtime(made)
    assert not made.exists()


def test_the_socket_paths_fit_sun_path_under_the_fallback_root() -> None:
    runtime = session_runtime(Path("/" + "d" * 200) / "sessions" / ("s" * 40), {})
    longest = runtime / "egress" / ("k" * 24 + ".sock")
    assert len(os.fsencode(longest)) <= 104


def test_homes_are_registered_privately_and_gone_ones_are_dropped(
    xdg: Path, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    register_home(first)
    register_home(tmp_path / "link-free" / ".." / "second")  # canonical when stored
    register_home(first)  # once only
    assert sorted(registered_homes()) == sorted([first, second])
    entries = list((xdg / "fleet" / "homes").iterdir())
    assert len(entries) == 2
    for entry in entries:
        assert stat.S_IMODE(entry.lstat().st_mode) == 0o600
    second.rmdir()
    assert registered_homes() == (first,)  # a home that is gone is not hidden
    third = tmp_path / "third"
    third.mkdir()
    register_home(third)  # and its entry is dropped on the next registration
    assert len(list((xdg / "fleet" / "homes").iterdir())) == 2
    assert sorted(registered_homes()) == sorted([first, third])


def test_an_entry_that_is_not_a_plain_file_of_ours_is_ignored(xdg: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    register_home(home)
    homes = xdg / "fleet" / "homes"
    (homes / "relative").write_text("not/absolute")
    (homes / "link").symlink_to(homes / "relative")
    assert registered_homes() == (home,)


def test_every_sandbox_hides_the_runtime_root_and_every_registered_home(
    xdg: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    register_home(home)
    fenced = fenced_paths()
    # The whole XDG runtime directory: every fleet's sockets, and the login's session bus,
    # agents and other sockets beside them.
    assert xdg in fenced
    assert home in fenced
    assert fenced_paths({})[0] == Path(f"/tmp/fleet-{os.geteuid()}")
