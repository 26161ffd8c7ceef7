"""The ray launcher: each child runs under one small Ray actor that owns its process (DESIGN §11).

The actor asks for one unit of the per-node custom resource ``agent_slot``: that is the node's
lane, so a child beyond a node's slots *queues* in Ray's scheduler until a slot frees (it never
fails for want of one). ``num_cpus`` is 0 by default (a child mostly waits on its model), and
``memory`` is only reserved when asked for. Actors are non-detached, so they fate-share with the
supervisor's driver: when the supervisor's ``ray.init`` connection ends, Ray kills them.

The actor starts the child in its own session with ``PR_SET_PDEATHSIG`` = SIGKILL, so an actor
killed behind our back (OOM, ``ray.kill``, its raylet dying) cannot leave the child running. Stop
goes through the actor to the child's whole process group — TERM, then KILL after the grace —
and only then is the actor ``ray.kill``-ed.

Every call into Ray is blocking, so it runs in a worker thread
(``trio.to_thread.run_sync(..., abandon_on_cancel=True)``): the trio loop is never blocked.

The child dials back over TCP and mutual TLS (:mod:`orchestrator.remote._door`): before it
starts, its actor makes a key and CSR on the node (``python -m child._tls``; the key never
leaves the node), the session CA signs the CSR for the child's owner id, and the actor writes
the leaf and the CA beside the key. Scope today: the loadout and workspace are still paths the
node must see (a ``ray.cluster_utils.Cluster`` or nodes sharing the state directory);
git-bundle workspaces are not wired in yet.
"""

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from orchestrator.launch._egress import EgressProxy, allowlist
from orchestrator.launch._launcher import LaunchSpec, OutputSink

log = logging.getLogger("orchestrator")

#: The per-node custom resource that is a node's lane (one unit per live child).
SLOT = "agent_slot"

_PR_SET_PDEATHSIG = 1


def _ray() -> Any:
    """The ``ray`` module: imported on first use, as it is an optional extra (``[ray]``)."""
    try:
        import ray  # noqa: PLC0415 - optional extra, only a ray surface pays for it
    except ImportError:
        raise ImportError(
            "the ray surface needs Ray: pip install 'fleet-orchestrator[ray]'"
        ) from None
    return ray


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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


class _NodeEgress:
    """A child's :class:`EgressProxy` run by its actor on the node: trio in a thread."""

    def __init__(self, path: str, allowed: list[str]) -> None:
        self._refused: list[tuple[str, str]] = []
        self._changed = threading.Condition()
        self._closed = False
        self.proxy = EgressProxy(path=Path(path), allowed=allowlist(allowed), on_refused=self._on)
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=self._run, name="fleet-egress", daemon=True)
        self._error: BaseException | None = None

    def _on(self, target: str, reason: str) -> None:
        with self._changed:
            self._refused.append((target, reason))
            self._changed.notify_all()

    def start(self) -> None:
        started = threading.Event()
        self._started = started
        self._thread.start()
        if not started.wait(30) or self._error is not None:
            raise RuntimeError(f"egress proxy on the node did not start: {self._error}")

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.proxy.serve)
                    self._started.set()

        try:
            trio.run(main)
        except BaseException as exc:  # reported by start, or the proxy ended
            self._error = exc
        finally:
            self._started.set()
            with self._changed:
                self._closed = True
                self._changed.notify_all()

    def admit(self, pid: int) -> None:
        if self._token is not None:
            trio.from_thread.run_sync(self.proxy.admit, pid, trio_token=self._token)

    def refusals(self, wait: float) -> list[tuple[str, str]]:
        with self._changed:
            if not self._refused and not self._closed:
                self._changed.wait(wait)
            got, self._refused = self._refused, []
            return got

    def close(self) -> None:
        if self._token is not None and self._scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)


