"""The ray launcher: each child runs under one small Ray actor that owns its process (DESIGN §11),
or, with :attr:`RayLauncher.node_host`, in its node's one long-lived host (:mod:`._ray_host`),
which serves the same calls for every child of its node; what follows is said of an actor per
child and holds for a hosted child too, except that slots are then counted here.

The actor asks for one unit of the per-node custom resource ``agent_slot``: that is the node's
lane, so a child beyond a node's slots *queues* in Ray's scheduler until a slot frees (it never
fails for want of one). ``num_cpus`` is 0 by default (a child mostly waits on its model), and
``memory`` is only reserved when asked for. Actors are non-detached, so they fate-share with the
supervisor's driver: when the supervisor's ``ray.init`` connection ends, Ray kills them.

The actor starts the child in its own session with ``PR_SET_PDEATHSIG`` = SIGKILL, so an actor
killed behind our back (OOM, ``ray.kill``, its raylet dying) cannot leave the child running. Stop
goes through the actor to the child's whole process group — TERM, then KILL after the grace —
and only then is the actor ``ray.kill``-ed.

Every call into Ray is awaited without blocking the trio loop and without a worker thread
(:mod:`._ray_refs`: Ray's future for the call wakes the waiting task); what may block —
``ray.init``, starting a node's host, submitting a call with a large bundle — runs in a thread:
``ray.init`` on one kept for the process's life (a local node dies with the thread that started
it), with Ray told to wait for a lost GCS rather than end the supervisor: a lost node costs
only its children.

A hosted child's channel reaches the door (:mod:`orchestrator.remote._door`) over its node
host's one mutual-TLS link (:mod:`._node_link`): the host makes the link's key (only the CSR
leaves the node), the session CA signs it for a link owner (``host.<hex>``) here, once per host
and again at two thirds of the leaf's life (:meth:`RayLauncher._keep_link`; *vouch* moves the
deadline of every channel the link carries), and each start says where the door is and tells
the door, through *placed*, that the child's stream may come over that link only (a launcher
carries only with all of *certify*, *placed*, *vouch* and the session's *nursery*, where the
renewals run). Such a launch is one round trip: the supervisor names the child's node directory
in its host's root of them (asked at each certification), and the host makes it with the
loadout, workspace and start (:meth:`RayLauncher._open_later`); a host found dead by that call
is replaced once on the same node (:meth:`RayLauncher._first_steps`). Any other hosted launch is
two round trips (open; the loadout, workspace and start).

A child under an actor of its own dials back over TCP and mutual TLS itself: before it starts,
its actor makes a key and CSR on the node (:mod:`._node_key`; the key never leaves the node),
the session CA signs the CSR for the child's owner id, and the actor writes the leaf and the CA
beside the key. With :meth:`RayLauncher.open_node`'s *tls*, the key is made in the round trip
that makes the node directory, and the signed files go with the start.

Everything of a child on its node lives in its **node directory** (:mod:`._ray_node`):
:meth:`RayLauncher.open_node` has a fresh actor make it in its node's root of them (memory when it
can; ``_nodeplan.node_root``) (0700, a fresh random name) and returns its path, which the supervisor
puts in the child's loadout before the actor writes the loadout there
(:meth:`RayLauncher.write_files`); the workspace arrives as a git bundle, the child's egress proxy
is served there by the actor (its refusals polled back, :meth:`LaunchedRay.poll_refusals`), and the
actor removes it all when the child ends.

The child's sandbox is made on its node too: the supervisor sends a plain plan
(:meth:`RayLauncher.plan`, :mod:`._nodeplan`) and the actor builds the command with the node's
own interpreter, probes and wraps it there, and says whether it sandboxed the child
(:attr:`LaunchedRay.sandboxed`) or refuses it in one line (:class:`PolicyError`).
"""

import contextlib
import datetime as dt
import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import trio
from cryptography import x509

