"""One child's launch: its surface's launcher, its sandbox, its egress proxy and its connection.

A launch places the child command in its sandbox (:mod:`orchestrator.launch._sandboxing`) and
hands it to the surface's launcher; an unwrapped ``process`` child is forked from the fork
server. A ``process`` child inherits its connection (a socket pair end, served here) and its
sealed loadout; a pane's child reads a 0600 loadout file and dials the listener; a child on a
Ray node gets its node directory (named on its node), the workspace as a bundle and a sandbox
its node plans (:mod:`orchestrator.launch._nodeplan`), and dials the TLS door.
"""

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

import ipc
from orchestrator.core._admission import accept_own, inherited_pair
from orchestrator.core._context import kept_context
from orchestrator.core._remote import REMOTE_SURFACES, door_target, node_layout
from orchestrator.core._run import ChildRun
from orchestrator.core._shipping import ReaderShipments
from orchestrator.launch._cmux import CmuxLauncher
from orchestrator.launch._egress import EgressProxy, allowlist
from orchestrator.launch._kill import MARKER_ENV, run_marker
from orchestrator.launch._launcher import (
    Launched,
    Launcher,
    LaunchSpec,
    ProcessLauncher,
    Shipment,
    child_argv,
    inherited_child_argv,
)
from orchestrator.launch._nodeplan import node_directory_of, plan_for
from orchestrator.launch._ray import RayLauncher
from orchestrator.launch._ray_launched import LaunchedRay
from orchestrator.launch._sandboxing import Placement, place, reaches_a_model
from orchestrator.launch._tmux import TmuxLauncher
from orchestrator.spend._gateway import gateway_url, model_gateway
from orchestrator.spend._keyless import GATEWAY_ENV, carries_credentials, keyless

if TYPE_CHECKING:
    from orchestrator.core._host import SpawnHost

__all__ = ["Launching", "child_environment", "inherits"]

#: Backends whose resume id is a file in the child's scratch (``core._plan.resume_id``).
NAMED_RESUME = frozenset({"builtin", "pi"})


def inherits(surface: str) -> bool:
    """Whether a child on *surface* inherits its connection and loadout from us: it does
    unless a terminal (tmux, cmux) or a Ray actor starts it."""
    return surface == "process"


