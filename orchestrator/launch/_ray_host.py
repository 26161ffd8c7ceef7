"""The node host: one long-lived Ray actor per node that hosts every child fleet puts there.

A per-child actor costs a Ray worker process per child (about 100 MB and tens of seconds to
place on a loaded cluster). With ``ray_node_host`` the ray launcher (:mod:`._ray`) instead keeps
one :class:`NodeHost` per node, placed with node affinity, started on the first child placed on
that node and reused by every later one: a child there is one more process of the host, and its
node directory, loadout, TLS key and egress proxy are what its own :class:`ChildActor` state
would hold — the host keeps one such state per child life (its key and a nonce), so everything a
child's actor did is done the same way, on the same node, without a worker of its own.

The supervisor counts slots itself (:class:`Slots`): a node's lane is its ``agent_slot``
resource, a child beyond every lane waits for one to free (never fails for want of one). A host
that dies takes only its children (their watch fails once, as a lost actor's does) and the next
child placed on its node starts a new host (:func:`host_on`; a dead one fails its next
child's first call, and :func:`forget_host` lets the next try start another).
"""

import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.launch._context import ContextRefused
from orchestrator.launch._node_exits import NodeExits
from orchestrator.launch._node_link import NodeLink
from orchestrator.launch._node_loop import NodeLoop
from orchestrator.launch._nodeplan import node_root
from orchestrator.launch._ray_contexts import Asked, answer
from orchestrator.launch._ray_forks import NodeForks
from orchestrator.launch._ray_node import ChildActor, ray_module

__all__ = [
    "HostedChild",
    "NodeHost",
    "Slots",
    "end_actor",
    "forget_host",
    "host_on",
    "known_host",
    "threads_for",
]

#: The methods of a child's state that the supervisor may call through its node's host.
_CALLS = frozenset(
    {
        "make_node",
        "write_files",
        "context",
        "restore",
        "open_egress",
        "refusals",
        "clean_up",
        "request_certificate",
        "receive",
        "bring_back",
        "start",
        "link_request",
        "link_accept",
        "wait",
        "stop",
    }
)
#: Threads of a host beyond three a slot (:func:`threads_for`): the calls that never block.
_SPARE_THREADS = 16


def threads_for(slots: int) -> int:
    """The threads (Ray's ``max_concurrency``) of the host of a node with *slots* lanes. Each
    live child's ``wait`` holds one for its life (a carried child's end comes by the host's
    one ``exits`` poll instead; a child that dials the door itself still has its ``wait``,
    so the count stays) and its refusals poll another for up to 5 s
    at a time (a third a slot: a poll may outlast its child by that long while the slot's
    next child holds two), and the spare ones serve opens, starts and stops, which never
    block on a child. A fixed 512 gave every host 535 threads whatever its lanes (87 now at
    16 lanes)."""
    return 3 * max(int(slots), 1) + _SPARE_THREADS


#: How long a node whose host could not start is passed over.
AVOID_S = 60.0
#: How long the cluster's node list is kept before it is asked for again.
NODES_TTL_S = 1.0