class ChildActor:
    """The Ray actor that owns one child process (decorated with ``ray.remote`` at first use)."""

    def __init__(self) -> None:
        self.proc: Any = None
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

    def receive(self, bundle: bytes, work_tree: str, read_only: bool) -> None:
        """Check the snapshot *bundle* out at *work_tree* (made here, empty); its Git dir is
        private to this actor, so the child sees files only."""
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

    def bring_back(self) -> bytes:
        """Commit what the child left in its work tree on top of the snapshot; the bundle of
        that one commit (``base..HEAD``)."""
        if not self.git_dir:
            return b""
        self._git("add", "-A")
        tree = self._git("write-tree").decode().strip()
        commit = self._git("commit-tree", "-p", self.base, "-m", "fleet: a node's changes", tree)
        self._git("update-ref", "HEAD", commit.decode().strip())
        out = os.path.join(os.path.dirname(self.git_dir), "back.bundle")
        self._git("bundle", "create", "-q", out, "HEAD", f"^{self.base}")
        with open(out, "rb") as handle:
            data = handle.read()
        shutil.rmtree(os.path.dirname(self.git_dir), ignore_errors=True)
        self.git_dir = ""
        return data

    def make_node(self, directory: str, files: Mapping[str, bytes]) -> None:
        """Make the child's node *directory* (0700, new: one that exists is refused, so no
        symlink or planted directory is followed) with its scratch and (empty) checkout
        inside, and write *files*
        (its loadout) in it."""
        if not os.path.isabs(directory) or os.path.dirname(directory) != tempfile.gettempdir():
            raise RuntimeError(f"node directory {directory!r} is not in {tempfile.gettempdir()}")
        os.mkdir(directory, 0o700)  # FileExistsError for anything already there
        self.node_dir = directory
        info = os.lstat(directory)
        if info.st_uid != os.getuid() or (info.st_mode & 0o7777) != 0o700:
            raise RuntimeError(f"node directory {directory!r}: not ours, or not 0700")
        for part in ("scratch", "checkout"):  # the checkout filled by receive
            os.mkdir(os.path.join(directory, part), 0o700)
        _write_new(files, under=directory)

    def open_egress(self, path: str, allowed: Sequence[str]) -> None:
        """Serve the child's egress proxy (:class:`EgressProxy`, its *allowed* ``host:port``
        list) at *path* in its node directory, in a thread of its own running trio; only the
        child :meth:`start` makes is admitted. Refusals wait for :meth:`refusals`."""
        if not self.node_dir or os.path.dirname(path) != self.node_dir:
            raise RuntimeError(f"{path!r} is not in the child's node directory")
        self.egress = _NodeEgress(path, list(allowed))
        self.egress.start()

    def refusals(self, wait: float) -> list[tuple[str, str]]:
        """The egress refusals since the last call (``(target, reason)``), waiting up to
        *wait* seconds for one; ``[]`` once the proxy is closed."""
        return [] if self.egress is None else self.egress.refusals(wait)

    def forget(self, path: str) -> bool:
        """Delete the child's loadout file at *path* (in its node directory) after its hello;
        whether it is gone."""
        if not self.node_dir or os.path.dirname(path) != self.node_dir:
            raise RuntimeError(f"{path!r} is not in the child's node directory")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return not os.path.lexists(path)

    def clean_up(self) -> None:
        """Remove the child's node directory (its checkout, scratch, key); after bring_back."""
        if self.egress is not None:
            self.egress.close()
        if self.node_dir:
            shutil.rmtree(self.node_dir, ignore_errors=True)
            self.node_dir = ""

    def request_certificate(self, python: str, directory: str, session: str, owner: str) -> bytes:
        """Make the child's TLS directory and key here on the node; the CSR (never the key)."""
        done = subprocess.run(
            [python, "-m", "child._tls", directory, session, owner],
            capture_output=True,
            check=False,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode(errors="replace").strip() or "no CSR")
        return done.stdout

    def start(
        self,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        files: Mapping[str, bytes] | None = None,
    ) -> dict[str, Any]:
        """Write *files* (path → bytes: the signed leaf and the CA, 0600, new files), then
        start the child."""
        _write_new(files or {})
        ray = _ray()
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, async-signal-safe enough
        )
        if self.egress is not None:
            self.egress.admit(self.proc.pid)
        ctx = ray.get_runtime_context()
        return {"pid": self.proc.pid, "node": ctx.get_node_id(), "actor_pid": os.getpid()}

    def wait(self) -> tuple[int, bytes]:
        """Block until the child ends; its status and its last 8 KiB of output."""
        out = self.proc.stdout.read() if self.proc.stdout is not None else b""
        code = self.proc.wait()
        return code, out[-8192:]

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


