"""The loadout: a child's whole capability, written by the supervisor, read by the child.

It is the only place a child learns its token. The file is written atomically with mode 0600
into a 0700 directory, and read only if it is a regular file (not a symlink) that we own with
mode exactly 0600; otherwise :class:`LoadoutError` says which check failed.
"""

import contextlib
import errno
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
    paper: str = ""
    surface: str = "process"
    env: dict[str, str] = attrs.Factory(dict)
    #: Names of variables (API keys) an agent-CLI backend may pass on from the child's own
    #: environment; the values are never written into the loadout.
    secret_env: list[str] = attrs.Factory(list)
    #: Reasoning effort for backends that have one (Pi ``--thinking``, Codex); "" = theirs.
    effort: str = ""
    request_timeout: float = attrs.field(default=DEFAULT_TIMEOUT, validator=_deadline)

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
