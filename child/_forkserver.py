"""The fork server: children start as forks of an interpreter that has already imported them.

A child's start-up is mostly imports (trio, attrs, cattrs, our packages: ~200 ms of CPU
against ~25 ms for ``python -c pass``). The supervisor starts this server once,
``python -I -m child._forkserver <fd> <label>``, with one end of a ``SOCK_SEQPACKET`` socket
pair inherited as *fd*; every unsandboxed ``process`` child is then a ``fork()`` of it: a
millisecond or two, and the imported modules' pages stay shared. A sandboxed child cannot
start this way (bubblewrap must ``exec`` it) and neither can a child in a tmux or cmux pane.

The server is single-threaded, never starts trio, and speaks JSON messages, one per packet:

* server → supervisor ``{"ready": pid}`` once the imports are done;
* supervisor → server ``{"spawn": id, "cwd": dir, "env": {...}, "name": title}`` with four
  descriptors attached: the child's stdout and stderr, its end of the socket pair that is its
  connection, and its sealed loadout (the child runs as ``--fd N --loadout-fd M``);
* server → supervisor ``{"spawned": id, "pid": pid}`` with the child's pidfd attached (opened
  before the child can be reaped, so it names exactly that process), or ``{"spawned": id,
  "error": "..."}``;
* server → supervisor ``{"exit": pid, "status": code}`` when it reaps a child (``code`` as
  :attr:`subprocess.Popen.returncode` has it: negative for a signal).

A request may instead carry ``"dial": true``, with three descriptors attached (stdout, stderr
and the sealed loadout): a child on a Ray node, which inherits its loadout alone and dials its
connection itself (``--loadout-fd M``; ``orchestrator/launch/_ray_forks.py``).
``"die_with_server": true`` gives the fork ``PR_SET_PDEATHSIG`` = SIGKILL against the server
(and checks the server is still its parent), so a server that dies — with the node host that
started it — takes its forks with it.

The server exits when the supervisor's end closes; children already forked keep running
(each in its own session) and end, as any child does, when their IPC connection ends.

``--sandboxed`` (the third argument): the server itself runs inside one bubblewrap sandbox
(the supervisor's ``orchestrator/launch/_forkserver.py`` starts it so) with the capabilities of
its own user namespace, and every request carries ``"sandbox": {"ops": [...], "cwd": dir}``,
the child's bwrap mount operations. The server forks each child as pid 1 of a fresh pid
namespace; that process builds the child's own sandbox (:mod:`child._enclose`) and then forks
the child runtime, staying behind as its namespace's init (it reaps orphans and leaves with the
child's exit code, 128 + N for a signal, as bwrap does). A sandboxed server refuses a request
without a sandbox, and an unsandboxed one a request with one. The server holds no secret: a
loadout is a descriptor it never reads, so no fork inherits another child's token.
"""

import contextlib
import ctypes
import gc
import json
import os
import pkgutil
import selectors
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from importlib import import_module
from typing import Any, Final, NoReturn

import yaml

import ipc
from child import _enclose, _tls

MAX_MESSAGE: Final = 1 << 20
#: Modules a child needs only in a terminal pane (never forked) or that are entry points.
_NOT_PRELOADED: Final = frozenset({"child.__main__", "child._forkserver", "child._view"})
#: The name (comm) of a sandboxed child's namespace init; the child itself has its own.
INIT_NAME: Final = "fleet sandbox"
_PR_SET_PDEATHSIG: Final = 1