def _write_new(files: Mapping[str, bytes], under: str = "") -> None:
    """Write each of *files* (path → bytes) as a new 0600 file (never through a symlink);
    with *under*, each must be directly in that directory."""
    for path, data in files.items():
        if under and os.path.dirname(path) != under:
            raise RuntimeError(f"{path!r} is not in {under!r}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)


_remote_cls: Any = None


def _actor_class() -> Any:
    global _remote_cls  # noqa: PLW0603 - ray.remote once per process
    if _remote_cls is None:
        ray = _ray()
        # max_concurrency 4: ``wait`` and the ``refusals`` poll block a thread each while
        # ``stop`` and ``forget`` must still be served.
        _remote_cls = ray.remote(max_concurrency=4, max_restarts=0)(ChildActor)
    return _remote_cls


@attrs.define(eq=False)
class LaunchedRay:
    """A child under its actor."""

    pid: int
    node: str
    actor: Any
    exited: trio.Event = attrs.Factory(trio.Event)
    returncode: int | None = None
    _done: Any = None
    #: A shipped worktree comes back: at terminate, before the actor goes, its bundle is
    #: fetched into :attr:`returned` (or the reason it could not be, in :attr:`lost`).
    ships_back: bool = False
    returned: bytes | None = None
    lost: str = ""
    _killed: bool = False
    #: The child's exit status as the actor's ``stop`` returned it.
    _stopped: int | None = None
    #: The actor reported the child's exit; False while it runs, or when the actor or its node
    #: was lost (the child may still be writing until its lease runs out).
    confirmed_exit: bool = False
    #: The actor's worker process (on its node), for memory accounting.
    actor_pid: int = 0

    async def _watch(self, sink: OutputSink) -> None:
        ray = _ray()
        try:
            code, out = await trio.to_thread.run_sync(ray.get, self._done, abandon_on_cancel=True)
            if out:
                sink("stdout", out)
            self.returncode = code
            self.confirmed_exit = True  # its actor saw the child's exit status
        except Exception as exc:  # the actor or its node died, or we killed it after a stop
            if self._stopped is not None:  # the actor told us how the child ended first
                self.returncode, self.confirmed_exit = self._stopped, True
            else:
                log.warning("ray child %s: actor lost: %s", self.pid, exc)
                self.returncode = -int(signal.SIGKILL)
        finally:
            self.exited.set()

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None  # noqa: S101 - set before exited
        return self.returncode

    async def terminate(self, grace: float) -> None:
        ray = _ray()

        def stop(child_running: bool) -> None:
            try:
                if child_running:
                    self._stopped = ray.get(self.actor.stop.remote(grace), timeout=grace + 10)
                if self.ships_back:
                    self.returned = ray.get(self.actor.bring_back.remote(), timeout=120)
                ray.get(self.actor.clean_up.remote(), timeout=60)
            except Exception as exc:  # actor gone: PDEATHSIG took the child
                log.info("ray child %s: stop through actor failed: %s", self.pid, exc)
                if self.ships_back:
                    self.lost = f"the node's changes never came back ({type(exc).__name__})"
            # Always: an actor left alive would hold its node's agent_slot.
            ray.kill(self.actor, no_restart=True)

        if not self._killed:
            self._killed = True
            await trio.to_thread.run_sync(stop, not self.exited.is_set(), abandon_on_cancel=True)
        with trio.move_on_after(grace + 15):
            await self.exited.wait()

    async def poll_refusals(self, refused: Callable[[str, str], None]) -> None:
        """Hand each egress refusal of the child's node-side proxy to *refused* (the
        supervisor's reject and run log) until the child has ended and the actor is gone."""
        ray = _ray()
        while True:
            try:
                got = await trio.to_thread.run_sync(
                    lambda: ray.get(self.actor.refusals.remote(5.0), timeout=30),
                    abandon_on_cancel=True,
                )
            except Exception:  # the actor is gone, and its proxy with it
                return
            for target, reason in got:
                refused(target, reason)
            if self.exited.is_set() and not got:
                return

    async def forget(self, path: str) -> None:
        """Have the actor delete the child's loadout file *path* on its node (after hello)."""
        ray = _ray()
        try:
            gone = await trio.to_thread.run_sync(
                lambda: ray.get(self.actor.forget.remote(path), timeout=60),
                abandon_on_cancel=True,
            )
        except Exception as exc:  # the actor is gone: its node directory goes with the child
            log.info("ray child %s: loadout not deleted on its node: %s", self.pid, exc)
            return
        if not gone:
            log.warning("ray child %s: loadout %s still on its node", self.pid, path)

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the Launched protocol
        await trio.lowlevel.checkpoint()

    def describe(self) -> str:
        return f"ray actor on node {self.node[:12]} pid {self.pid}"


@attrs.define(eq=False)
class RayLauncher:
    """Place each child under its own actor on a Ray cluster; see the module docstring."""

    #: ``ray.init`` address: ``None`` / ``"local"`` starts a local cluster, ``"auto"`` or
    #: ``host:port`` joins one. Ignored if Ray is already initialised in this process.
    address: str | None = None
    num_cpus: float = 0.0
    memory: int | None = None
    #: Further custom resources each child's actor asks for (to pin children to labelled nodes).
    resources: Mapping[str, float] = attrs.Factory(dict)
    name: str = "ray"
    #: ``certify(owner, csr_pem) -> (leaf_pem, ca_pem)``: the session CA signing a node's CSR,
    #: for a child whose spec names a TLS directory (it dials back over mutual TLS).
    certify: Callable[[str, bytes], tuple[bytes, bytes]] | None = None
    session: str = ""
    python: str = sys.executable
    #: Actors made by :meth:`open_node`, waiting for their child's launch.
    _opened: dict[str, Any] = attrs.field(factory=dict, init=False)
    #: Per child with a node-side egress proxy: where its refusals go.
    _refused: dict[str, Callable[[str, str], None]] = attrs.field(factory=dict, init=False)

    async def _actor(self) -> Any:
        await trio.to_thread.run_sync(self._connect, abandon_on_cancel=True)
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "resources": {**self.resources, SLOT: 1},
        }
        if self.memory:
            options["memory"] = self.memory
        return _actor_class().options(**options).remote()

    async def open_node(self, key: str, directory: str, files: Mapping[str, bytes]) -> None:
        """Give child *key* its actor now and have it make the child's node *directory* with
        *files* in it (its loadout), before the child is placed; :meth:`launch` then uses that
        actor. Queues, like a launch, until a node has a free slot."""
        actor = await self._actor()
        ray = _ray()
        try:
            await trio.to_thread.run_sync(
                ray.get, actor.make_node.remote(directory, dict(files)), abandon_on_cancel=True
            )
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        self._opened[key] = actor

    async def open_egress(
        self, key: str, path: str, allowed: Sequence[str], refused: Callable[[str, str], None]
    ) -> None:
        """Have child *key*'s actor (made by :meth:`open_node`) serve its egress proxy at
        *path* on its node; its refusals go to *refused* once it is launched."""
        ray = _ray()
        await trio.to_thread.run_sync(
            ray.get,
            self._opened[key].open_egress.remote(path, list(allowed)),
            abandon_on_cancel=True,
        )
        self._refused[key] = refused

    async def close_node(self, key: str) -> None:
        """Child *key* will not be launched after all: its node directory and actor go."""
        actor = self._opened.pop(key, None)
        self._refused.pop(key, None)
        if actor is None:
            return
        ray = _ray()

        def close() -> None:
            with contextlib.suppress(Exception):
                ray.get(actor.clean_up.remote(), timeout=60)
            ray.kill(actor, no_restart=True)

        await trio.to_thread.run_sync(close, abandon_on_cancel=True)

    def _connect(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            address = None if self.address in (None, "", "local") else self.address
            ray.init(address=address, include_dashboard=False, log_to_driver=False)

    async def launch(
        self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery
    ) -> LaunchedRay:
        if spec.inherit is not None:
            raise ValueError("ray launcher: a child on a node cannot inherit descriptors")
        actor = self._opened.pop(spec.key, None)
        if actor is None:
            actor = await self._actor()
        ray = _ray()
        # Queues until a node has a free slot: Ray holds the actor pending, it never fails.
        try:
            if spec.ship is not None:
                await trio.to_thread.run_sync(
                    ray.get,
                    actor.receive.remote(
                        spec.ship.bundle, spec.ship.work_tree, spec.ship.read_only
                    ),
                    abandon_on_cancel=True,
                )
            files = await self._certificate(actor, spec)
            info = await trio.to_thread.run_sync(
                ray.get,
                actor.start.remote(spec.argv, spec.cwd, dict(spec.env), files),
                abandon_on_cancel=True,
            )
        except BaseException:
            # Cancelled while queued (or the start failed): the actor must not start later.
            ray.kill(actor, no_restart=True)
            raise
        launched = LaunchedRay(
            pid=info["pid"],
            node=info["node"],
            actor=actor,
            ships_back=spec.ship is not None and spec.ship.back,
            actor_pid=int(info.get("actor_pid") or 0),
        )
        launched._done = actor.wait.remote()
        nursery.start_soon(launched._watch, sink)
        refused = self._refused.pop(spec.key, None)
        if refused is not None:
            nursery.start_soon(launched.poll_refusals, refused)
        return launched

    async def _certificate(self, actor: Any, spec: LaunchSpec) -> dict[str, bytes]:
        """For a TLS child: the node makes its key and CSR, the session CA signs it; the files
        the actor writes beside the key before the child starts (none for a Unix-socket child)."""
        if not spec.tls:
            return {}
        if self.certify is None:
            raise ValueError("ray launcher: a TLS child needs the session CA (certify)")
        ray = _ray()
        csr = await trio.to_thread.run_sync(
            ray.get,
            actor.request_certificate.remote(self.python, spec.tls, self.session, spec.key),
            abandon_on_cancel=True,
        )
        leaf, ca = self.certify(spec.key, csr)
        return {os.path.join(spec.tls, "cert.pem"): leaf, os.path.join(spec.tls, "ca.pem"): ca}