import ipc
from orchestrator._errors import PolicyError
from orchestrator.launch._launcher import LaunchSpec, OutputSink
from orchestrator.launch._nodeplan import NodePlan, node_directory_name
from orchestrator.launch._ray_bundles import SharedBundles
from orchestrator.launch._ray_contexts import HostContexts
from orchestrator.launch._ray_exits import HostExits
from orchestrator.launch._ray_host import (
    HostedChild,
    Slots,
    end_actor,
    forget_host,
    host_on,
    known_host,
)
from orchestrator.launch._ray_launched import LaunchedRay
from orchestrator.launch._ray_node import ChildActor, ray_module
from orchestrator.launch._ray_refs import called, resolved

log = logging.getLogger("orchestrator")
#: Nodes tried for a child's host before its launch fails.
_HOST_ATTEMPTS = 3
#: The per-node custom resource that is a node's lane (one unit per live child).
SLOT = "agent_slot"


_remote_cls: Any = None
#: Held while this process connects to Ray: ``ray.init`` twice at once fails the second.
_CONNECTING = threading.Lock()
#: Ray's own setting (read at ``ray.init``) of how long its driver waits for a lost GCS before
#: it ends the process; a user's value is kept.
_GCS_WAIT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
_GCS_WAIT_S = 365 * 24 * 3600
#: The one thread that calls ``ray.init`` (made on first use, alive for the process's life).
_keeper: ThreadPoolExecutor | None = None


def _on_keeper(call: Callable[[], None]) -> None:
    """Run *call* (``ray.init``) on a thread that lives as long as this process.

    A local cluster's GCS and raylet are started by ``ray.init`` with ``PR_SET_PDEATHSIG`` =
    SIGKILL, which fires when the *thread* that started them exits (DESIGN §10). Called from a
    trio worker thread, they were killed when trio retired that thread after 10 s idle, and 60 s
    later Ray ended the whole supervisor for want of its GCS, with every child. A
    ``ThreadPoolExecutor``'s worker never retires while its executor lives (this one always
    does), so the local node lives until the supervisor exits.
    """
    global _keeper  # noqa: PLW0603 - one keeper thread per process
    if _keeper is None:
        _keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-ray-init")
    _keeper.submit(call).result()


def _actor_class() -> Any:
    global _remote_cls  # noqa: PLW0603 - ray.remote once per process
    if _remote_cls is None:
        ray = ray_module()
        # max_concurrency 4: ``wait`` and the ``refusals`` poll block a thread each while
        # ``stop`` and ``context`` must still be served.
        _remote_cls = ray.remote(max_concurrency=4, max_restarts=0)(ChildActor)
    return _remote_cls


#: One step of a child on its node: a :class:`ChildActor` method's name and its arguments.
Call = tuple[str, tuple[Any, ...]]


async def _open_in(host: Any, ident: str, then: Sequence[Call]) -> list[Any]:
    """Make a child's state *ident* (:attr:`HostedChild.ident`) in *host*, then *then*'s
    steps; what they returned."""
    return list(await called(functools.partial(host.open.remote, ident, list(then)), then, 120))


def _close(actor: Any) -> None:
    """Child *actor* will not run (again): its node directory removed, then the actor ended
    (a hosted child's in one call to its host). Blocking: runs in a worker thread, which a
    cancelled launch abandons to finish on its own."""
    ray = ray_module()
    if isinstance(actor, HostedChild):
        with contextlib.suppress(Exception):
            ray.get(actor.finish(), timeout=60)
        actor.free_slot()
        return
    with contextlib.suppress(Exception):
        ray.get(actor.clean_up.remote(), timeout=60)
    end_actor(actor)


async def _steps(actor: Any, calls: Sequence[Call]) -> list[Any]:
    """*calls* on child *actor*, in order: one round trip to a node host, a call each to a
    child's own actor."""
    if isinstance(actor, HostedChild):
        if not actor.opened:  # its state is made with these, its first steps
            actor.opened = True
            return await _open_in(actor.host, actor.ident, calls)
        return list(await called(functools.partial(actor.calls, calls), calls))
    return [
        await called(functools.partial(getattr(actor, name).remote, *args), args)
        for name, args in calls
    ]