def preload() -> None:
    """Import everything a forked child may need, once, before the first fork."""
    import child  # noqa: PLC0415 - the package whose modules we walk

    for info in pkgutil.walk_packages(child.__path__, prefix="child."):
        if info.name not in _NOT_PRELOADED:
            import_module(info.name)
    ipc.prepare_codecs()
    # libyaml's loader builds its constructors on first use; scripts parse in every child.
    yaml.load("{}", Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe
    _warm_network()


def _warm_network() -> None:
    """Pay once, here, what a remote child's first dial would pay in every fork: OpenSSL's
    first context, key, certificate, handshake and record (:func:`child._tls.warm`), and the
    first ``getaddrinfo`` (libc's address-sorting configuration, and the import of the ``idna``
    codec Python encodes every host name with: ~2.5 ms). Nothing is kept: no context, no
    socket, no key of anyone's."""
    try:
        _tls.warm()
    except (OSError, ssl.SSLError, ValueError) as exc:  # a dial still works, only dearer
        print(f"child: fork server: TLS not warmed: {exc!r}", file=sys.stderr)
    with contextlib.suppress(OSError):
        socket.getaddrinfo("127.0.0.1", 0, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _become_child(request: Mapping[str, Any], fds: Sequence[int], server: int) -> NoReturn:
    """In the forked process: take the child's stdio, session, directory and environment,
    enter its sandbox if it has one, then run it. Never returns into the server's loop."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # As a fresh interpreter has it: trio takes over SIGINT only from the default handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if request.get("die_with_server"):
            _die_with(server)
        stdout, stderr, *kept = fds
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        # Nothing of the server's may leak into the child: the supervisor's socket, the
        # wake-up pipe, the stdio descriptors that carried this request. The child keeps only
        # its own connection and loadout (none: a child that is given its argv).
        _close_all_but(set(kept))
        view = request.get("sandbox")
        if view is not None:
            _enclose.enter(view["ops"], view.get("cwd"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        name = str(request.get("name", "fleet-child"))
        argv = _child_argv(request, kept)
        if view is not None:
            _set_name(INIT_NAME)
            code = _init_of(kept, argv, name)
        else:
            _set_name(name)
            code = _run_child(argv)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            print(f"child: fork server could not start the child: {exc!r}", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _set_name(name: str) -> None:
    """``ps`` would otherwise show every child as the fork server; comm is 15 bytes."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w", encoding="utf-8") as comm:
        comm.write(name[:15])


def _die_with(server: int) -> None:
    """SIGKILL this fork when the server (pid *server*) dies; exit now if it already has.

    A sandboxed server's fork is the init of a pid namespace of its own (its parent is
    outside it: ``getppid()`` is 0), and the kernel clears the signal when it changes its
    credentials (:func:`_enclose.enter`); it goes with the server's bwrap pid namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() not in (0, server):
        os._exit(70)  # the server died before the signal was set: nobody would end us


def _child_argv(request: Mapping[str, Any], kept: Sequence[int]) -> list[str]:
    """The child runtime's argv: its inherited loadout (a child that dials), or its inherited
    connection and loadout."""
    if request.get("dial"):
        [loadout] = kept
        return ["--loadout-fd", str(loadout)]
    connection, loadout = kept
    return ["--fd", str(connection), "--loadout-fd", str(loadout)]


def _run_child(argv: Sequence[str]) -> int:
    from child._runtime import main  # noqa: PLC0415 - preloaded: already in sys.modules

    return main(list(argv))


def _init_of(kept: Sequence[int], argv: Sequence[str], name: str) -> int:
    """As its pid namespace's init: fork the child runtime, reap every orphan, and return the
    child's exit code (128 + N when a signal N ended it) once it has ended."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            _set_name(name)
            code = _run_child(argv)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                print(f"child: the sandboxed child failed to start: {exc!r}", file=sys.stderr)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    # Only the child (and what it starts) holds its connection and loadout now.
    for fd in kept:
        os.close(fd)
    while True:
        try:
            ended, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 70
        except InterruptedError:
            continue
        if ended == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor from 3 up except *keep*."""
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _check_fds(request: Mapping[str, Any], fds: Sequence[int]) -> None:
    if request.get("dial") not in (None, True):
        raise ValueError("dial must be true or absent")
    if request.get("dial"):
        if len(fds) != 3 or min(fds) < 3:
            raise ValueError(f"expected 3 descriptors (stdout, stderr, loadout), got {len(fds)}")
        return
    if len(fds) != 4 or min(fds) < 3:
        raise ValueError(
            f"expected 4 descriptors (stdout, stderr, connection, loadout), got {len(fds)}"
        )


def _check_view(request: Mapping[str, Any], sandboxed: bool) -> None:
    view = request.get("sandbox")
    if (view is not None) != sandboxed:
        raise ValueError(
            "a sandboxed fork server forks only sandboxed children"
            if sandboxed
            else "this fork server is not sandboxed; start the child under bwrap"
        )
    if view is None:
        return
    ops = [list(op) for op in view["ops"]]
    for required in (["--dev", "/dev"], ["--proc", "/proc"], ["--tmpfs", "/tmp"]):  # noqa: S108
        if required not in ops:
            raise ValueError(f"the sandbox plan lacks {' '.join(required)}")
    for op in ops:
        # A source the server cannot see would fail the child after the fork: refuse now,
        # and the supervisor starts the child under bwrap instead.
        if op[0] in ("--bind", "--ro-bind") and not os.path.lexists(op[1]):
            raise ValueError(f"the fork server cannot see {op[1]}")


def _fork_into(request: Mapping[str, Any], fds: Sequence[int], own_pid_ns: int | None) -> int:
    """Fork the child (as pid 1 of a new pid namespace when the server is sandboxed)."""
    server = os.getpid()
    if own_pid_ns is None:
        pid = os.fork()
    else:
        _enclose.unshare(_enclose.CLONE_NEWPID)
        pid = -1
        try:
            pid = os.fork()
        finally:
            if pid != 0:
                # The next child gets a namespace of its own again.
                _enclose.setns(own_pid_ns, _enclose.CLONE_NEWPID)
    if pid == 0:
        _become_child(request, fds, server)
    return pid


def _spawn(sock: socket.socket, data: bytes, fds: list[int], own_pid_ns: int | None) -> None:
    request_id = None
    try:
        request = json.loads(data)
        request_id = request["spawn"]
        _check_fds(request, fds)
        _check_view(request, own_pid_ns is not None)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = _fork_into(request, fds, own_pid_ns)
        pidfd = os.pidfd_open(pid)
        try:
            _send(sock, {"spawned": request_id, "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _send(sock, {"spawned": request_id, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        for fd in fds:
            os.close(fd)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


def serve(sock: socket.socket, own_pid_ns: int | None = None) -> None:
    """Fork children on request until the supervisor's end closes.

    *own_pid_ns*: a sandboxed server's descriptor on its own pid namespace (see
    :func:`_fork_into`); ``None`` for a plain server."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    # A handler (not SIG_DFL) so SIGCHLD reaches the wake-up pipe.
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    # The supervisor stops the fleet; an interrupt meant for it must not kill the server.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "reap")
    _send(sock, {"ready": os.getpid()})
    while True:
        for key, _ in selector.select():
            if key.data == "reap":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                _reap(sock)
                continue
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 8)
            if not data:
                return  # the supervisor closed its end
            _spawn(sock, data, fds, own_pid_ns)


