"""The per-user runtime root: every fleet's sockets and secrets, whatever its ``FLEET_HOME``.

A session keeps its persistent state (journal, logs, worktrees, paper) in its session directory
under ``$FLEET_HOME``; its control socket and token, its private tmux socket, its IPC listener
and its egress proxy sockets live in ``<runtime root>/<digest of the session directory>/``
instead (:func:`session_runtime`). The runtime root is ``$XDG_RUNTIME_DIR/fleet`` when that
directory is set, absolute, ours and private, else ``/tmp/fleet-<uid>``; it is one per user, so
every sandbox hides all of it at once (a child's view mounts a tmpfs on ``/tmp`` and hides the
root by name too), whatever ``FLEET_HOME`` made the fleet and whenever it started.

Every supervisor also writes its canonical ``FLEET_HOME`` into ``<runtime root>/homes/`` (one
0600 file per home, :func:`register_home`): :func:`fenced_paths` is what every sandbox hides
besides its own home — the runtime root, the platform's default state directory and every
registered home that exists. A child cannot add to or remove from the registry: it cannot see
the runtime root.

Standard library only: the warm CLI verbs (``cli._fast``) find the control socket through
:func:`session_runtime` without importing attrs.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from orchestrator._digests import sha256
from orchestrator._errors import UsageError

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Final

#: Hex digits of a session directory's digest: ``<root>/<16 hex>/control.sock`` stays well
#: inside sun_path (104 bytes on macOS) for any sensible ``XDG_RUNTIME_DIR``.
DIGEST_HEX: Final = 16
HOMES: Final = "homes"
#: A registered home's file is a path: anything longer is not one of ours.
_MAX_ENTRY: Final = 4096


class RuntimeRootError(UsageError):
    """The runtime root cannot be trusted (a symlink, another user's, group/other accessible)."""


def _private_dir_of_ours(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not stat.S_IMODE(st.st_mode) & 0o077
    )


def runtime_root(env: Mapping[str, str] | None = None) -> Path:
    """Where this user's fleets keep sockets and secrets (nothing is made or checked here)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and _private_dir_of_ours(xdg):
        return Path(xdg) / "fleet"
    return Path(f"/tmp/fleet-{os.geteuid()}")  # noqa: S108 - checked before use, one per uid


def session_runtime(
    session_root: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> Path:
    """The runtime directory of the session at *session_root* (the same from any process
    that names that directory, however spelled: its canonical path is digested)."""
    canonical = os.path.realpath(session_root)
    digest = str(sha256(os.fsencode(canonical)).hexdigest())[:DIGEST_HEX]
    return runtime_root(env) / digest


def _check_private(path: Path, what: str) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        raise RuntimeRootError(f"{what} {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise RuntimeRootError(f"{what} {path} is a symlink; remove it (fleet makes it itself)")
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeRootError(f"{what} {path} is not a directory; remove it")
    if st.st_uid != os.geteuid():
        raise RuntimeRootError(
            f"{what} {path} belongs to uid {st.st_uid}, not us; remove it or set XDG_RUNTIME_DIR"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise RuntimeRootError(
            f"{what} {path} is open to group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); chmod 700 it"
        )


def _ensure_private(path: Path, what: str) -> None:
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    _check_private(path, what)


def ensure_session_runtime(runtime: Path) -> Path:
    """Make (0700) and check the runtime root and the session's directory *runtime* in it.

    Raises :class:`RuntimeRootError` (one line) for a root or directory that is a symlink,
    not ours, or group/other accessible: never tightened, since someone else made it."""
    _ensure_private(runtime.parent, "fleet runtime directory")
    _ensure_private(runtime, "fleet session runtime directory")
    return runtime


def remove_session_runtime(runtime: Path) -> None:
    """Remove the session's runtime directory and its egress directory once they are empty
    (every socket and the token gone); anything still in them stays."""
    for directory in (runtime / "egress", runtime):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _home_file(root: Path, home: str) -> Path:
    return root / HOMES / str(sha256(os.fsencode(home)).hexdigest())[:32]


def register_home(home: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> None:
    """Record *home* (canonical) in the per-user registry every sandbox hides; entries whose
    home no longer exists are dropped on the way."""
    root = runtime_root(env)
    _ensure_private(root, "fleet runtime directory")
    homes = root / HOMES
    _ensure_private(homes, "fleet home registry")
    canonical = os.path.realpath(home)
    for entry, path in _entries(homes):
        if not os.path.lexists(path):
            with contextlib.suppress(OSError):
                entry.unlink()
    target = _home_file(root, canonical)
    tmp = homes / f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.fsencode(canonical))
    finally:
        os.close(fd)
    os.replace(tmp, target)


def _entries(homes: Path) -> Iterable[tuple[Path, str]]:
    try:
        names = sorted(os.listdir(homes))
    except OSError:
        return
    for name in names:
        entry = homes / name
        if name.startswith("."):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            text = os.read(fd, _MAX_ENTRY + 1)
        finally:
            os.close(fd)
        path = os.fsdecode(text)
        if len(text) <= _MAX_ENTRY and os.path.isabs(path) and "\0" not in path:
            yield entry, path


def registered_homes(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Every registered ``FLEET_HOME`` of this user that exists now (none when the registry
    cannot be trusted: its root is then refused where it is made)."""
    root = runtime_root(env)
    try:
        _check_private(root, "fleet runtime directory")
        _check_private(root / HOMES, "fleet home registry")
    except RuntimeRootError:
        return ()
    return tuple(Path(path) for _, path in _entries(root / HOMES) if os.path.exists(path))


def default_state_dir() -> Path:
    """The platform's user state directory for fleet (the default ``FLEET_HOME``)."""
    import platformdirs  # noqa: PLC0415 - a warm verb never needs it

    return Path(platformdirs.user_state_dir("fleet"))


def fenced_paths(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """What every sandbox hides besides its own home, as it is here now: the runtime root (the
    whole ``$XDG_RUNTIME_DIR`` when that is where it is: the user's session bus, agents and
    every other socket of the login there), the platform's default state directory and every
    registered home (those that exist)."""
    root = runtime_root(env)
    xdg = (os.environ if env is None else env).get("XDG_RUNTIME_DIR", "")
    if xdg and root == Path(xdg) / "fleet":
        root = Path(xdg)
    found = [root, default_state_dir(), *registered_homes(env)]
    return tuple(dict.fromkeys(Path(os.path.realpath(p)) for p in found if os.path.lexists(p)))
