import fcntl
import json
import os
import pwd
import stat
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import ipc
from ipc import Loadout, LoadoutError, write_loadout, write_private


def sample(**changes) -> Loadout:
    values: dict[str, Any] = {
        "session": "s1",
        "owner": "a1",
        "name": "scout-1",
        "agent": "scout",
        "token": "f" * 64,
        "socket": "/run/fleet/ipc.sock",
        "workspace": "/src/repo",
        "tools": ["read", "grep"],
        "model": ipc.ModelSpec(kind="scripted", script="/tmp/turns.json"),
        "ownership": ["src/*.py"],
        "env": {"FLEET_CHILD": "1"},
        "request_timeout": 2.5,
    }
    values.update(changes)
    return Loadout(**values)


@pytest.fixture
def private_dir(tmp_path):
    directory = tmp_path / "loadouts"
    directory.mkdir(mode=0o700)
    return directory


def written(private_dir, data: bytes, file_mode: int = 0o600):
    path = private_dir / "a1.json"
    path.write_bytes(data)
    path.chmod(file_mode)
    return path


def test_round_trip(private_dir):
    loadout = sample()
    write_loadout(private_dir / "a1.json", loadout)
    assert Loadout.from_file(private_dir / "a1.json") == loadout


def test_defaults_round_trip_too(private_dir):
    loadout = Loadout(
        session="s", owner="o", name="n", agent="a", token="t" * 64, socket="/s", workspace="/w"
    )
    write_loadout(private_dir / "a1.json", loadout)
    loaded = Loadout.from_file(private_dir / "a1.json")
    assert loaded == loadout
    assert (loaded.backend, loaded.mode, loaded.depth, loaded.sandbox) == (
        "builtin",
        "scout",
        1,
        "none",
    )
    assert loaded.request_timeout == ipc.DEFAULT_TIMEOUT


def test_write_private_leaves_only_the_0600_file(private_dir):
    path = private_dir / "a1.json"
    write_private(path, b"first")
    write_private(path, b"second")
    assert os.listdir(private_dir) == ["a1.json"]
    assert path.read_bytes() == b"second"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_write_private_tightens_a_replaced_file(private_dir):
    path = private_dir / "a1.json"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private(path, b"new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_write_private_cleans_up_its_temp_file_on_failure(private_dir):
    with pytest.raises(TypeError):
        write_private(private_dir / "a1.json", "not bytes")  # type: ignore[arg-type]
    assert os.listdir(private_dir) == []


def test_write_private_refuses_a_group_or_world_accessible_directory(tmp_path):
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o750)
    with pytest.raises(LoadoutError, match="must be mode 0700"):
        write_private(directory / "a1.json", b"x")
    assert os.listdir(directory) == []


def test_write_private_refuses_a_symlinked_directory(private_dir, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(private_dir)
    with pytest.raises(LoadoutError, match="not a directory we own"):
        write_private(link / "a1.json", b"x")


def test_a_symlink_is_refused(private_dir):
    target = written(private_dir, sample().to_json())
    link = private_dir / "link.json"
    link.symlink_to(target)
    with pytest.raises(LoadoutError, match="is a symlink"):
        Loadout.from_file(link)


@pytest.mark.parametrize("file_mode", [0o644, 0o640, 0o604, 0o400, 0o700])
def test_any_mode_but_0600_is_refused(private_dir, file_mode):
    path = written(private_dir, sample().to_json(), file_mode)
    with pytest.raises(LoadoutError, match=f"mode {oct(file_mode)}, must be exactly 0o600"):
        Loadout.from_file(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown the loadout to nobody")
def test_another_owner_is_refused(private_dir):
    nobody = pwd.getpwnam("nobody").pw_uid
    path = written(private_dir, sample().to_json())
    os.chown(path, nobody, -1)
    with pytest.raises(LoadoutError, match=f"owned by uid {nobody}, not by us"):
        Loadout.from_file(path)


def test_a_directory_is_not_a_regular_file(private_dir):
    directory = private_dir / "a1.json"
    directory.mkdir(mode=0o600)
    with pytest.raises(LoadoutError, match="not a regular file"):
        Loadout.from_file(directory)


async def test_a_fifo_is_refused_without_blocking(private_dir):
    fifo = private_dir / "a1.json"
    os.mkfifo(fifo, 0o600)
    # A blocking open of a FIFO waits for a writer forever; the ceiling catches a regression.
    with trio.fail_after(10), pytest.raises(LoadoutError, match="not a regular file"):
        await trio.to_thread.run_sync(Loadout.from_file, fifo, abandon_on_cancel=True)


def test_a_missing_file_says_so(private_dir):
    with pytest.raises(LoadoutError, match="cannot open: No such file or directory"):
        Loadout.from_file(private_dir / "absent.json")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not UTF-8 JSON"),
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1, 2]", "loadout"),
    ],
)
def test_bad_json_is_refused(private_dir, data, message):
    with pytest.raises(LoadoutError, match=message):
        Loadout.from_file(written(private_dir, data))


