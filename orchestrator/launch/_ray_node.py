"""The node's side of the ray launcher: the actor that owns one child (:mod:`._ray`).

It runs on the child's node: it makes the child's node directory (0700, fresh, in the node's
root of them, :func:`._nodeplan.node_root`) and writes its loadout there, checks the workspace
bundle out into it,
makes the child's TLS key there, serves the child's egress proxy from it (:class:`EgressProxy`,
trio in a thread), plans the child's sandbox on the node (:mod:`._nodeplan`) and starts and
stops the child, brings a worker's changes back as a bundle, and removes the directory when the
child ends.
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

import ipc
from orchestrator._errors import PolicyError
from orchestrator._runtime import fenced_paths
from orchestrator._trees import remove_tree
from orchestrator.launch import _context
from orchestrator.launch._egress import EgressProxy, allowlist
from orchestrator.launch._forkserver import die_with_parent
from orchestrator.launch._node_exits import TAIL
from orchestrator.launch._node_key import make_node_key
from orchestrator.launch._node_loop import NodeLoop
from orchestrator.launch._nodeplan import (
    NodePlan,
    NodeStart,
    node_directory_name,
    node_directory_of,
    node_root,
    node_roots,
    realise,
)
from orchestrator.launch._read_trees import ReadTrees

if TYPE_CHECKING:
    from orchestrator.launch._node_link import NodeLink
    from orchestrator.launch._ray_forks import ForkedChild, NodeForks

__all__ = ["MAX_RETURN", "ChildActor", "ReturnRefused", "ray_module"]

#: The largest change a node sends back (``orchestrator.workspace._bundle.MAX_BUNDLE``, which
#: the supervisor checks again on what arrives).
MAX_RETURN = 256 * 1024 * 1024
#: A session or child id, as it may appear in a node directory's name.
_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ReturnRefused(RuntimeError):
    """A node will not send a child's changes back (over the cap): one line, nothing sent."""


def ray_module() -> Any:
    """The ``ray`` module: imported on first use, as it is an optional extra (``[ray]``)."""
    try:
        import ray  # noqa: PLC0415 - optional extra, only a ray surface pays for it
    except ImportError:
        raise ImportError(
            "the ray surface needs Ray: pip install 'fleet-orchestrator[ray]'"
        ) from None
    return ray


#: Git on the node: no user or system config, no hooks, no fsmonitor — the work tree is the
#: child's, and nothing the child wrote there may run when the actor commits it.
_NODE_GIT = ("git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
_NODE_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "fleet",
    "GIT_AUTHOR_EMAIL": "fleet@localhost",
    "GIT_COMMITTER_NAME": "fleet",
    "GIT_COMMITTER_EMAIL": "fleet@localhost",
    "LC_ALL": "C",
}


#: The reader trees of this node process (a node host's, shared by all its children).
_READ_TREES = ReadTrees()


#: How long a node waits for a shared bundle from the object store.
FETCH_TIMEOUT_S = 100.0


def _bytes_of(bundle: Any) -> Callable[[], bytes]:
    """*bundle*'s bytes when called: itself, or what its object store reference holds."""
    if isinstance(bundle, bytes):
        return lambda: bundle
    return lambda: bytes(ray_module().get(bundle, timeout=FETCH_TIMEOUT_S))


def _check_out(bundle: bytes, work_tree: str) -> str:
    """Check *bundle* out at *work_tree* with a throwaway Git dir beside it (both go with
    their directory, which :class:`ReadTrees` removes): the id of the tree checked out."""
    actor = ChildActor()
    actor.node_dir = os.path.dirname(work_tree)
    actor.receive(bundle, work_tree, read_only=False)
    return actor._git("rev-parse", f"{actor.base}^{{tree}}").decode().strip()


class _NodeEgress:
    """A child's :class:`EgressProxy` on its node: a few tasks on the node's one trio thread
    (:class:`NodeLoop`), shared by every child of a node host."""

    def __init__(self, path: str, allowed: list[str], loop: NodeLoop) -> None:
        self._refused: list[tuple[str, str]] = []
        self._changed = threading.Condition()
        self._closed = False
        self._loop = loop
        self.proxy = EgressProxy(path=Path(path), allowed=allowlist(allowed), on_refused=self._on)
        self._scope: trio.CancelScope | None = None

    def _on(self, target: str, reason: str) -> None:
        with self._changed:
            self._refused.append((target, reason))
            self._changed.notify_all()

    def _ended(self, error: BaseException | None) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def start(self) -> None:
        try:
            self._scope = self._loop.start(self.proxy.serve, ended=self._ended)
        except Exception as exc:
            raise RuntimeError(f"egress proxy on the node did not start: {exc!r}") from None

    def admit(self, pid: int) -> None:
        if self._scope is not None:
            self._loop.run_sync(self.proxy.admit, pid)

    def refusals(self, wait: float) -> list[tuple[str, str]]:
        with self._changed:
            if not self._refused and not self._closed:
                self._changed.wait(wait)
            got, self._refused = self._refused, []
            return got

    def close(self) -> None:
        if self._scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._loop.run_sync(self._scope.cancel)
            with self._changed:
                self._changed.wait_for(lambda: self._closed, timeout=10)