@attrs.define(eq=False)
class _Link:
    """The supervisor's side of a node host's link (:mod:`._node_link`)."""

    host: Any
    owner: str
    #: When (trio's clock) its leaf is due for renewal; 0: it has none yet.
    renew_at: float = 0.0
    #: Where its host makes node directories (asked at each certification).
    root: str = ""
    #: Its renewal task runs (:meth:`RayLauncher._keep_link`).
    kept: bool = False
    #: Held while its leaf is made: children of a new host wait for the first.
    lock: trio.Lock = attrs.Factory(trio.Lock)


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
    #: Host every child of a node in one long-lived actor per node (:mod:`._ray_host`)
    #: instead of an actor per child (``subagents.ray_node_host`` in config).
    node_host: bool = False
    #: With node hosts: spread children over nodes (least used first) or pack them.
    spread: bool = True
    #: ``placed(link, key)``: child *key* starts on the node host whose link owner is *link*;
    #: the door takes its stream from that link only.
    placed: Callable[[str, str], None] | None = None
    #: ``vouch(link, seconds)``: link *link*'s leaf was renewed; it is good for *seconds* more.
    vouch: Callable[[str, float], None] | None = None
    #: Where each link's renewal runs: the session's (a launcher without one carries no
    #: child's channel, each dials the door itself).
    nursery: trio.Nursery | None = None
    #: Per node: its host's link (the host it is for, its owner, its leaf's deadlines).
    _links: dict[str, "_Link"] = attrs.field(factory=dict, init=False)
    #: Per node: its host's exit stream (carried children's ends, :mod:`._ray_exits`).
    _exit_streams: dict[str, HostExits] = attrs.field(factory=dict, init=False)
    #: Per node: its host's context fetches, a call a batch (:mod:`._ray_contexts`).
    _context_calls: dict[str, HostContexts] = attrs.field(factory=dict, init=False)
    _slots: Slots = attrs.field(factory=Slots, init=False)
    #: Readers' bundles in the object store, once a tree (:mod:`._ray_bundles`).
    _bundles: SharedBundles = attrs.field(factory=SharedBundles, init=False)
    #: Actors made by :meth:`open_node`, waiting for their child's launch.
    _opened: dict[str, Any] = attrs.field(factory=dict, init=False)
    #: Per child whose sandbox its node makes (:meth:`plan`).
    _plans: dict[str, NodePlan] = attrs.field(factory=dict, init=False)
    #: Each opened child's node directory, for its :class:`LaunchedRay`.
    _dirs: dict[str, str] = attrs.field(factory=dict, init=False)
    #: Per child with a node-side egress proxy: where its refusals go.
    _refused: dict[str, Callable[[str, str], None]] = attrs.field(factory=dict, init=False)
    #: Per opened child: the steps that wait for its launch's first call to its node
    #: (:meth:`write_files`, :meth:`open_egress`), made in the same round trip.
    _queued: dict[str, list[Call]] = attrs.field(factory=dict, init=False)
    #: Per child whose key :meth:`open_node` made: its TLS directory on the node and its CSR.
    _csrs: dict[str, tuple[str, bytes]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        # Half the wiring would quietly fall back to children dialling the door themselves.
        given = [name for name in ("placed", "vouch", "nursery") if getattr(self, name)]
        if given and len(given) != 3:
            raise ValueError(
                "ray launcher: a node link needs placed, vouch and nursery together "
                f"(given: {', '.join(given)})"
            )

    @property
    def carries(self) -> bool:
        """Whether a child's channel goes over its node host's link (not a dial of its own)."""
        return (
            self.node_host
            and self.certify is not None
            and self.placed is not None
            and self.nursery is not None
        )

    async def _actor(self, key: str, then: Sequence[Call] = ()) -> tuple[Any, list[Any]]:
        """Child *key*'s actor (or its state in its node's host) and what *then*'s steps on it
        returned: in the host's opening round trip, or a call each on an actor of its own."""
        if not ray_module().is_initialized():
            await trio.to_thread.run_sync(self._connect, abandon_on_cancel=True)
        if self.node_host:
            return await self._hosted(key, then)
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "resources": {**self.resources, SLOT: 1},
        }
        if self.memory:
            options["memory"] = self.memory
        actor = _actor_class().options(**options).remote()
        if not then:
            return actor, []
        try:
            return actor, await _steps(actor, then)
        except BaseException:
            end_actor(actor)
            raise

    async def _hosted(self, key: str, then: Sequence[Call] | None) -> tuple[HostedChild, list[Any]]:
        """A slot on a node (waiting, like Ray's queue, until one frees) and child *key*'s
        state in that node's host (started there if it has none, or its host died), with
        *then*'s steps made in the same round trip; with *then* ``None`` (a carried child's),
        its state is made with its first steps instead (:func:`_steps`). A node whose host
        cannot start (it died, and Ray does not know yet) is passed over for a while and the
        next one tried."""
        failures = 0
        while True:
            # Slots free from worker threads (a stop's): polled, not an Event of this loop.
            while (node := self._slots.take(SLOT, self.resources, self.spread)) is None:  # noqa: ASYNC110
                await trio.sleep(0.05)
            child, fresh = HostedChild(None, key, node, self._slots), True
            try:
                child.host, fresh = known_host(node), False
                if child.host is None:
                    lanes = self._slots.lanes(node, SLOT)
                    child.host, fresh = await trio.to_thread.run_sync(
                        host_on, node, lanes, abandon_on_cancel=True
                    )
                if self.carries:
                    link = await self._linked(node, child.host)
                    child.link, child.root = link.owner, link.root
                if then is None:
                    child.opened, done = False, []
                else:
                    done = await _open_in(child.host, child.ident, then)
            except Exception as exc:
                child.release()
                if isinstance(exc, ray_module().exceptions.RayTaskError):
                    raise  # the host answered: a step of the child's own failed there
                if child.host is not None:
                    forget_host(node, child.host)  # dead: the next try starts a new one
                if not fresh:  # a host known from before died: no fault of the node's
                    continue
                failures += 1
                if failures == _HOST_ATTEMPTS:
                    raise
                log.warning("ray node %s: no host there (%s); trying again", node[:12], exc)
                self._slots.avoid(node)
                continue
            except BaseException:
                child.release()
                raise
            return child, done

    async def _linked(self, node: str, host: Any) -> "_Link":
        """The link of *node*'s *host*, its leaf signed first if it has none or it is due."""
        link = self._links.get(node)
        if link is None or link.host is not host:
            link = self._links[node] = _Link(host=host, owner=ipc.new_link_owner())
        async with link.lock:
            if trio.current_time() >= link.renew_at:
                await self._certify_link(link)
        return link

    async def _certify_link(self, link: "_Link") -> None:
        """A new key and leaf for *link*'s host (two round trips); every channel it carries
        is vouched for the new leaf's life."""
        assert self.certify is not None  # noqa: S101 - only a TLS launcher links
        csr = await called(
            functools.partial(link.host.link_request.remote, self.session, link.owner), (), 60
        )
        leaf, ca = self.certify(link.owner, csr)
        await called(functools.partial(link.host.link_accept.remote, leaf, ca), (), 60)
        link.root = await called(link.host.root.remote, (), 60)
        left = (
            x509.load_pem_x509_certificate(leaf).not_valid_after_utc - dt.datetime.now(dt.UTC)
        ).total_seconds()
        link.renew_at = trio.current_time() + left * 2 / 3
        if self.vouch is not None:
            self.vouch(link.owner, left)

    async def _keep_link(self, node: str, link: "_Link") -> None:
        """Renew *link*'s leaf at two thirds of its life while its host is *node*'s, so the
        channels it carries outlive any one leaf (a host that no longer answers ends this)."""
        try:
            while self._links.get(node) is link:
                await trio.sleep_until(link.renew_at)
                if self._links.get(node) is not link:
                    return
                try:
                    async with link.lock:
                        if trio.current_time() >= link.renew_at:
                            await self._certify_link(link)
                except Exception as exc:
                    log.warning("ray node %s: its link's leaf was not renewed: %s", node[:12], exc)
                    if self._links.get(node) is link:
                        del self._links[node]
                    return
        finally:
            link.kept = False  # the next launch on the link starts it again

    async def open_node(self, key: str, tls: str = "") -> str:
        """Give child *key* its actor now and have it make the child's node directory in its
        node's root of them (``_nodeplan.node_root``), before the child is placed; its path on
        that node
        (:meth:`write_files` then puts the loadout there, :meth:`launch` uses the actor).
        With *tls* (a directory relative to the node directory: where the launch's
        ``spec.tls`` will be), the child's key and CSR are made there in the same round trip.
        Queues, like a launch, until a node has a free slot.

        A child whose channel its host's link carries costs no round trip here: its node
        directory is named here, in its host's root of them, and made by its launch's one call
        (with its loadout, workspace and start)."""
        if self.carries:
            return await self._open_later(key)
        steps: list[Call] = [("make_node", (self.session, key))]
        if tls:
            steps.append(("request_certificate", (tls, self.session, key)))
        actor, done = await self._actor(key, steps)
        directory = str(done[0])
        self._opened[key] = actor
        self._dirs[key] = directory
        self._queued[key] = []
        if tls:
            self._csrs[key] = (os.path.join(directory, tls), done[1])
        return directory

    async def _open_later(self, key: str) -> str:
        """Child *key*'s slot, host and link now, and its node directory's path: made with its
        launch's first call (:meth:`open_node`)."""
        if not ray_module().is_initialized():
            await trio.to_thread.run_sync(self._connect, abandon_on_cancel=True)
        child, _ = await self._hosted(key, None)
        directory = os.path.join(child.root, node_directory_name(self.session, key))
        self._opened[key] = child
        self._dirs[key] = directory
        self._queued[key] = [("make_node", (self.session, key, directory))]
        return directory

    async def write_files(self, key: str, files: Mapping[str, bytes]) -> None:
        """Have child *key*'s actor write *files* (its loadout) in its node directory, with
        the next call to its node (its launch's first, or :meth:`restore`): a failure to write
        them fails that call."""
        self._queued[key].append(("write_files", (dict(files),)))

    async def restore(self, key: str, files: Mapping[str, bytes]) -> None:
        """Have revived child *key*'s actor write its kept context into its new node
        directory's scratch (``ChildActor.restore``), before it starts; now, with the steps
        that waited for a call."""
        await self._flush(key, [("restore", (dict(files),))])

    async def _flush(self, key: str, then: Sequence[Call]) -> list[Any]:
        """Child *key*'s waiting steps and *then*'s, in one round trip; what *then*'s returned."""
        calls = [*self._queued.pop(key, []), *then]
        self._queued[key] = []
        if not calls:
            return []
        done = await self._first_steps(self._opened[key], calls)
        return done[len(calls) - len(then) :]

    async def _first_steps(self, actor: Any, calls: Sequence[Call], carried: str = "") -> list[Any]:
        """*calls* on *actor* (:func:`_steps`). A hosted child whose state is made by these
        (:meth:`_open_later`) placed on a host that has died since (no call had told) is placed
        once more on a new host of the same node, where its node directory's path holds."""
        again = isinstance(actor, HostedChild) and not actor.opened
        while True:
            if carried and self.placed is not None:
                self.placed(actor.link, carried)  # its stream may come over this link only
            try:
                return await _steps(actor, calls)
            except Exception as exc:
                if not again or isinstance(exc, ray_module().exceptions.RayTaskError):
                    raise  # a step of its own failed there, or its host was dead twice
                forget_host(actor.node, actor.host)
            again = False
            log.info("ray node %s: its host is gone; starting another", actor.node[:12])
            lanes = self._slots.lanes(actor.node, SLOT)
            actor.host, _ = await trio.to_thread.run_sync(
                host_on, actor.node, lanes, abandon_on_cancel=True
            )
            actor.opened = False
            if self.carries:
                actor.link = (await self._linked(actor.node, actor.host)).owner

    def _exits_of(self, child: HostedChild) -> HostExits:
        """The exit stream of *child*'s host (made on its first carried child)."""
        stream = self._exit_streams.get(child.node)
        if stream is None or stream.host is not child.host:
            assert self.nursery is not None  # noqa: S101 - a carrying launcher's
            stream = self._exit_streams[child.node] = HostExits(child.host, self.nursery)
        return stream

    def _contexts_of(self, child: HostedChild) -> HostContexts:
        """The context fetches of *child*'s host (made on its first child)."""
        calls = self._context_calls.get(child.node)
        if calls is None or calls.host is not child.host:
            assert self.nursery is not None  # noqa: S101 - only with the session's nursery
            calls = self._context_calls[child.node] = HostContexts(child.host, self.nursery)
        return calls

    def plan(self, key: str, plan: NodePlan) -> None:
        """Child *key*'s sandbox is made on its node from *plan* when it is launched: its
        actor builds the command (the spec's argv and cwd are not used) and wraps it there."""
        self._plans[key] = plan

    async def open_egress(
        self, key: str, path: str, allowed: Sequence[str], refused: Callable[[str, str], None]
    ) -> None:
        """Have child *key*'s actor (made by :meth:`open_node`) serve its egress proxy at
        *path* on its node (with its launch's first call); its refusals go to *refused* once it
        is launched."""
        self._queued[key].append(("open_egress", (path, list(allowed))))
        self._refused[key] = refused

    async def close_node(self, key: str) -> None:
        """Child *key* will not be launched after all: its node directory and actor go."""
        actor = self._opened.pop(key, None)
        self._refused.pop(key, None)
        self._plans.pop(key, None)
        self._dirs.pop(key, None)
        self._queued.pop(key, None)
        self._csrs.pop(key, None)
        if actor is None:
            return
        await trio.to_thread.run_sync(_close, actor, abandon_on_cancel=True)

    def _connect(self) -> None:
        ray = ray_module()
        with _CONNECTING:  # a batch's launches connect from several threads at once
            if not ray.is_initialized():
                _on_keeper(lambda: self._init(ray))

    def _init(self, ray: Any) -> None:
        # Ray ends its driver process — the whole supervisor, with every child — when the GCS
        # it joined stays unreachable for 60 s (a lost head node, or our own local node). A
        # lost node must cost only its children: this process waits for the GCS instead.
        os.environ.setdefault(_GCS_WAIT_ENV, str(_GCS_WAIT_S))
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
        queued = self._queued.pop(spec.key, [])
        csr = self._csrs.pop(spec.key, None)
        opened = actor is not None  # its node directory exists
        if actor is None:
            actor, _ = await self._actor(spec.key)
        # Queues until a node has a free slot: Ray holds the actor pending, it never fails.
        try:
            info = await self._start(actor, spec, plan, queued, csr)
        except BaseException:
            # Cancelled while queued (or the start failed): the actor must not start later,
            # and a node directory it made goes (in the thread, if this task is cancelled).
            if opened:
                await trio.to_thread.run_sync(_close, actor, abandon_on_cancel=True)
            else:
                end_actor(actor)
            raise
        launched = LaunchedRay(
            pid=info["pid"],
            node=info["node"],
            actor=actor,
            ships_back=spec.ship is not None and spec.ship.back,
            actor_pid=int(info.get("actor_pid") or 0),
            sandboxed=bool(info.get("sandboxed")),
            unsandboxed_reason=str(info.get("reason") or ""),
            forked=bool(info.get("forked")),
            carried=bool(info.get("carried")),
            node_dir=self._dirs.pop(spec.key, ""),
            nursery=nursery,
        )
        if isinstance(actor, HostedChild) and actor.link:
            link = self._links.get(actor.node)
            if link is not None and not link.kept:
                link.kept = True
                assert self.nursery is not None  # noqa: S101 - a carrying launcher's
                self.nursery.start_soon(self._keep_link, actor.node, link)
        if isinstance(actor, HostedChild) and self.nursery is not None:
            launched._contexts = functools.partial(self._contexts_of(actor).fetch, actor.ident)
        if isinstance(actor, HostedChild) and info.get("watched"):
            launched._outcome = self._exits_of(actor).expect(actor.ident)
            launched.released_at_end = bool(info.get("released"))
        else:
            launched._outcome = functools.partial(resolved, actor.wait.remote())
        nursery.start_soon(launched._watch, sink)
        refused = self._refused.pop(spec.key, None)
        if refused is not None:
            nursery.start_soon(launched.poll_refusals, refused)
        return launched

    async def _start(
        self,
        actor: Any,
        spec: LaunchSpec,
        plan: NodePlan | None,
        queued: Sequence[Call],
        csr: tuple[str, bytes] | None = None,
    ) -> dict[str, Any]:
        """The steps that waited (the loadout, the egress proxy), the workspace and the start
        in one round trip: what the actor said of the start. A TLS child's start carries its
        signed leaf and the CA: for its CSR made by :meth:`open_node` (*csr*), signed now;
        else its key and CSR are made first, in a round trip of their own."""
        calls = list(queued)
        if spec.ship is not None:
            ship = spec.ship
            bundle = await self._bundles.bundle(ship)  # a large reader's: a shared reference
            calls.append(("receive", (bundle, ship.work_tree, ship.read_only, ship.tree)))
        files: dict[str, bytes] = {}
        plain = None if plan is None else attrs.evolve(plan, forkable=spec.plain).plain()
        if isinstance(actor, HostedChild) and actor.link and spec.door and plain is not None:
            # Its channel goes over its host's link: no key, no CSR, no leaf of its own.
            calls.append(("start", (spec.argv, spec.cwd, dict(spec.env), {}, plain, spec.door)))
            # Its end goes to its host's exit stream; its state goes there too when nothing
            # is asked of it after its end (no bring-back, no egress refusals to poll).
            release = (
                not (spec.ship is not None and spec.ship.back) and spec.key not in self._refused
            )
            calls.append(("watch", (release,)))
            info = await self._started(actor, calls, spec.key)
            return {**info, "watched": True, "released": release}
        if spec.tls:
            if self.certify is None:
                raise ValueError("ray launcher: a TLS child needs the session CA (certify)")
            if csr is None or csr[0] != spec.tls:
                calls.append(("request_certificate", (spec.tls, self.session, spec.key)))
                *_, request = await _steps(actor, calls)
                calls, csr = [], (spec.tls, request)
            leaf, ca = self.certify(spec.key, csr[1])
            files = {os.path.join(spec.tls, "cert.pem"): leaf, os.path.join(spec.tls, "ca.pem"): ca}
        calls.append(("start", (spec.argv, spec.cwd, dict(spec.env), files, plain)))
        return await self._started(actor, calls)

    async def _started(
        self, actor: Any, calls: Sequence[Call], carried: str = ""
    ) -> dict[str, Any]:
        """*calls*, ending with the start (and its ``watch``): what the actor said of the
        start. *carried*: the child whose channel its host's link carries (the door is told
        first)."""
        done = await self._first_steps(actor, calls, carried)
        info: dict[str, Any] = done[-2] if calls[-1][0] == "watch" else done[-1]
        if "refused" in info:  # its node cannot sandbox it (or will not take the plan)
            raise PolicyError(str(info["refused"]), hint=str(info.get("hint") or ""))
        return info
