"""The loadout: a child's whole capability, written by the supervisor, read by the child.

It is the only place a child learns its token. A local child gets it through an inherited
descriptor (:func:`sealed_loadout`, read with :meth:`Loadout.from_fd`): a memfd sealed against
every change, or a pipe where there is no memfd, so no file exists that a sibling could read or
race for. Where a file is unavoidable (a pane that tmux or cmux starts) it is written atomically
with mode 0600 into a 0700 directory, and read only if it is a regular file (not a symlink) that
we own with mode exactly 0600. Either way :class:`LoadoutError` says which check failed.
"""

import contextlib
import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any, Final

import attrs

from ipc._auth import valid_identifier
from ipc._errors import LoadoutError
from ipc._messages import converter, render_error
from ipc._requests import DEFAULT_TIMEOUT, check_timeout

LOADOUT_VERSION: Final = 1
MAX_LOADOUT_BYTES: Final = 4 << 20
#: The seals a loadout memfd carries: nothing can change it, and no seal can be undone.
LOADOUT_SEALS: Final = (
    getattr(fcntl, "F_SEAL_WRITE", 0)
    | getattr(fcntl, "F_SEAL_GROW", 0)
    | getattr(fcntl, "F_SEAL_SHRINK", 0)
    | getattr(fcntl, "F_SEAL_SEAL", 0)
)


def _identifier(_: object, attribute: "attrs.Attribute[str]", value: str) -> None:
    if not valid_identifier(value):
        raise ValueError(f"{attribute.name} {value!r} is not a valid identifier")


def _deadline(_: object, attribute: "attrs.Attribute[float]", value: float) -> None:
    # Refused here, in the file's own terms, rather than when the child opens its channel.
    try:
        check_timeout(value)
    except ValueError as exc:
        raise ValueError(f"{attribute.name}: {exc}") from None


@attrs.frozen(kw_only=True)
class ModelSpec:
    """How the builtin agent thinks: ``scripted`` (a script file) or ``openai`` (an endpoint)."""

    kind: str = "scripted"
    script: str = ""
    base_url: str = ""
    name: str = ""
    api_key_env: str = ""