def edited(**changes) -> bytes:
    obj = json.loads(sample().to_json())
    obj.update(changes)
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (edited(token=1), "$.token"),
        (edited(depth="1"), "$.depth"),
        (edited(tools="read"), "$.tools"),
        (edited(model={"kind": "openai", "temperature": 2}), "$.model"),
        (edited(env={"A": 1}), "$.env['A']"),
    ],
)
def test_schema_errors_name_the_field(private_dir, data, field):
    with pytest.raises(LoadoutError) as caught:
        Loadout.from_file(written(private_dir, data))
    assert field in str(caught.value)


def test_a_missing_field_is_named(private_dir):
    obj = json.loads(sample().to_json())
    del obj["workspace"]
    with pytest.raises(LoadoutError, match=r"required field missing @ \$\.workspace"):
        Loadout.from_file(written(private_dir, json.dumps(obj).encode()))


def test_an_unknown_field_is_refused(private_dir):
    with pytest.raises(LoadoutError, match="extra fields found"):
        Loadout.from_file(written(private_dir, edited(admin=True)))


@pytest.mark.parametrize("field", ["owner", "session"])
def test_identifiers_are_checked_on_read(private_dir, field):
    with pytest.raises(LoadoutError, match=f"{field} '../x' is not a valid identifier"):
        Loadout.from_file(written(private_dir, edited(**{field: "../x"})))


@pytest.mark.parametrize("timeout", [0, 0.0001, 121, -5])
def test_the_request_deadline_is_checked_on_read(private_dir, timeout):
    with pytest.raises(LoadoutError, match="request_timeout: request deadline"):
        Loadout.from_file(written(private_dir, edited(request_timeout=timeout)))


def test_another_loadout_version_is_refused(private_dir):
    with pytest.raises(LoadoutError, match="version 2 is not supported"):
        Loadout.from_file(written(private_dir, edited(version=2)))


@given(st.from_regex(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$", fullmatch=True))
def test_any_identifier_matching_the_rule_is_accepted(value):
    assert sample(owner=value, session=value).owner == value


@pytest.mark.parametrize("value", ["", "-a", "a/b", "a" * 129, "a\n", "ä"])
def test_identifiers_outside_the_rule_are_refused(value):
    with pytest.raises(ValueError, match="is not a valid identifier"):
        sample(owner=value)


def test_the_loadout_is_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        sample().owner = "a2"  # type: ignore[misc]


# -- inherited descriptors ------------------------------------------------------------------


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_sealed_memfd_round_trips_and_is_closed_once_read():
    fd = ipc.sealed_loadout(sample())
    assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:fleet-loadout")
    assert not os.get_inheritable(fd)
    assert Loadout.from_fd(fd) == sample()
    assert not _open(fd)


def test_a_sealed_memfd_cannot_be_changed_by_whoever_holds_it():
    fd = ipc.sealed_loadout(sample())
    try:
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"{}", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def test_an_unsealed_memfd_is_refused():
    fd = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
    os.write(fd, sample().to_json())
    with pytest.raises(LoadoutError, match="not sealed"):
        Loadout.from_fd(fd)
    assert not _open(fd)


_SEALS = {
    "write": fcntl.F_SEAL_WRITE,
    "grow": fcntl.F_SEAL_GROW,
    "shrink": fcntl.F_SEAL_SHRINK,
    "seal": fcntl.F_SEAL_SEAL,
}


@pytest.mark.parametrize("missing", list(_SEALS))
def test_a_memfd_missing_any_one_seal_is_refused(missing):
    # Every seal but one: a forger that left out F_SEAL_WRITE could still rewrite the bytes
    # after the check, one without F_SEAL_SEAL could add the others only for the check.
    fd = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
    os.write(fd, sample().to_json())
    partial = 0
    for name, seal in _SEALS.items():
        if name != missing:
            partial |= seal
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, partial)
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) == partial
    with pytest.raises(LoadoutError, match=f"memfd is not sealed \\(seals {partial:#x}\\)"):
        Loadout.from_fd(fd)
    assert not _open(fd)


def test_a_regular_file_descriptor_is_refused(private_dir):
    path = private_dir / "a1.json"
    write_loadout(path, sample())
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(LoadoutError, match="not a sealed memfd"):
        Loadout.from_fd(fd)


def test_a_pipe_is_read_to_its_end():
    read, write = os.pipe()
    os.write(write, sample().to_json())
    os.close(write)
    assert Loadout.from_fd(read) == sample()
    assert not _open(read)


def test_a_fifo_opened_by_path_is_refused(tmp_path):
    fifo = tmp_path / "planted"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    with pytest.raises(LoadoutError, match="not a sealed memfd or a pipe"):
        Loadout.from_fd(fd)


def test_a_socket_or_a_closed_descriptor_is_refused():
    import socket  # noqa: PLC0415 - only this test needs it

    ours, theirs = socket.socketpair()
    with pytest.raises(LoadoutError, match="not a sealed memfd or a pipe"):
        Loadout.from_fd(theirs.detach())
    ours.close()
    with pytest.raises(LoadoutError, match="not open"):
        Loadout.from_fd(theirs.fileno() if theirs.fileno() >= 0 else 999_999)


def test_without_memfd_the_loadout_travels_in_a_pipe(monkeypatch):
    monkeypatch.delattr(os, "memfd_create")
    big = sample(system_prompt="x" * 200_000)  # beyond a default pipe's 64 KiB
    fd = ipc.sealed_loadout(big)
    assert os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    assert Loadout.from_fd(fd) == big