class NodeHost:
    """The Ray actor of a node that hosts many children: one :class:`ChildActor` state each."""

    def __init__(self) -> None:
        self._children: dict[str, ChildActor] = {}
        self._lock = threading.Lock()
        #: The node's one trio thread (:mod:`._node_loop`): the fork servers' readers and
        #: reapers and every child's egress proxy run there.
        self._loop = NodeLoop()
        #: The node's fork servers (:mod:`._ray_forks`), each started on the first child
        #: that can use it: a ``python -I -m child`` child here is a fork of one.
        self._forks = NodeForks(self._loop)
        #: The node's one link to the door (:mod:`._node_link`): every child's channel.
        self._link = NodeLink(self._loop)
        #: Its children's ends, handed over in batches (:mod:`._node_exits`).
        self._exits = NodeExits(self._loop)
        #: Watched children whose state goes when their end is handed over (``watch``'s
        #: *release*): their end needs no call of its own.
        self._release_at_end: set[str] = set()

    def link_request(self, session: str, owner: str) -> bytes:
        """A CSR for a new key of the node's link (:meth:`NodeLink.request`): its renewal."""
        return self._link.request(session, owner)

    def link_accept(self, leaf: bytes, ca: bytes) -> None:
        """The renewed leaf of the node's link (:meth:`NodeLink.accept`)."""
        self._link.accept(leaf, ca)

    def ping(self) -> str:
        """The node this host runs on (a call that answers: the host is alive)."""
        return str(ray_module().get_runtime_context().get_node_id())

    def root(self) -> str:
        """Where this host makes its children's node directories now (:func:`node_root`)."""
        return node_root()

    def open(self, key: str, then: Sequence[tuple[str, tuple[Any, ...]]] = ()) -> list[Any]:
        """Make the state of the child named *key* here (its :attr:`HostedChild.ident`: its
        key and a nonce; one that exists is refused), then make *then*'s calls on it
        (:meth:`calls`): what they returned."""
        with self._lock:
            if key in self._children:
                raise RuntimeError(f"child {key!r} is already on this node")
            self._children[key] = ChildActor(forks=self._forks, loop=self._loop, link=self._link)
        return self.calls(key, then)

    def call(self, key: str, name: str, args: tuple[Any, ...]) -> Any:
        """Child *key*'s :class:`ChildActor` method *name* with *args*, as its actor would;
        ``watch`` (after its start): its end goes to the host's exit stream (:meth:`exits`),
        and with ``(True,)`` its state goes there too (it ships nothing back and serves no
        egress proxy: nothing is asked of it after its end)."""
        if name not in _CALLS and name != "watch":
            raise RuntimeError(f"a node host does not serve {name!r}")
        with self._lock:
            child = self._children.get(key)
        if child is None:
            raise RuntimeError(f"child {key!r} is gone from its node host")
        if name == "watch":
            if child.proc is not None:  # none when its start refused it: nothing to watch
                if args and args[0]:
                    with self._lock:
                        self._release_at_end.add(key)
                self._exits.watch(key, child.proc)
            return None
        return getattr(child, name)(*args)

    def exits(self, wait: float) -> dict[str, tuple[int, bytes]]:
        """The watched children that ended since the last call (their state name → status
        and output tail), waiting up to *wait* seconds for one: one long poll a host for all
        its children's ends (:mod:`._node_exits`). Those watched to be released are, first:
        their node directories are gone when the supervisor learns of their ends."""
        ended = self._exits.collect(wait)
        for key in ended:
            with self._lock:
                release = key in self._release_at_end
                self._release_at_end.discard(key)
            if release:
                self.release(key)
        return ended

    def contexts(self, asked: Sequence[Asked]) -> list[tuple[str, Any]]:
        """The resume contexts of several children (:meth:`ChildActor.context`) in one round
        trip, answered in order (:func:`._ray_contexts.answer`)."""
        return answer(asked, self._context, ContextRefused)

    def _context(self, key: str, backend: str, resume: str) -> dict[str, bytes]:
        with self._lock:
            child = self._children.get(key)
        if child is None:
            raise RuntimeError("the child is gone from its node host")
        return child.context(backend, resume)

    def calls(self, key: str, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Child *key*'s methods, one after the other, in one round trip (a launch's steps are
        a Ray call each otherwise); the first that raises ends the list."""
        return [self.call(key, name, tuple(args)) for name, args in calls]

    def finish(self, key: str, calls: Sequence[tuple[str, tuple[Any, ...]]] = ()) -> list[Any]:
        """Child *key*'s last *calls* (its stop), then :meth:`release`, whatever they did: what
        they returned (nothing when it was released at its end already). A child's end is one
        round trip, not a stop, a clean-up and a release."""
        with self._lock:
            if key not in self._children:
                return []
        try:
            return self.calls(key, calls)
        finally:
            self.release(key)

    def release(self, key: str) -> None:
        """Child *key* is done here: its process group stopped (if it still runs; what is left
        of it once its leader has ended is killed), its node directory removed, its state
        forgotten."""
        with self._lock:
            child = self._children.pop(key, None)
            self._release_at_end.discard(key)
        if child is None:
            return
        proc = getattr(child, "proc", None)
        if proc is not None and proc.poll() is None:
            child.stop(1.0)
        elif proc is not None:  # a background process it left in its group goes with it
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        child.clean_up()

    def count(self) -> int:
        with self._lock:
            return len(self._children)


class _Method:
    def __init__(self, child: "HostedChild", name: str) -> None:
        self._child, self._name = child, name

    def remote(self, *args: Any) -> Any:
        return self._child.host.call.remote(self._child.ident, self._name, args)


class HostedChild:
    """The supervisor's handle on one child in its node's host: ``handle.start.remote(...)``
    as on a child's own actor; :meth:`release` where the actor would be killed."""

    def __init__(self, host: Any, key: str, node: str, slots: "Slots") -> None:
        self.host, self.key, self.node, self._slots = host, key, node, slots
        #: Its state's name in the host: the key and a nonce. A revived child reuses its key,
        #: and the release of its last life (sent without waiting) may reach the host after
        #: the new life has opened; each touches only its own state.
        self.ident = f"{key}#{secrets.token_hex(8)}"
        #: Its host's link owner, when its channel goes over that link (``._ray``), and where
        #: that host makes node directories.
        self.link = self.root = ""
        #: Its state exists in its host (else it is made with its first steps).
        self.opened = True
        self._released = self._freed = False

    def __getattr__(self, name: str) -> _Method:
        if name not in _CALLS:
            raise AttributeError(name)
        return _Method(self, name)

    def calls(self, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> Any:
        """The object ref of :meth:`NodeHost.calls` for this child: its steps in one call."""
        return self.host.calls.remote(self.ident, list(calls))

    def finish(self, calls: Sequence[tuple[str, tuple[Any, ...]]] = ()) -> Any:
        """The object ref of :meth:`NodeHost.finish` for this child: its last steps and its
        release in one call. Its slot frees once the caller has that call's answer (or its
        child's exit is seen), as after a stop and a release."""
        self._released = True
        return self.host.finish.remote(self.ident, list(calls))

    def free_slot(self) -> None:
        """The child has ended: its node's slot frees (its state stays for a bring-back)."""
        if not self._freed:
            self._freed = True
            self._slots.free(self.node)

    def forget(self) -> None:
        """The child ended and its host released it then (``watch``'s *release*): its slot
        frees, and nothing is sent."""
        self._released = True
        self.free_slot()

    def release(self) -> None:
        """The child is done: the host forgets it (fire and forget) and its slot frees."""
        self.free_slot()
        if self._released or self.host is None:
            return
        self._released = True
        with contextlib.suppress(Exception):  # the host is gone, and the child with it
            self.host.release.remote(self.ident)

    def __del__(self) -> None:
        # As a child's own actor goes with its last handle, so does its state in the host.
        with contextlib.suppress(Exception):
            self.release()


def end_actor(actor: Any) -> None:
    """End a child's actor: its own actor is killed, a hosted child only released."""
    if isinstance(actor, HostedChild):
        actor.release()
    else:
        ray_module().kill(actor, no_restart=True)


class Slots:
    """The supervisor's count of children per node against each node's ``agent_slot``."""

    def __init__(self) -> None:
        self._used: dict[str, int] = {}
        #: Nodes passed over until the monotonic time given (their host could not start).
        self._avoid: dict[str, float] = {}
        self._listed: list[dict[str, Any]] = []
        self._listed_at = -NODES_TTL_S
        self._lock = threading.Lock()

    def _nodes(self) -> list[dict[str, Any]]:
        """``ray.nodes()``, asked of the GCS at most once every :data:`NODES_TTL_S` (a queue
        of waiting launches polls this)."""
        now = time.monotonic()
        if now - self._listed_at > NODES_TTL_S:
            self._listed, self._listed_at = list(ray_module().nodes()), now
        return self._listed

    def lanes(self, node: str, slot: str, nodes: Sequence[Mapping[str, Any]] | None = None) -> int:
        """*node*'s *slot* resource (0 if it is not listed). *nodes*: ``ray.nodes()``."""
        for listed in self._nodes() if nodes is None else nodes:
            if str(listed.get("NodeID")) == node:
                return int((listed.get("Resources") or {}).get(slot, 0))
        return 0

    def avoid(self, node: str, seconds: float = AVOID_S) -> None:
        """Pass *node* over for *seconds* (Ray may still list a dead node as alive)."""
        with self._lock:
            self._avoid[node] = time.monotonic() + seconds

    def take(
        self,
        slot: str,
        needs: Mapping[str, float],
        spread: bool = True,
        nodes: Sequence[Mapping[str, Any]] | None = None,
    ) -> str | None:
        """A node (id) with a free slot, now counted as used; ``None`` if every lane is full.
        *needs*: further resources the node must have. Spread: the least used node first;
        otherwise pack: the most used one that still has room. *nodes*: ``ray.nodes()``."""
        free: list[tuple[int, str]] = []
        for node in self._nodes() if nodes is None else nodes:
            have = node.get("Resources") or {}
            if not node.get("Alive") or have.get(slot, 0) <= 0:
                continue
            if any(have.get(name, 0) < amount for name, amount in needs.items()):
                continue
            free.append((int(have[slot]), str(node["NodeID"])))
        with self._lock:
            now, used = time.monotonic(), self._used
            # (used, order listed): ties go to the node listed first, either way.
            room = [
                (used.get(node, 0), i if spread else -i, node)
                for i, (cap, node) in enumerate(free)
                if used.get(node, 0) < cap and self._avoid.get(node, 0) <= now
            ]
            if not room:
                return None
            chosen = (min(room) if spread else max(room))[2]
            self._used[chosen] = self._used.get(chosen, 0) + 1
            return chosen

    def free(self, node: str) -> None:
        with self._lock:
            if self._used.get(node, 0) > 0:
                self._used[node] -= 1


_hosts: dict[str, Any] = {}
#: One lock per node: hosts on different nodes start at once, one node's only once.
_node_locks: dict[str, threading.Lock] = {}
_hosts_lock = threading.Lock()
_host_cls: Any = None


def forget_host(node: str, host: Any) -> None:
    """*host* did not answer: the next :func:`host_on` for *node* starts a new one."""
    with _hosts_lock:
        if _hosts.get(node) is host:
            del _hosts[node]


def known_host(node: str) -> Any:
    """The node host known on *node*, or ``None``: :func:`host_on` without its thread."""
    with _hosts_lock:
        return _hosts.get(node)


def host_on(node: str, slots: int) -> tuple[Any, bool]:
    """The node host on *node* (*slots* lanes: its threads, :func:`threads_for`): the one
    known (a dead one fails its first call, and the caller :func:`forget_host` s it), else a
    new one; and whether it is new. Blocking: runs in a worker thread."""
    global _host_cls  # noqa: PLW0603 - ray.remote once per process
    ray = ray_module()
    from ray.util.scheduling_strategies import (  # noqa: PLC0415 - optional extra
        NodeAffinitySchedulingStrategy,
    )

    with _hosts_lock:
        lock = _node_locks.setdefault(node, threading.Lock())
        if _host_cls is None:
            _host_cls = ray.remote(max_restarts=0)(NodeHost)
    with lock:
        known = _hosts.get(node)
        if known is not None:
            return known, False
        host = _host_cls.options(
            num_cpus=0,
            max_concurrency=threads_for(slots),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        ).remote()
        ray.get(host.ping.remote(), timeout=300)
        _hosts[node] = host
        return host, True
