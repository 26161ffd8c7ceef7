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
the leaf and the CA beside the key.

Everything of a child on its node lives in its **node directory** (:mod:`._ray_node`):
:meth:`RayLauncher.open_node` has a fresh actor make it in its node's own temporary directory
(0700, a fresh random name) and returns its path, which the supervisor puts in the child's
loadout before the actor writes the loadout there (:meth:`RayLauncher.write_files`); the
workspace arrives as a git bundle, the child's egress proxy is served there by the actor (its
refusals polled back, :meth:`LaunchedRay.poll_refusals`), and the actor removes it all when
the child ends.

The child's sandbox is made on its node too: the supervisor sends a plain plan
(:meth:`RayLauncher.plan`, :mod:`._nodeplan`) and the actor builds the command with the node's
own interpreter, probes and wraps it there, and says whether it sandboxed the child
(:attr:`LaunchedRay.sandboxed`) or refuses it in one line (:class:`PolicyError`).
"""

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from orchestrator._errors import PolicyError
from orchestrator.launch._launcher import LaunchSpec, OutputSink
from orchestrator.launch._nodeplan import NodePlan
from orchestrator.launch._ray_node import ChildActor, ray_module
from orchestrator.launch._ray_sweep import sweep_on_node

log = logging.getLogger("orchestrator")

#: The per-node custom resource that is a node's lane (one unit per live child).
SLOT = "agent_slot"


_remote_cls: Any = None
#: Held while this process connects to Ray: ``ray.init`` twice at once fails the second.
_CONNECTING = threading.Lock()


def _actor_class() -> Any:
    global _remote_cls  # noqa: PLW0603 - ray.remote once per process
    if _remote_cls is None:
        ray = ray_module()
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
    #: Whether its node sandboxed the child (:mod:`._nodeplan`), and if not, why not.
    sandboxed: bool = False
    unsandboxed_reason: str = ""
    #: The child's node directory on its node; removed by its actor when the child ends, or
    #: by a task pinned to its node when the actor was lost (:mod:`._ray_sweep`).
    node_dir: str = ""
    _nursery: trio.Nursery | None = None
    _swept: bool = False

    async def _watch(self, sink: OutputSink) -> None:
        ray = ray_module()
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
                self._sweep_soon()
        finally:
            self.exited.set()

    def _sweep_soon(self) -> None:
        """The actor is gone and cannot remove the child's node directory: have a task on
        its node do it, in the background (a node that is gone too cannot)."""
        if self._swept or not self.node_dir or self._nursery is None:
            return
        self._swept = True

        async def sweep() -> None:
            why = await trio.to_thread.run_sync(
                sweep_on_node, self.node, self.node_dir, abandon_on_cancel=True
            )
            if why:
                log.warning(
                    "ray child %s: node directory %s left: %s", self.pid, self.node_dir, why
                )

        self._nursery.start_soon(sweep)

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None  # noqa: S101 - set before exited
        return self.returncode

    async def terminate(self, grace: float) -> None:
        ray = ray_module()

        def stop(child_running: bool) -> bool:
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
                orphaned = True
            else:
                orphaned = False
            # Always: an actor left alive would hold its node's agent_slot.
            ray.kill(self.actor, no_restart=True)
            return orphaned

        if not self._killed:
            self._killed = True
            orphaned = await trio.to_thread.run_sync(
                stop, not self.exited.is_set(), abandon_on_cancel=True
            )
            if orphaned:
                self._sweep_soon()
        with trio.move_on_after(grace + 15):
            await self.exited.wait()

    async def poll_refusals(self, refused: Callable[[str, str], None]) -> None:
        """Hand each egress refusal of the child's node-side proxy to *refused* (the
        supervisor's reject and run log) until the child has ended and the actor is gone."""
        ray = ray_module()
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
        ray = ray_module()
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
    #: The ``agent_slot`` units of a local cluster started here (its one node's lane); a
    #: cluster that is joined brings its own.
    slots: int = 4
    num_cpus: float = 0.0
    memory: int | None = None
    #: Further custom resources each child's actor asks for (to pin children to labelled nodes).
    resources: Mapping[str, float] = attrs.Factory(dict)
    name: str = "ray"
    #: ``certify(owner, csr_pem) -> (leaf_pem, ca_pem)``: the session CA signing a node's CSR,
    #: for a child whose spec names a TLS directory (it dials back over mutual TLS).
    certify: Callable[[str, bytes], tuple[bytes, bytes]] | None = None
    session: str = ""
    #: Actors made by :meth:`open_node`, waiting for their child's launch.
    _opened: dict[str, Any] = attrs.field(factory=dict, init=False)
    #: Per child whose sandbox its node makes (:meth:`plan`).
    _plans: dict[str, NodePlan] = attrs.field(factory=dict, init=False)
    #: Each opened child's node directory, for its :class:`LaunchedRay`.
    _dirs: dict[str, str] = attrs.field(factory=dict, init=False)
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

    async def open_node(self, key: str) -> str:
        """Give child *key* its actor now and have it make the child's node directory in its
        node's own temporary directory, before the child is placed; its path on that node
        (:meth:`write_files` then puts the loadout there, :meth:`launch` uses the actor).
        Queues, like a launch, until a node has a free slot."""
        actor = await self._actor()
        ray = ray_module()
        try:
            directory = await trio.to_thread.run_sync(
                ray.get, actor.make_node.remote(self.session, key), abandon_on_cancel=True
            )
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        self._opened[key] = actor
        self._dirs[key] = str(directory)
        return str(directory)

    async def write_files(self, key: str, files: Mapping[str, bytes]) -> None:
        """Have child *key*'s actor write *files* (its loadout) in its node directory."""
        ray = ray_module()
        await trio.to_thread.run_sync(
            ray.get, self._opened[key].write_files.remote(dict(files)), abandon_on_cancel=True
        )

    def plan(self, key: str, plan: NodePlan) -> None:
        """Child *key*'s sandbox is made on its node from *plan* when it is launched: its
        actor builds the command (the spec's argv and cwd are not used) and wraps it there."""
        self._plans[key] = plan

    async def open_egress(
        self, key: str, path: str, allowed: Sequence[str], refused: Callable[[str, str], None]
    ) -> None:
        """Have child *key*'s actor (made by :meth:`open_node`) serve its egress proxy at
        *path* on its node; its refusals go to *refused* once it is launched."""
        ray = ray_module()
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
        self._plans.pop(key, None)
        self._dirs.pop(key, None)
        if actor is None:
            return
        ray = ray_module()

        def close() -> None:
            with contextlib.suppress(Exception):
                ray.get(actor.clean_up.remote(), timeout=60)
            ray.kill(actor, no_restart=True)

        await trio.to_thread.run_sync(close, abandon_on_cancel=True)

    def _connect(self) -> None:
        ray = ray_module()
        with _CONNECTING:  # a batch's launches connect from several threads at once
            if not ray.is_initialized():
                self._init(ray)

    def _init(self, ray: Any) -> None:
        if self.address in (None, "", "local"):
            # "local", not None: None would join any cluster already running on this machine.
            # A node without agent_slot would queue every child for ever: give it the lane.
            ray.init(
                address="local",
                resources={SLOT: self.slots},
                include_dashboard=False,
                log_to_driver=False,
            )
        else:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)

    async def launch(
        self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery
    ) -> LaunchedRay:
        if spec.inherit is not None:
            raise ValueError("ray launcher: a child on a node cannot inherit descriptors")
        actor = self._opened.pop(spec.key, None)
        plan = self._plans.pop(spec.key, None)
        if actor is None:
            actor = await self._actor()
        ray = ray_module()
        # Queues until a node has a free slot: Ray holds the actor pending, it never fails.
        try:
            info = await self._start(actor, spec, plan)
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
            sandboxed=bool(info.get("sandboxed")),
            unsandboxed_reason=str(info.get("reason") or ""),
            node_dir=self._dirs.pop(spec.key, ""),
            nursery=nursery,
        )
        launched._done = actor.wait.remote()
        nursery.start_soon(launched._watch, sink)
        refused = self._refused.pop(spec.key, None)
        if refused is not None:
            nursery.start_soon(launched.poll_refusals, refused)
        return launched

    async def _start(self, actor: Any, spec: LaunchSpec, plan: NodePlan | None) -> dict[str, Any]:
        """Ship the workspace, certify the node's key, start the child: what the actor said."""
        ray = ray_module()
        if spec.ship is not None:
            await trio.to_thread.run_sync(
                ray.get,
                actor.receive.remote(spec.ship.bundle, spec.ship.work_tree, spec.ship.read_only),
                abandon_on_cancel=True,
            )
        files = await self._certificate(actor, spec)
        info: dict[str, Any] = await trio.to_thread.run_sync(
            ray.get,
            actor.start.remote(
                spec.argv, spec.cwd, dict(spec.env), files, None if plan is None else plan.plain()
            ),
            abandon_on_cancel=True,
        )
        if "refused" in info:  # its node cannot sandbox it (or will not take the plan)
            raise PolicyError(str(info["refused"]))
        return info

    async def _certificate(self, actor: Any, spec: LaunchSpec) -> dict[str, bytes]:
        """For a TLS child: the node makes its key and CSR, the session CA signs it; the files
        the actor writes beside the key before the child starts (none for a Unix-socket child)."""
        if not spec.tls:
            return {}
        if self.certify is None:
            raise ValueError("ray launcher: a TLS child needs the session CA (certify)")
        ray = ray_module()
        csr = await trio.to_thread.run_sync(
            ray.get,
            actor.request_certificate.remote(spec.tls, self.session, spec.key),
            abandon_on_cancel=True,
        )
        leaf, ca = self.certify(spec.key, csr)
        return {os.path.join(spec.tls, "cert.pem"): leaf, os.path.join(spec.tls, "ca.pem"): ca}