@attrs.define(eq=False)
class Launching:
    """The session's launchers, and each child's launch."""

    sup: "SpawnHost[ChildRun]"
    shipments: ReaderShipments = attrs.Factory(ReaderShipments)

    def launcher_for(self, surface: str) -> Launcher:
        """The launcher for a validated *surface*, created on first use and then shared."""
        sup = self.sup
        launcher = sup.launchers.get(surface)
        if launcher is None:
            # Kept windows let a person read why a child failed; off by default.
            keep = os.environ.get("FLEET_KEEP_FAILED_PANES", "").lower() in {"1", "true", "yes"}
            if surface == "tmux":
                launcher = TmuxLauncher.private(
                    sup.config.paths.tmux_socket,
                    sup.config.session,
                    base_env=os.environ,
                    keep_failed=keep,
                )
            elif surface == "tmux:current":
                launcher = TmuxLauncher.current(os.environ, keep_failed=keep)
            elif surface == "cmux":
                launcher = CmuxLauncher.from_environment(os.environ, keep_failed=keep)
            elif surface == "ray":
                launcher = RayLauncher(
                    address=sup.config.ray_address or None,
                    slots=sup.config.max_subagents,
                    certify=sup.remote.certify,
                    placed=sup.remote.placed,
                    vouch=sup.remote.vouch,
                    nursery=sup.nursery,
                    session=sup.config.session,
                    node_host=sup.config.ray_node_host,
                    spread=sup.config.ray_placement != "pack",
                )
            else:
                launcher = ProcessLauncher(forks=sup.fork_server, boxed=sup.boxed_fork_server)
            sup.launchers[surface] = launcher
        return launcher

    async def launch(self, run: ChildRun, nursery: trio.Nursery) -> Launched:
        """Start *run*'s process through the session's launcher, sandboxed by its policy."""
        asked = time.monotonic()  # what "the workspace as it is now" means for this launch
        loadout = run.card if run.card is not None else ipc.Loadout.from_file(run.loadout)
        launcher = self.launcher_for(run.record.surface)
        remote = launcher if isinstance(launcher, RayLauncher) else None
        try:
            if remote is not None:
                loadout = await self._open_node(run, loadout, remote)
            launched = await self._start(run, loadout, launcher, nursery, asked)
        except BaseException:
            if remote is not None:
                with trio.CancelScope(shield=True):
                    await remote.close_node(run.key)
            raise
        return launched

    async def _open_node(
        self, run: ChildRun, loadout: ipc.Loadout, remote: RayLauncher
    ) -> ipc.Loadout:
        """Have *run*'s actor make its node directory on its node (named there, in the node's
        root of them), put that directory's paths in its loadout, and have the
        actor write the loadout there; the loadout the child gets."""
        # Its key and CSR are made on its node in the same round trip, in its TLS directory.
        node = await remote.open_node(run.key, tls=str(node_layout(Path()).tls))
        layout = node_layout(node_directory_of(node, self.sup.config.session, run.key))
        run.log.write(f"node directory {layout.root}")
        # A resume file's place is in the scratch, on its node (the journal names where the
        # supervisor keeps its copy: core._context).
        resume = loadout.resume
        if loadout.backend in NAMED_RESUME and resume:
            resume = str(layout.scratch / Path(resume).name)
        loadout = attrs.evolve(
            loadout,
            workspace=str(layout.checkout),
            scratch=str(layout.scratch),
            tls=str(layout.tls),
            resume=resume,
            context_inline=True,  # its turns' Settled carry its context: no fetch a turn
        )
        if remote.carries and loadout.socket.startswith(ipc.TLS_SCHEME):
            # Its node host's link carries its channel: the door is no egress of its own.
            door = door_target(loadout.socket)
            loadout = attrs.evolve(loadout, egress=[t for t in loadout.egress if t != door])
        run.card, run.loadout = loadout, str(layout.loadout)
        await remote.write_files(run.key, {run.loadout: loadout.to_json()})
        if loadout.restarted:  # a revive: the context kept on our side goes to its new node
            files = await trio.to_thread.run_sync(
                kept_context,
                self.sup.config.paths.scratch / run.key,
                loadout.backend,
                loadout.resume,
                loadout.workspace,
            )
            await remote.restore(run.key, files)
            run.log.write(f"context restored on its node ({len(files)} file(s))")
        return loadout

    async def _start(
        self,
        run: ChildRun,
        loadout: ipc.Loadout,
        launcher: Launcher,
        nursery: trio.Nursery,
        asked: float,
    ) -> Launched:
        sup = self.sup
        proxy = await self._open_egress(run, loadout, nursery)
        pair: tuple[socket.socket, socket.socket] | None = None
        sealed = -1
        if inherits(run.record.surface):
            pair = inherited_pair()
            sealed = ipc.sealed_loadout(loadout)
            argv = inherited_child_argv(sup.config.python, pair[1].fileno(), sealed)
        else:
            argv = child_argv(sup.config.python, run.loadout)
        egress = proxy if isinstance(proxy, Path) or proxy is None else proxy.path
        try:
            if isinstance(launcher, RayLauncher):
                # Its node plans its sandbox: that node's interpreter, probe and paths; until
                # it has, the command is the plain one (the launcher does not run it).
                launcher.plan(
                    run.key,
                    plan_for(
                        sup.config,
                        loadout,
                        argv_tail=argv[1:],
                        loadout_file=run.loadout,
                        egress="" if egress is None else str(egress),
                    ),
                )
                placement = Placement(argv=argv, env={}, sandboxed=False, reason="")
            else:
                placement = place(
                    argv,
                    config=sup.config,
                    loadout=loadout,
                    scratch=Path(loadout.scratch),
                    egress=egress,
                    loadout_file=Path(run.loadout) if run.loadout else None,
                )
                self._record_sandbox(run, placement.sandboxed, placement.reason)
            env = {
                **self._credentials(run, loadout, proxy, placement),
                **placement.env,
                # Unique to this run: the kill ladder finds every process that inherited it.
                MARKER_ENV: run_marker(sup.config.session, run.key),
            }
            spec = LaunchSpec(
                key=run.key,
                name=run.record.name,
                argv=placement.argv,
                cwd=loadout.workspace,
                env=env,
                inherit=None if pair is None else (pair[1].fileno(), sealed),
                # Unwrapped, the command is the plain child: a fork of the preloaded server will do.
                # On a Ray node every child is wrapped there, and forked from its node host's
                # server unless it carries a credential (which would stay in that server).
                plain=not carries_credentials(env)
                if isinstance(launcher, RayLauncher)
                else not placement.sandboxed,
                # The sandboxed fork server holds no secret: a child given one is started fresh
                # (a fork would leave the secret in the server's memory for the next child).
                view=None if carries_credentials(env) else placement.view,
                tls=loadout.tls,
                door=loadout.socket if loadout.socket.startswith(ipc.TLS_SCHEME) else "",
                ship=await self._shipment(run, loadout, asked),
            )
            launched = await launcher.launch(spec, run.log.output, nursery)
            if isinstance(launched, LaunchedRay):
                self._record_sandbox(run, launched.sandboxed, launched.unsandboxed_reason)
                if launched.forked:
                    run.log.write("forked from its node's fork server")
                if launched.carried:
                    run.log.write("its channel rides its node host's link")
        except BaseException:
            if pair is not None:
                pair[0].close()
            raise
        finally:
            # The child holds its own copies now (or never will): ours would keep the pair
            # open past the child's death and the loadout readable.
            if pair is not None:
                pair[1].close()
            if sealed >= 0:
                os.close(sealed)
        if isinstance(proxy, EgressProxy):  # a node's proxy admits its child itself
            proxy.admit(launched.pid)
        if pair is not None:
            sup.nursery.start_soon(self._serve_inherited, run, pair[0])
        return launched

    @staticmethod
    def _record_sandbox(run: ChildRun, sandboxed: bool, reason: str) -> None:
        """What peek and the handoff say of *run*'s sandbox, and the run log's line."""
        run.record.sandboxed = sandboxed
        run.record.unsandboxed_reason = reason
        if not sandboxed:
            run.log.write(f"running unsandboxed: {reason}")

    @staticmethod
    def _credentials(
        run: ChildRun,
        loadout: ipc.Loadout,
        proxy: EgressProxy | Path | None,
        placement: Placement,
    ) -> dict[str, str]:
        """*run*'s environment from ours, keyless when it is sandboxed here (:mod:`._keyless`):
        no credential but those its definition grants; its model's key a placeholder when the
        gateway serves that model (and :data:`GATEWAY_ENV` its URL). A child whose model the
        gateway cannot serve keeps the user's credentials, and its run log says so."""
        env = child_environment(os.environ)
        if not placement.sandboxed or not isinstance(proxy, EgressProxy | None):
            return env  # unsandboxed (it could read ours), or on a Ray node (no gateway there)
        model = loadout.model
        served = isinstance(proxy, EgressProxy) and bool(proxy.models)
        if reaches_a_model(loadout.backend, model) and not served:
            run.log.write(
                f"model {model.name or model.kind!r}: no gateway serves it, so the child holds "
                "the user's credentials (give it an openai:/anthropic: model to keep keys out)"
            )
            return env
        placeholder = [model.api_key_env] if served and model.api_key_env else []
        env = keyless(env, granted=loadout.secret_env, placeholder=placeholder)
        if served:
            env[GATEWAY_ENV] = gateway_url(model)
            held = " (the child has a placeholder)" if env.get(model.api_key_env) else ""
            run.log.write(f"model key held by the gateway{held}")
        return env

    async def _shipment(self, run: ChildRun, loadout: ipc.Loadout, asked: float) -> Shipment | None:
        """A child on another node gets the workspace as a bundle: a worktree child its
        snapshot, bringing its changes back as one; a reader the workspace as it is, read-only
        (:mod:`orchestrator.workspace._bundle`)."""
        if run.record.surface not in REMOTE_SURFACES:
            return None
        if run.record.mode == "worktree":
            bundle = await self.sup.worktrees.bundle(run.key)
            return Shipment(bundle=bundle, work_tree=loadout.workspace, back=True)
        # A reading child gets a read-only checkout of the workspace as it is now (one bundle
        # for the children asked for before it was made: orchestrator.core._shipping).
        shipped = await self.shipments.ship(Path(run.record.workspace), asked, self.sup.nursery)
        return Shipment(
            bundle=shipped.bundle, work_tree=loadout.workspace, read_only=True, tree=shipped.tree
        )

    async def _open_egress(
        self, run: ChildRun, loadout: ipc.Loadout, nursery: trio.Nursery
    ) -> EgressProxy | Path | None:
        """Start *run*'s egress proxy in its own nursery (so it ends with the run); for a child
        on a Ray node, its actor serves it there (the socket's path is returned).

        None when the child has no allowlist or will not be sandboxed (it then has the host's
        network, and a relay would have nothing to do)."""
        sup = self.sup
        if not loadout.egress or sup.config.sandbox == "off" or loadout.sandbox == "none":
            return None

        def refused(target: str, reason: str) -> None:
            run.log.write(f"egress refused {target!r}: {reason}")
            sup.reject("egress", run.key, {"target": target, "reason": reason})

        launcher = self.launcher_for(run.record.surface)
        if isinstance(launcher, RayLauncher):
            # On the child's node, by its actor: the socket in its node directory.
            path = Path(loadout.scratch).parent / "egress.sock"
            await launcher.open_egress(run.key, str(path), loadout.egress, refused)
            run.log.write(f"egress allowed to {', '.join(loadout.egress)} (on its node)")
            return path
        directory = sup.config.paths.egress
        ipc.ensure_private_dir(directory)
        proxy = EgressProxy(
            path=directory / f"{run.key}.sock",
            allowed=allowlist(loadout.egress),
            on_refused=refused,
            models=model_gateway(sup.spend, run, loadout.model, loadout.egress, os.environ),
        )
        await nursery.start(proxy.serve)
        run.log.write(f"egress allowed to {', '.join(loadout.egress)}")
        return proxy

    async def _serve_inherited(self, run: ChildRun, ours: socket.socket) -> None:
        """The hello on our end of *run*'s socket pair, then the run's channel until it ends."""
        sup = self.sup

        def token() -> str | None:
            return None if run.finishing or run.connected.is_set() else run.token

        try:
            channel, hello = await accept_own(
                ours,
                run.key,
                token,
                timeout=sup.config.hello_timeout,
                request_timeout=sup.config.request_timeout,
            )
        except ipc.HandshakeError as exc:
            sup.refuse_hello(exc.reason, run.key, via="pair")
            return
        await run.attach(channel, hello)


def child_environment(parent: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The child's environment: the parent's minus proxies and fleet session variables."""
    dropped = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "fleet_session"}
    env = {k: v for k, v in parent.items() if k.lower() not in dropped}
    env["FLEET_CHILD"] = "1"
    return env