def _non_negative(_: object, attribute: "attrs.Attribute[float]", value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 86400:
        raise ValueError(f"{attribute.name}: must be a number of seconds from 0 to 86400")


@attrs.frozen(kw_only=True)
class ModelChoice:
    """One candidate of a model role: its spec (as ``peek`` shows it), model and effort."""

    spec: str
    model: ModelSpec
    effort: str = ""


@attrs.frozen(kw_only=True)
class Loadout:
    """Everything a child may do, and how it reaches its supervisor."""

    version: int = LOADOUT_VERSION
    session: str = attrs.field(validator=_identifier)
    owner: str = attrs.field(validator=_identifier)
    name: str
    agent: str
    token: str
    socket: str
    backend: str = "builtin"
    model: ModelSpec = attrs.Factory(ModelSpec)
    command: list[str] = attrs.Factory(list)
    tools: list[str] = attrs.Factory(list)
    system_prompt: str = ""
    workspace: str
    mode: str = "scout"
    depth: int = 1
    subagent_agents: list[str] = attrs.Factory(list)
    ownership: list[str] = attrs.Factory(list)
    sandbox: str = "none"
    scratch: str = ""
    #: The fleet state directory (``$FLEET_HOME``): the builtin tools refuse every path in it.
    state_dir: str = ""
    #: Every other fleet's of the user, and the runtime root holding every fleet's sockets and
    #: tokens: the builtin tools refuse every path in them too (a child unsandboxed by leave).
    fenced: list[str] = attrs.Factory(list)
    paper: str = ""
    surface: str = "process"
    env: dict[str, str] = attrs.Factory(dict)
    #: Names of variables (API keys) an agent-CLI backend may pass on from the child's own
    #: environment; the values are never written into the loadout.
    secret_env: list[str] = attrs.Factory(list)
    #: Reasoning effort for backends that have one (Pi ``--thinking``, Codex); "" = theirs.
    effort: str = ""
    #: A model role's candidates in order (the first is ``model``/``effort``); a ``prompt``
    #: naming candidate N runs on ``models[N]``. Empty: no role, no fallback.
    models: list[ModelChoice] = attrs.Factory(list)
    request_timeout: float = attrs.field(default=DEFAULT_TIMEOUT, validator=_deadline)
    #: ``host:port`` pairs the supervisor's egress proxy lets this child reach (its model
    #: endpoint and its definition's ``egress:``); nothing else leaves its sandbox.
    egress: list[str] = attrs.Factory(list)
    #: A child on another node (``socket`` is ``tls://HOST:PORT``): the directory its actor
    #: wrote its key (made on the node, never sent), leaf certificate and the session CA into.
    tls: str = ""
    #: Seconds a remote child may go without a renewed lease before it stops writing and
    #: exits (``child._lease``); 0: no lease (a local child).
    lease_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: What the backend resumes from and keeps up to date: the builtin agent's transcript
    #: file (in its own scratch, 0600, rewritten atomically after each turn); "" = nothing.
    resume: str = ""
    #: This child is a revive of one whose supervisor died: its first prompt says so.
    restarted: bool = False
    #: A child on a node: each turn's ``Settled`` carries what its backend resumes from, when
    #: the backend can say and it fits the frame (the supervisor keeps a copy; without it,
    #: the copy is fetched from the node).
    context_inline: bool = False

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "Loadout":
        """Read and validate a loadout file (see the module docstring for the checks)."""
        where = os.fspath(path)
        try:
            # O_NONBLOCK: a FIFO planted at the path must be refused, not block the open.
            fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                raise LoadoutError(f"loadout {where}: is a symlink (refused)") from None
            raise LoadoutError(f"loadout {where}: cannot open: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LoadoutError(f"loadout {where}: not a regular file")
            if st.st_uid != os.geteuid():
                raise LoadoutError(f"loadout {where}: owned by uid {st.st_uid}, not by us")
            if stat.S_IMODE(st.st_mode) != 0o600:
                mode = oct(stat.S_IMODE(st.st_mode))
                raise LoadoutError(f"loadout {where}: mode {mode}, must be exactly 0o600")
            if st.st_size > MAX_LOADOUT_BYTES:
                raise LoadoutError(f"loadout {where}: {st.st_size} bytes is too large")
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read(MAX_LOADOUT_BYTES + 1)
        finally:
            os.close(fd)
        return cls.from_json(data, where=where)

    @classmethod
    def from_fd(cls, fd: int) -> "Loadout":
        """Read and validate a loadout from an inherited descriptor, then close it.

        The descriptor must be a memfd carrying every seal of :data:`LOADOUT_SEALS` (so its
        bytes are exactly what the supervisor wrote) or an anonymous pipe (read to EOF).
        """
        where = f"fd {fd}"
        try:
            try:
                st = os.fstat(fd)
            except OSError as exc:
                raise LoadoutError(f"loadout {where}: not open: {exc.strerror}") from None
            if stat.S_ISREG(st.st_mode):
                data = _read_sealed(fd, st.st_size, where)
            elif stat.S_ISFIFO(st.st_mode) and _is_anonymous_pipe(fd):
                data = _read_pipe(fd, where)
            else:
                raise LoadoutError(f"loadout {where}: not a sealed memfd or a pipe")
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return cls.from_json(data, where=where)

    @classmethod
    def from_json(cls, data: bytes, *, where: str = "<loadout>") -> "Loadout":
        """Parse loadout JSON; schema errors name the field."""
        try:
            obj: Any = json.loads(data.decode())
        except (UnicodeError, ValueError, RecursionError) as exc:
            raise LoadoutError(f"loadout {where}: not UTF-8 JSON: {exc}") from None
        try:
            loadout = converter.structure(obj, cls)
        except Exception as exc:
            _path, detail = render_error(exc, "$")
            raise LoadoutError(f"loadout {where}: {detail}") from None
        if loadout.version != LOADOUT_VERSION:
            raise LoadoutError(f"loadout {where}: version {loadout.version} is not supported")
        return loadout

    def to_json(self) -> bytes:
        """Serialize for :func:`write_loadout`."""
        return json.dumps(converter.unstructure(self), indent=1).encode()


def _read_sealed(fd: int, size: int, where: str) -> bytes:
    try:
        seals = fcntl.fcntl(fd, getattr(fcntl, "F_GET_SEALS", 1034))
    except OSError:
        raise LoadoutError(f"loadout {where}: a regular file, not a sealed memfd") from None
    if not LOADOUT_SEALS or seals & LOADOUT_SEALS != LOADOUT_SEALS:
        raise LoadoutError(f"loadout {where}: memfd is not sealed (seals {seals:#x})")
    if size > MAX_LOADOUT_BYTES:
        raise LoadoutError(f"loadout {where}: {size} bytes is too large")
    return os.pread(fd, size, 0)


def _is_anonymous_pipe(fd: int) -> bool:
    """Whether *fd* is a pipe (``pipe:[N]``), not a FIFO someone planted on a path."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:
        # No /proc (macOS): a FIFO opened by path is indistinguishable; the descriptor came
        # from our parent, which only ever hands us a pipe.
        return True


def _read_pipe(fd: int, where: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
        total += len(chunk)
        if total > MAX_LOADOUT_BYTES:
            raise LoadoutError(f"loadout {where}: more than {MAX_LOADOUT_BYTES} bytes")
    return b"".join(chunks)


def sealed_loadout(loadout: Loadout | bytes) -> int:
    """A descriptor holding *loadout* (or its JSON, as a loadout file has it: a Ray node's) for
    a child to inherit (see :meth:`Loadout.from_fd`).

    A sealed memfd where the platform has one, else the read end of a pipe already holding
    every byte (its capacity raised to fit where it can be). The caller passes it to exactly
    one child and closes its own copy; the descriptor is not inheritable until then.
    """
    data = loadout if isinstance(loadout, bytes) else loadout.to_json()
    where = "bytes" if isinstance(loadout, bytes) else loadout.owner
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        try:
            fd: int = memfd_create("fleet-loadout", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), LOADOUT_SEALS)
            except BaseException:
                os.close(fd)
                raise
            return fd
    read, write = os.pipe()
    try:
        if len(data) > 65536 and hasattr(fcntl, "F_SETPIPE_SZ"):
            with contextlib.suppress(OSError):
                fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, len(data))
        os.set_blocking(write, False)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(write, view) :]
        except BlockingIOError:
            raise LoadoutError(f"loadout {where}: {len(data)} bytes do not fit in a pipe") from None
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return read


def write_private(path: Path, data: bytes) -> None:
    """Write *data* to *path* atomically with mode 0600; the directory must be ours and 0700.

    A same-directory temp file is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600,
    fsynced, ``os.replace``d onto *path*, then the directory is fsynced.
    """
    directory = path.parent
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise LoadoutError(f"write {path}: {directory} is not a directory we own")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise LoadoutError(f"write {path}: {directory} must be mode 0700")
    tmp = directory / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_loadout(path: Path, loadout: Loadout) -> None:
    """Write *loadout* to *path* (see :func:`write_private`)."""
    write_private(path, loadout.to_json())
