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
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

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


class ChildActor:
    """The Ray actor that owns one child process (decorated with ``ray.remote`` at first use)."""

    def __init__(self) -> None:
        self.proc: Any = None

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
        for path, data in (files or {}).items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
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


_remote_cls: Any = None


def _actor_class() -> Any:
    global _remote_cls  # noqa: PLW0603 - ray.remote once per process
    if _remote_cls is None:
        ray = _ray()
        # max_concurrency 2: ``wait`` blocks one thread while ``stop`` must still be served.
        _remote_cls = ray.remote(max_concurrency=2, max_restarts=0)(ChildActor)
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

    async def _watch(self, sink: OutputSink) -> None:
        ray = _ray()
        try:
            code, out = await trio.to_thread.run_sync(ray.get, self._done, abandon_on_cancel=True)
            if out:
                sink("stdout", out)
            self.returncode = code
        except Exception as exc:  # the actor or its node died
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

        def stop() -> None:
            try:
                ray.get(self.actor.stop.remote(grace), timeout=grace + 10)
            except Exception as exc:  # actor gone: PDEATHSIG took the child
                log.info("ray child %s: stop through actor failed: %s", self.pid, exc)
            ray.kill(self.actor, no_restart=True)

        if not self.exited.is_set():
            await trio.to_thread.run_sync(stop, abandon_on_cancel=True)
        with trio.move_on_after(grace + 15):
            await self.exited.wait()

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
        await trio.to_thread.run_sync(self._connect, abandon_on_cancel=True)
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "resources": {**self.resources, SLOT: 1},
        }
        if self.memory:
            options["memory"] = self.memory
        actor = _actor_class().options(**options).remote()
        ray = _ray()
        # Queues until a node has a free slot: Ray holds the actor pending, it never fails.
        try:
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
        launched = LaunchedRay(pid=info["pid"], node=info["node"], actor=actor)
        launched._done = actor.wait.remote()
        nursery.start_soon(launched._watch, sink)
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