class ChildActor:
    """The Ray actor that owns one child process (decorated with ``ray.remote`` at first use)."""

    def __init__(
        self,
        forks: "NodeForks | None" = None,
        loop: NodeLoop | None = None,
        link: "NodeLink | None" = None,
    ) -> None:
        self.proc: Any = None
        #: Its node host's link to the door (:mod:`._node_link`), which carries the channel of
        #: a child started with a ``door`` (``None``: an actor of its own; the child dials).
        self.link = link
        #: Its node host's fork servers (:mod:`._ray_forks`): a child they can fork is a fork
        #: (``None``: an actor of its own, every child a fresh interpreter).
        self.forks = forks
        #: Where its egress proxy runs: its node host's one trio thread (an actor of its own
        #: starts its own on first use).
        self.loop = NodeLoop() if loop is None else loop
        #: The child's node directory (:meth:`make_node`): removed when the child ends.
        self.node_dir = ""
        #: The child's egress proxy on this node (:meth:`open_egress`), if it has one.
        self.egress: _NodeEgress | None = None
        #: A shipped workspace: the node's private Git dir (outside every sandbox view) and
        #: the child's work tree, and the commit it started from.
        self.git_dir = ""
        self.work_tree = ""
        self.base = ""

    def _git(self, *args: str) -> bytes:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_NODE_GIT_ENV}
        env |= {"GIT_DIR": self.git_dir, "GIT_WORK_TREE": self.work_tree}
        done = subprocess.run(
            [*_NODE_GIT, *args], cwd=self.work_tree, env=env, capture_output=True, check=False
        )
        if done.returncode != 0:
            detail = done.stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"git {args[0]} on the node: {detail[-1] if detail else done}")
        return done.stdout

    def receive(self, bundle: Any, work_tree: str, read_only: bool, tree: str = "") -> None:
        """Check the snapshot *bundle* out at *work_tree* (made here, empty); its Git dir is
        private to this actor, so the child sees files only. A reader's read-only checkout is
        written from the tree this process keeps of the snapshot (*tree*: its Git tree id,
        :mod:`._read_trees`). *bundle*: its bytes, or a reference to them in Ray's object
        store (a large reader's, shared by its batch: :mod:`._ray_bundles`), fetched only if
        this process has not kept that tree."""
        if read_only and _READ_TREES.check_out(_bytes_of(bundle), work_tree, _check_out, tree):
            self.work_tree, self.git_dir = work_tree, ""  # nothing comes back from a reader
            return
        bundle = _bytes_of(bundle)()
        if self.node_dir:  # beside the child's paths, out of its view, gone with them
            private = os.path.join(self.node_dir, "git")
            os.mkdir(private, 0o700)
        else:
            private = tempfile.mkdtemp(prefix="fleet-node-")
        source = os.path.join(private, "in.bundle")
        with open(source, "wb") as handle:
            handle.write(bundle)
        os.makedirs(work_tree, mode=0o700, exist_ok=True)
        self.git_dir, self.work_tree = os.path.join(private, "git"), work_tree
        subprocess.run(
            [*_NODE_GIT, "init", "-q", "--bare", self.git_dir],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_NODE_GIT_ENV},
            check=True,
            capture_output=True,
        )
        self._git("config", "core.bare", "false")
        self._git("fetch", "-q", "--no-tags", source, "HEAD")
        self.base = self._git("rev-parse", "FETCH_HEAD").decode().strip()
        self._git("read-tree", "--reset", "-u", self.base)
        os.unlink(source)
        if read_only:
            # Its files read-only (the sandbox binds the whole checkout read-only too); the
            # directories stay removable, so the session's clean-up can delete the checkout.
            for root, _dirs, files in os.walk(work_tree):
                for name in files:
                    path = os.path.join(root, name)
                    if not os.path.islink(path):
                        os.chmod(path, os.stat(path).st_mode & ~0o222)
            shutil.rmtree(private, ignore_errors=True)  # nothing comes back from a reader
            self.git_dir = ""

    def bring_back(self, cap: int = MAX_RETURN) -> bytes:
        """Commit what the child left in its work tree on top of the snapshot; the bundle of
        that one commit (``base..HEAD``). Changes over *cap* bytes raise :class:`ReturnRefused`
        (one line): they are measured here on the node, from the sizes of the changed files
        before Git reads one and from the bundle file before it is read, so an oversize return
        is never hashed, packed or sent whole."""
        if not self.git_dir:
            return b""
        private = os.path.dirname(self.git_dir)
        try:
            size = self._changed_bytes(cap)
            if size > cap:
                raise ReturnRefused(_oversize(f"over {size} bytes", cap))
            self._git("add", "-A")
            tree = self._git("write-tree").decode().strip()
            commit = self._git(
                "commit-tree", "-p", self.base, "-m", "fleet: a node's changes", tree
            )
            self._git("update-ref", "HEAD", commit.decode().strip())
            out = os.path.join(private, "back.bundle")
            self._git("bundle", "create", "-q", out, "HEAD", f"^{self.base}")
            size = os.path.getsize(out)
            if size > cap:
                raise ReturnRefused(_oversize(f"a {size}-byte bundle", cap))
            with open(out, "rb") as handle:
                return handle.read()
        finally:
            shutil.rmtree(private, ignore_errors=True)
            self.git_dir = ""

    def _changed_bytes(self, cap: int) -> int:
        """The sizes of the files the child added or changed (by ``lstat``; Git reads none of
        their contents to list them), summed until past *cap*."""
        listed = self._git(
            "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"
        )
        total = 0
        for entry in listed.split(b"\0"):
            if len(entry) < 4 or entry[:2] == b" D" or entry[:2] == b"D ":
                continue
            path = os.path.join(self.work_tree, os.fsdecode(entry[3:]))
            with contextlib.suppress(OSError):
                total += os.lstat(path).st_size
            if total > cap:
                break
        return total

    def make_node(self, session: str, key: str, path: str = "") -> str:
        """Make child *key*'s node directory in this node's root of them
        (:func:`._nodeplan.node_root`): a fresh, unpredictable name
        (``fleet-node-SESSION-KEY-<32 hex>``), 0700, new (one that exists is refused, so nothing
        planted or linked there is followed), checked to be ours and 0700, with its scratch and
        (empty) checkout inside; its path (the supervisor puts its paths in the child's loadout,
        which :meth:`write_files` then writes there). With *path*, the supervisor named it
        already (in the round trip that starts the child): it must be such a name, directly in
        one of this node's roots (:func:`._nodeplan.node_roots`)."""
        for part in (session, key):
            if not _NAME_PART.fullmatch(part):
                raise RuntimeError(f"node directory: {part!r} is not a session or child id")
        if path:
            node_directory_of(path, session, key)  # a plain fleet-node-SESSION-KEY-<hex>
            if os.path.dirname(path) not in node_roots():
                raise RuntimeError(f"node directory: {path!r} is in none of this node's roots")
            directory = path
        else:
            directory = os.path.join(node_root(), node_directory_name(session, key))
        os.mkdir(directory, 0o700)  # FileExistsError for anything already there
        self.node_dir = directory
        info = os.lstat(directory)
        if info.st_uid != os.getuid() or (info.st_mode & 0o7777) != 0o700:
            raise RuntimeError(f"node directory {directory!r}: not ours, or not 0700")
        for part in ("scratch", "checkout"):  # the checkout filled by receive
            os.mkdir(os.path.join(directory, part), 0o700)
        return directory

    def write_files(self, files: Mapping[str, bytes]) -> None:
        """Write *files* (the child's loadout) in its node directory: new 0600 files."""
        if not self.node_dir:
            raise RuntimeError("the child has no node directory")
        _write_new(files, under=self.node_dir)

    def context(self, backend: str, resume: str) -> dict[str, bytes]:
        """What the child's *backend* resumes from, read from its scratch here (name below the
        scratch → bytes; :func:`._context.gather`: regular files only, no link followed,
        capped; over the cap :class:`._context.ContextRefused`, one line)."""
        if not self.node_dir:
            raise RuntimeError("the child has no node directory")
        scratch = os.path.join(self.node_dir, "scratch")
        return _context.gather(scratch, _context.wants(backend, resume))

    def restore(self, files: Mapping[str, bytes]) -> None:
        """Write a revived child's kept context (:meth:`context`'s files) into its scratch
        here, before it starts (:func:`._context.restore`)."""
        if not self.node_dir or self.proc is not None:
            raise RuntimeError("a context is restored into a new node directory only")
        _context.restore(os.path.join(self.node_dir, "scratch"), files)

    def open_egress(self, path: str, allowed: Sequence[str]) -> None:
        """Serve the child's egress proxy (:class:`EgressProxy`, its *allowed* ``host:port``
        list) at *path* in its node directory, in a thread of its own running trio; only the
        child :meth:`start` makes is admitted. Refusals wait for :meth:`refusals`."""
        if not self.node_dir or os.path.dirname(path) != self.node_dir:
            raise RuntimeError(f"{path!r} is not in the child's node directory")
        self.egress = _NodeEgress(path, list(allowed), self.loop)
        self.egress.start()

    def refusals(self, wait: float) -> list[tuple[str, str]]:
        """The egress refusals since the last call (``(target, reason)``), waiting up to
        *wait* seconds for one; ``[]`` once the proxy is closed."""
        return [] if self.egress is None else self.egress.refusals(wait)

    def clean_up(self) -> None:
        """Remove the child's node directory (its checkout, scratch, key); after bring_back."""
        if self.egress is not None:
            self.egress.close()
        if self.node_dir:
            remove_tree(self.node_dir)  # also what the child made unwritable
            self.node_dir = ""

    def request_certificate(self, directory: str, session: str, owner: str) -> bytes:
        """Make the child's TLS directory and key here on the node (:mod:`._node_key`); the
        CSR (never the key). A relative *directory* is below the child's node directory (so
        the key can be made in the round trip that makes that directory)."""
        if not os.path.isabs(directory):
            below = (
                os.path.normpath(directory) == directory
                and directory.split("/", maxsplit=1)[0] != ".."
            )
            if not self.node_dir or not below:
                raise RuntimeError(f"{directory!r} is not below the child's node directory")
            directory = os.path.join(self.node_dir, directory)
        try:
            return make_node_key(directory, session, owner)
        except OSError as exc:
            raise RuntimeError(f"TLS key on the node: {directory}: {exc.strerror or exc}") from None

    def link_request(self, session: str, owner: str) -> bytes:
        """A CSR for a new key of its node host's link (:meth:`NodeLink.request`)."""
        if self.link is None:
            raise RuntimeError("an actor of its own has no node link")
        return self.link.request(session, owner)

    def link_accept(self, leaf: bytes, ca: bytes) -> None:
        """The signed leaf of its node host's link (:meth:`NodeLink.accept`)."""
        if self.link is None:
            raise RuntimeError("an actor of its own has no node link")
        self.link.accept(leaf, ca)

    def start(  # noqa: PLR0917 - a Ray step's arguments travel as one tuple
        self,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        files: Mapping[str, bytes] | None = None,
        plan: Mapping[str, Any] | None = None,
        door: str = "",
    ) -> dict[str, Any]:
        """Write *files* (path → bytes: the signed leaf and the CA, 0600, new files), then
        start the child: with a sandbox *plan* (:class:`NodePlan`), the command it makes here
        (*argv* and *cwd* unused), or ``{"refused": one line}`` and nothing started; without
        one, *argv* as it is.

        A planned child's loadout file is read and removed here, before the child starts: the
        child inherits it as a sealed memfd (``--loadout-fd M``), read once and closed, so
        neither it nor the backend it starts next (an agent CLI, in the same sandbox) finds a
        file of it, and nothing is left to delete after its hello.

        With *door* (``tls://HOST:PORT``) and a node link, a planned child dials nothing: it
        inherits one end of a socket pair as its connection (``--fd N``) and the host relays
        the other over its link to that door (dialled if it is not up there); a link that
        cannot be had stops the child again and fails the start."""
        sandboxed, reason, made = False, "", None
        planned = None if plan is None else NodePlan.from_plain(plan)
        if planned is not None:
            egress = "" if self.egress is None else str(self.egress.proxy.path)
            try:
                made = realise(planned, node_dir=self.node_dir, egress=egress, env=env)
            except PolicyError as exc:
                self.clean_up()  # nothing of a child that never runs stays on the node
                # The hint (the way past) travels apart: the parent sees it, a child never.
                return {"refused": " ".join(exc.for_child.split()), "hint": exc.hint}
            argv, env, cwd = made.argv, made.env, made.cwd
            sandboxed, reason = made.sandboxed, made.reason
        _write_new(files or {})
        ray = ray_module()
        carried = bool(door) and self.link is not None and planned is not None
        sealed = -1 if planned is None else _sealed(planned.loadout_file)
        ours, theirs = socket.socketpair() if carried else (None, None)
        connection = -1 if theirs is None else theirs.fileno()
        try:
            self.proc = (
                None
                if made is None or planned is None
                else self._fork(made, planned, sealed, connection)
            )
            forked = self.proc is not None
            if self.proc is None:
                inherited = () if connection < 0 else ("--fd", str(connection))
                loadout = () if sealed < 0 else ("--loadout-fd", str(sealed))
                self.proc = subprocess.Popen(
                    [*argv, *inherited, *loadout],
                    cwd=cwd,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=tuple(fd for fd in (connection, sealed) if fd >= 0),
                    preexec_fn=die_with_parent,  # noqa: PLW1509 - prctl only, async-signal-safe
                )
        except BaseException:
            if ours is not None:
                ours.close()
            raise
        finally:
            if sealed >= 0:
                os.close(sealed)  # the child holds its own copy now (or never will)
            if theirs is not None:
                theirs.close()
        if ours is not None and self.link is not None and planned is not None:
            try:
                self.link.carry(door, planned.owner, ours)
            except BaseException:
                self.stop(1.0)  # its channel has nowhere to go: it never runs alone
                raise
        if self.egress is not None:
            self.egress.admit(self.proc.pid)
        ctx = ray.get_runtime_context()
        return {
            "pid": self.proc.pid,
            "node": ctx.get_node_id(),
            "actor_pid": os.getpid(),
            "sandboxed": sandboxed,
            "reason": reason,
            "forked": forked,
            "carried": carried,
        }

    def _fork(
        self, made: NodeStart, plan: NodePlan, loadout: int, connection: int
    ) -> "ForkedChild | None":
        """The child as a fork of its node host's server (:mod:`._ray_forks`), when its plan
        says a fork will do (it carries no credential; :func:`realise` has checked that its
        command is the child's), inheriting *connection* if it is one (not -1); ``None``:
        start it the ordinary way."""
        if self.forks is None or (made.sandboxed and made.view is None) or not plan.forkable:
            return None
        return self.forks.spawn(
            python=os.path.abspath(sys.executable),
            loadout=loadout,
            cwd=made.cwd,
            env=made.env,
            name=f"fleet {plan.owner}",
            view=made.view if made.sandboxed else None,
            hidden=lambda: [*plan.hidden, *(str(path) for path in fenced_paths())],
            connection=connection,
        )

    def wait(self) -> tuple[int, bytes]:
        """Block until the child ends; its status and its last 8 KiB of output (read in
        chunks, keeping only that tail: a child printing gigabytes costs the actor no memory)."""
        tail = b""
        if self.proc.stdout is not None:
            with self.proc.stdout as out:
                while chunk := out.read1(65536):
                    tail = (tail + chunk)[-TAIL:]
        return self.proc.wait(), tail

    def stop(self, grace: float) -> int:
        """TERM the child's whole process group, KILL it after *grace*; the exit status."""
        if self.proc is None:
            return 0
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                # The leader is gone; take any stragglers in its group with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                break
            except subprocess.TimeoutExpired:
                continue
        return int(self.proc.wait())


def _sealed(path: str) -> int:
    """The loadout file at *path* (the plan's, checked by :func:`realise`: the regular file in
    the node directory) as a sealed memfd, the file removed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(ipc.MAX_LOADOUT_BYTES + 1)
    finally:
        os.close(fd)
        os.unlink(path)
    if len(data) > ipc.MAX_LOADOUT_BYTES:
        raise RuntimeError(f"loadout {path}: over {ipc.MAX_LOADOUT_BYTES} bytes")
    return ipc.sealed_loadout(data)


def _oversize(what: str, cap: int) -> str:
    return (
        f"the node's changes are {what}, over the {cap}-byte cap for what a node sends back; "
        "nothing was sent back and the worktree is left as the snapshot"
    )


def _write_new(files: Mapping[str, bytes], under: str = "") -> None:
    """Write each of *files* (path → bytes) as a new 0600 file (never through a symlink);
    with *under*, each must be directly in that directory."""
    for path, data in files.items():
        if under and os.path.dirname(path) != under:
            raise RuntimeError(f"{path!r} is not in {under!r}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
