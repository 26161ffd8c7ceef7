"""A child launched under its Ray actor, as the supervisor holds it (:mod:`._ray`): its exit
watched through the actor, its stop through the actor to its process group, a shipped worker's
changes fetched back before the actor goes, its egress refusals polled back from its node, and
its node directory swept from its node when the actor itself was lost (:mod:`._ray_sweep`).
"""

import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from orchestrator.launch._context import ContextRefused
from orchestrator.launch._launcher import OutputSink
from orchestrator.launch._ray_host import HostedChild, end_actor
from orchestrator.launch._ray_node import ReturnRefused, ray_module
from orchestrator.launch._ray_refs import resolved
from orchestrator.launch._ray_sweep import sweep_on_node

__all__ = ["LaunchedRay"]

log = logging.getLogger("orchestrator")

#: How long a stop waits for a child whose host releases it at its end to end on its own (its
#: channel closed) before it asks its host to stop it.
END_WAIT_S = 1.0


@attrs.define(eq=False)
class LaunchedRay:
    """A child under its actor."""

    pid: int
    node: str
    actor: Any
    exited: trio.Event = attrs.Factory(trio.Event)
    returncode: int | None = None
    #: What awaits the child's end (its status and output tail): its own ``wait`` call, or its
    #: host's exit stream (:mod:`._ray_exits`).
    _outcome: Callable[[], Awaitable[tuple[int, bytes]]] | None = None
    #: ``(backend, resume)``: its context, fetched with its host's other children's
    #: (:mod:`._ray_contexts`); ``None``: a call of its own.
    _contexts: Callable[[str, str], Awaitable[dict[str, bytes] | str]] | None = None
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
    #: Whether the child is a fork of its node host's fork server (:mod:`._ray_forks`), not a
    #: fresh interpreter.
    forked: bool = False
    #: Whether its channel rides its node host's link (:mod:`._node_link`), not a TLS
    #: connection of its own.
    carried: bool = False
    #: Whether its host releases it when its end is handed over (its node directory gone, its
    #: group killed): an end before its stop needs no call (``NodeHost.exits``).
    released_at_end: bool = False
    #: The child's node directory on its node; removed by its actor when the child ends, or
    #: by a task pinned to its node when the actor was lost (:mod:`._ray_sweep`).
    node_dir: str = ""
    _nursery: trio.Nursery | None = None
    _swept: bool = False

    async def _watch(self, sink: OutputSink) -> None:
        # Awaited without a thread (:mod:`._ray_refs`): a watch once held one of trio's 40
        # worker threads for its child's life, and from the 41st remote child every Ray call
        # waited for a thread that never freed.
        try:
            assert self._outcome is not None  # noqa: S101 - set by its launch
            code, out = await self._outcome()
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
            if isinstance(self.actor, HostedChild):
                self.actor.free_slot()  # its node's lane, as a child's own actor's exit would
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

        async def finish(child_running: bool) -> bool:
            """A hosted child that ships nothing back ends in one round trip: its stop (if it
            still runs), its node directory's removal and its release; whether its host was
            gone (its node directory is then swept)."""
            assert isinstance(self.actor, HostedChild)  # noqa: S101 - the caller's test
            try:
                done = await resolved(
                    self.actor.finish([("stop", (grace,))] if child_running else []),
                    timeout=grace + 70,
                )
            except Exception as exc:
                log.info("ray child %s: stop through its host failed: %s", self.pid, exc)
                self.actor.free_slot()  # its host is gone, and the child with it
                return True
            self.actor.free_slot()  # stopped and released: its lane is free
            if child_running and done:  # none: its host released it at its end meanwhile
                self._stopped = int(done[0])
            return False

        def stop(child_running: bool) -> bool:
            try:
                if child_running:
                    self._stopped = ray.get(self.actor.stop.remote(grace), timeout=grace + 10)
                if self.ships_back:
                    self._bring_back(ray)
                ray.get(self.actor.clean_up.remote(), timeout=60)
            except Exception as exc:  # actor gone: PDEATHSIG took the child
                log.info("ray child %s: stop through actor failed: %s", self.pid, exc)
                if self.ships_back:
                    self.lost = f"the node's changes never came back ({type(exc).__name__})"
                orphaned = True
            else:
                orphaned = False
            # Always: an actor left alive would hold its node's agent_slot.
            end_actor(self.actor)
            return orphaned

        if not self._killed:
            self._killed = True
            if isinstance(self.actor, HostedChild) and self.released_at_end:
                # Its channel is closed (or it was told to shut down): it ends on its own,
                # and its host releases it then. Asked to stop only if it does not.
                with trio.move_on_after(min(grace, END_WAIT_S)):
                    await self.exited.wait()
                if self.exited.is_set():
                    self.actor.forget()
                    return
            if isinstance(self.actor, HostedChild) and not self.ships_back:
                orphaned = await finish(not self.exited.is_set())
            else:
                orphaned = await trio.to_thread.run_sync(
                    stop, not self.exited.is_set(), abandon_on_cancel=True
                )
            if orphaned:
                self._sweep_soon()
        with trio.move_on_after(grace + 15):
            await self.exited.wait()

    def _bring_back(self, ray: Any) -> None:
        """Fetch the node's bundle into :attr:`returned`; a node that refused to send it (over
        the cap) says why in :attr:`lost`. Blocking: runs in a worker thread."""
        try:
            self.returned = ray.get(self.actor.bring_back.remote(), timeout=120)
        except Exception as exc:
            refused = getattr(exc, "cause", None)
            if not isinstance(refused, ReturnRefused):
                raise
            self.lost = str(refused)

    async def context(self, backend: str, resume: str) -> dict[str, bytes] | str:
        """What the child's backend resumes from, fetched from its node (``ChildActor.context``):
        its files, or the one line why they are not sent (over the cap). Raises when the
        actor or its node is gone."""
        if self._contexts is not None:
            return await self._contexts(backend, resume)
        try:
            got: dict[str, bytes] = await resolved(
                self.actor.context.remote(backend, resume), timeout=60
            )
        except Exception as exc:
            refused = getattr(exc, "cause", None)
            if not isinstance(refused, ContextRefused):
                raise
            return str(refused)
        return got

    async def poll_refusals(self, refused: Callable[[str, str], None]) -> None:
        """Hand each egress refusal of the child's node-side proxy to *refused* (the
        supervisor's reject and run log) until the child has ended and the actor is gone."""
        while True:
            try:
                got = await resolved(self.actor.refusals.remote(5.0), timeout=30)
            except Exception:  # the actor is gone, and its proxy with it
                return
            for target, reason in got:
                refused(target, reason)
            if self.exited.is_set() and not got:
                return

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the Launched protocol
        await trio.lowlevel.checkpoint()

    def describe(self) -> str:
        return f"ray actor on node {self.node[:12]} pid {self.pid}"