#: The smallest sandbox a fork builds: what the sandboxed server tries once before it is ready.
_SELF_TEST_PLAN: Final = (
    ("--ro-bind", "/", "/"),
    ("--dev", "/dev"),
    ("--proc", "/proc"),
    ("--tmpfs", "/tmp"),  # noqa: S108 - a mount point in the test fork
)


def _self_test(own_pid_ns: int) -> str | None:
    """Why a fork cannot build its sandbox here (``None``: it can), found by trying it once,
    so a kernel or security module that refuses a step makes the server fail at start (and
    the supervisor start sandboxed children under bwrap) instead of every child failing."""
    try:
        _enclose.unshare(_enclose.CLONE_NEWPID)
    except OSError as exc:
        return str(exc)
    read_end, write_end = os.pipe()
    pid = -1
    try:
        pid = os.fork()
        if pid == 0:
            failure = b""
            try:
                _enclose.enter(_SELF_TEST_PLAN, "/")
            except BaseException as exc:
                failure = repr(exc).encode()
            os.write(write_end, failure)
            os._exit(0)
    finally:
        if pid != 0:
            _enclose.setns(own_pid_ns, _enclose.CLONE_NEWPID)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        why = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if why or status != 0:
        return why or f"the test fork ended with status {status}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3) or not args[0].isdigit() or args[2:] not in ([], ["--sandboxed"]):
        print("usage: python -m child._forkserver <fd> <label> [--sandboxed]", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(args[0]))
    own_pid_ns = None
    if args[2:]:
        why = _enclose.supported()
        if why is not None:
            print(f"child: sandboxed fork server: {why}", file=sys.stderr)
            return 3
        own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        why = _self_test(own_pid_ns)
        if why is not None:
            print(
                f"child: sandboxed fork server: a fork cannot sandbox itself: {why}",
                file=sys.stderr,
            )
            return 3
    preload()
    if threading.active_count() != 1:
        # fork() copies only the calling thread: a thread started by an import would be
        # missing (and any lock it held, held forever) in every child.
        print("child: fork server: an import started a thread; refusing to fork", file=sys.stderr)
        return 3
    # Keep what the imports built out of the collector's reach: collecting it in a child would
    # write to (and so copy) pages every child otherwise shares.
    gc.collect()
    gc.freeze()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        serve(sock, own_pid_ns)  # those two: the supervisor went away mid-message
    return 0


if __name__ == "__main__":
    sys.exit(main())
