"""Spawning: a batch planned, reserved, prepared and launched, and one child's launch.

A batch is all-or-nothing up to its launch: every request is planned and checked (definition,
mode, sandbox availability, surface, names) and the capacity for all of it is reserved before
anything is written; then every child's scratch directory, loadout and log are written
concurrently in worker threads (a loadout's two fsyncs would otherwise stall every running
child's I/O, one child after another), and a failure there refuses the whole batch with nothing
started. The batch then launches together. A launch places the child command in its sandbox
and hands it to the surface's launcher; an unwrapped ``process`` child is forked from the fork
server.

A ``process`` child's loadout is never a file: it inherits a sealed memfd holding it and its
end of a socket pair that is its connection, and the hello on our end may name only that child
(:mod:`orchestrator.core._admission`). Only a pane's child (tmux, cmux), which the terminal
starts and so cannot inherit from us, gets a 0600 loadout file and connects to the listener.
"""

import errno
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

import ipc
from orchestrator._errors import FleetError, OperationFailed, UsageError
from orchestrator._records import ChildRecord, SpawnRequest
from orchestrator.core._admission import accept_own, inherited_pair
from orchestrator.core._plan import plan_spawn, resume_id
from orchestrator.core._remote import REMOTE_SURFACES
from orchestrator.core._run import ChildRun
from orchestrator.governance._checked import instruction
from orchestrator.governance._diagnostics import RunLog
from orchestrator.governance._roles import load_roles
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
from orchestrator.launch._ray import RayLauncher
from orchestrator.launch._sandboxing import check_available, place
from orchestrator.launch._tmux import TmuxLauncher
from orchestrator.workspace._bundle import ship_workspace

if TYPE_CHECKING:
    from orchestrator.core._host import SpawnHost


#: The errors of a full filesystem (out of blocks or inodes, or over quota).
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


@attrs.frozen(kw_only=True)
class _Prepared:
    token: str
    card: ipc.Loadout
    #: Its file, for a pane's child; ``""`` when the child inherits it.
    loadout: str
    log: RunLog


def inherits(surface: str) -> bool:
    """Whether a child on *surface* inherits its connection and loadout from us: it does
    unless a terminal (tmux, cmux) or a Ray actor starts it."""
    return surface == "process"


class _PrepareError(Exception):
    """One record of a batch could not be prepared; *cause* says why."""

    def __init__(self, key: str, cause: Exception) -> None:
        super().__init__(f"{key}: {cause}")
        self.key = key
        self.cause = cause


@attrs.define(eq=False)
class Spawning:
    """The supervisor's spawning: batches, their files, launchers and launches."""

    sup: "SpawnHost[ChildRun]"
    # One batch at a time: plans, names and reservations are checked against a settled fleet.
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    async def spawn(
        self, requests: Sequence[SpawnRequest], *, parent: ChildRun | None
    ) -> list[ChildRecord]:
        sup = self.sup
        if not requests:
            raise UsageError("spawn: no task given")
        async with self._lock:
            definitions = sup.agents()
            roles = load_roles(sup.config.home, sup.config.workspace)
            plans = [
                plan_spawn(
                    request,
                    definitions=definitions,
                    config=sup.config,
                    workflow_mode=sup.mode,
                    roles=roles,
                )
                for request in requests
            ]
            limits = [
                sup.spend.limit_for(
                    plan.agent,
                    definition=definitions[plan.agent].budget,
                    requested=request.budget,
                    parent=None if parent is None else parent.key,
                )
                for plan, request in zip(plans, requests, strict=True)
            ]
            for plan in plans:
                check_available(sup.config, plan.agent)
                self.launcher_for(plan.surface)  # refuses tmux:current outside tmux, up front
            names = [p.name for p in plans if p.name]
            live = {r.name for r in sup.registry.live()}
            clash = next((n for n in names if n in live or names.count(n) > 1), None)
            if clash is not None:
                raise UsageError(f"spawn: the name {clash!r} is already taken (pick another)")
            sup.capacity.reserve(len(plans))
            records = []
            for plan, limit in zip(plans, limits, strict=True):
                key = sup.registry.new_key()
                record = ChildRecord(
                    key=key,
                    name=plan.name or f"{plan.agent}-{key[1:]}",
                    agent=plan.agent,
                    mode=plan.mode,
                    task=plan.task,
                    workspace=str(sup.config.workspace),
                    backend=plan.loadout_fields["backend"],
                    surface=plan.surface,
                    workflow_mode=sup.mode,
                    depth=1 if parent is None else parent.record.depth + 1,
                    parent=None if parent is None else parent.key,
                    role=plan.role,
                    models=[plan.model_label] if plan.model_label else [],
                    schema=plan.schema,
                )
                sup.registry.add(record)
                sup.spend.open(record, limit, plan.loadout_fields["model"].name)
                records.append(record)
                resume = resume_id(record.backend, sup.config.paths.scratch / key)
                if resume:
                    plan.loadout_fields["resume"] = resume
            try:
                runs = await self._prepare_all(records, [p.loadout_fields for p in plans])
            except Exception as exc:
                # Nothing runs for any of the batch: give back every slot and forget every
                # record, so a failed preparation leaves nothing live.
                for record in records:
                    sup.registry.records.pop(record.key, None)
                    sup.spend.ledger.accounts.pop(record.key, None)
                sup.capacity.release(len(plans))
                sup.notes.changed()
                if isinstance(exc, FleetError):
                    raise
                failed = getattr(exc, "key", records[0].key)
                cause = exc.__cause__ or exc
                if isinstance(cause, OSError) and cause.errno in NO_SPACE:
                    raise OperationFailed(
                        f"spawn {failed}: the state directory {sup.config.home} has no space "
                        f"left ({cause.strerror}); free some space there and spawn again"
                    ) from exc
                raise OperationFailed(
                    f"spawn {failed}: could not prepare its launch: {cause} "
                    "(fix the cause and spawn again)"
                ) from exc
            for run, plan in zip(runs, plans, strict=True):
                sup.journal.spawned(run.record, plan.loadout_fields)
                sup.hibernation.spawned(run.record, plan.loadout_fields)
            # Launch the batch together: a worktree or a fork each child waits on is its own.
            async with trio.open_nursery() as launching:
                for run in runs:
                    sup.runs[run.key] = run
                    run.queue_prompt(task_prompt(run.record))
                    launching.start_soon(sup.nursery.start, run.run)
            sup.notes.changed()
            return records

    async def _prepare_all(
        self, records: Sequence[ChildRecord], fields: Sequence[dict[str, Any]]
    ) -> list[ChildRun]:
        """Every record's files (directories, loadout, log), written concurrently off the
        event loop: a loadout's two fsyncs would otherwise stall every running child's I/O
        and make a batch start one child per fsync."""
        sup = self.sup
        paths = sup.config.paths
        for directory in (paths.loadouts, paths.logs, paths.scratch):
            ipc.ensure_private_dir(directory)
        if any(record.mode == "worktree" for record in records):
            ipc.ensure_private_dir(paths.worktrees)
        prepared: dict[str, _Prepared] = {}
        failures: list[_PrepareError] = []
        fields = [
            await sup.remote.fields_for(
                record.key, paths.scratch / record.key, paths.root / "checkouts", loadout_fields
            )
            if record.surface in REMOTE_SURFACES
            else loadout_fields
            for record, loadout_fields in zip(records, fields, strict=True)
        ]

        async def prepare(record: ChildRecord, loadout_fields: dict[str, Any]) -> None:
            try:
                prepared[record.key] = await trio.to_thread.run_sync(
                    self.prepare_one, record, loadout_fields
                )
            except Exception as exc:  # reported below, for the first failed record
                failures.append(_PrepareError(record.key, exc))

        async with trio.open_nursery() as nursery:
            for record, loadout_fields in zip(records, fields, strict=True):
                nursery.start_soon(prepare, record, loadout_fields)
        if failures:
            order = [record.key for record in records]
            first = min(failures, key=lambda failure: order.index(failure.key))
            raise first from first.cause
        return [
            ChildRun(
                host=sup,
                record=record,
                token=prepared[record.key].token,
                card=prepared[record.key].card,
                loadout=prepared[record.key].loadout,
                log=prepared[record.key].log,
                budgets=sup.budgets,
                declared=tuple(loadout_fields.get("ownership", ())),
                terms=sup.remote.terms_for(record.key, prepared[record.key].card.lease_s)
                if record.surface in REMOTE_SURFACES
                else None,
            )
            for record, loadout_fields in zip(records, fields, strict=True)
        ]

    def prepare_one(self, record: ChildRecord, fields: dict[str, Any]) -> "_Prepared":
        """One child's scratch directory, loadout and log (blocking: runs in a thread)."""
        fields = dict(fields)
        sup = self.sup
        paths = sup.config.paths
        scratch = paths.scratch / record.key
        ipc.ensure_private_dir(scratch)
        if record.mode == "worktree":
            record.workspace = str(sup.worktrees.path_for(record.key))
        token = ipc.derive_token(sup.session_key, record.key)
        sup.secrets.add(token)  # before it is written anywhere: every log redacts it from now
        loadout = ipc.Loadout(
            session=sup.config.session,
            owner=record.key,
            name=record.name,
            agent=record.agent,
            token=token,
            # An inheriting child has no socket to find: its connection is a descriptor; a
            # remote child's is the TLS door's address (in *fields*).
            socket=fields.pop("socket", "" if inherits(record.surface) else str(paths.ipc_socket)),
            workspace=fields.pop("workspace", record.workspace),
            depth=record.depth,
            paper=str(paths.paper),
            scratch=str(scratch),
            state_dir=str(sup.config.home),
            surface=record.surface,
            request_timeout=sup.config.request_timeout,
            **fields,
        )
        loadout_path = ""
        if not inherits(record.surface):
            loadout_path = str(paths.loadouts / f"{record.key}.json")
            ipc.write_loadout(Path(loadout_path), loadout)
        log = RunLog(
            paths.logs / f"{record.key}.log",
            secrets=sup.secrets,
            record_output=sup.config.record_output,
            transport=sup.launchers[record.surface].name,
        )
        return _Prepared(token=token, card=loadout, loadout=loadout_path, log=log)

    def launcher_for(self, surface: str) -> Launcher:
        """The launcher for a validated *surface*, created on first use and then shared."""
        sup = self.sup
        launcher = sup.launchers.get(surface)
        if launcher is None:
            # Kept windows let a person read why a child failed; off by default.
            keep = os.environ.get("FLEET_KEEP_FAILED_PANES", "").lower() in {"1", "true", "yes"}
            if surface == "tmux":
                launcher = TmuxLauncher.private(
                    sup.config.paths.root, sup.config.session, base_env=os.environ, keep_failed=keep
                )
            elif surface == "tmux:current":
                launcher = TmuxLauncher.current(os.environ, keep_failed=keep)
            elif surface == "cmux":
                launcher = CmuxLauncher.from_environment(os.environ, keep_failed=keep)
            elif surface == "ray":
                launcher = RayLauncher(
                    address=sup.config.ray_address or None,
                    certify=sup.remote.certify,
                    session=sup.config.session,
                    python=sup.config.python,
                )
            else:
                launcher = ProcessLauncher(forks=sup.fork_server, boxed=sup.boxed_fork_server)
            sup.launchers[surface] = launcher
        return launcher

    async def launch(self, run: ChildRun, nursery: trio.Nursery) -> Launched:
        """Start *run*'s process through the session's launcher, sandboxed by its policy."""
        sup = self.sup
        loadout = run.card if run.card is not None else ipc.Loadout.from_file(run.loadout)
        launcher = self.launcher_for(run.record.surface)
        proxy = await self._open_egress(run, loadout, nursery)
        pair: tuple[socket.socket, socket.socket] | None = None
        sealed = -1
        if inherits(run.record.surface):
            pair = inherited_pair()
            sealed = ipc.sealed_loadout(loadout)
            argv = inherited_child_argv(sup.config.python, pair[1].fileno(), sealed)
        else:
            argv = child_argv(sup.config.python, run.loadout)
        try:
            placement = place(
                argv,
                config=sup.config,
                loadout=loadout,
                scratch=Path(loadout.scratch),
                egress=None if proxy is None else proxy.path,
                loadout_file=Path(run.loadout) if run.loadout else None,
            )
            run.record.sandboxed = placement.sandboxed
            run.record.unsandboxed_reason = placement.reason
            if not placement.sandboxed:
                run.log.write(f"running unsandboxed: {placement.reason}")
            spec = LaunchSpec(
                key=run.key,
                name=run.record.name,
                argv=placement.argv,
                cwd=loadout.workspace,
                env={
                    **child_environment(os.environ),
                    **placement.env,
                    # Unique to this run: the kill ladder finds every process that inherited it.
                    MARKER_ENV: run_marker(sup.config.session, run.key),
                },
                inherit=None if pair is None else (pair[1].fileno(), sealed),
                # Unwrapped, the command is the plain child: a fork of the preloaded server will do.
                plain=not placement.sandboxed,
                view=placement.view,
                tls=loadout.tls,
                ship=await self._shipment(run, loadout),
            )
            launched = await launcher.launch(spec, run.log.output, nursery)
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
        if proxy is not None:
            proxy.admit(launched.pid)
        if pair is not None:
            sup.nursery.start_soon(self._serve_inherited, run, pair[0])
        return launched

    async def _shipment(self, run: ChildRun, loadout: ipc.Loadout) -> Shipment | None:
        """A child on another node gets the workspace as a bundle: a worktree child its
        snapshot, bringing its changes back as one; a reader the workspace as it is, read-only
        (:mod:`orchestrator.workspace._bundle`)."""
        if run.record.surface not in REMOTE_SURFACES:
            return None
        if run.record.mode == "worktree":
            bundle = await self.sup.worktrees.bundle(run.key)
            return Shipment(bundle=bundle, work_tree=loadout.workspace, back=True)
        # A reading child gets a read-only checkout of the workspace as it is now.
        shipped = await trio.to_thread.run_sync(ship_workspace, Path(run.record.workspace))
        return Shipment(bundle=shipped.bundle, work_tree=loadout.workspace, read_only=True)

    async def _open_egress(
        self, run: ChildRun, loadout: ipc.Loadout, nursery: trio.Nursery
    ) -> EgressProxy | None:
        """Start *run*'s egress proxy in its own nursery (so it ends with the run).

        None when the child has no allowlist or will not be sandboxed (it then has the host's
        network, and a relay would have nothing to do)."""
        sup = self.sup
        if not loadout.egress or sup.config.sandbox == "off" or loadout.sandbox == "none":
            return None
        directory = sup.config.paths.root / "egress"
        ipc.ensure_private_dir(directory)

        def refused(target: str, reason: str) -> None:
            run.log.write(f"egress refused {target!r}: {reason}")
            sup.reject("egress", run.key, {"target": target, "reason": reason})

        proxy = EgressProxy(
            path=directory / f"{run.key}.sock",
            allowed=allowlist(loadout.egress),
            on_refused=refused,
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


def task_prompt(record: ChildRecord) -> str:
    """The first prompt: the task, and for a checked child the one line asking for its result."""
    if record.schema is None:
        return record.task
    return f"{record.task}\n\n{instruction(record.schema)}"


def child_environment(parent: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The child's environment: the parent's minus proxies and fleet session variables."""
    dropped = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "fleet_session"}
    env = {k: v for k, v in parent.items() if k.lower() not in dropped}
    env["FLEET_CHILD"] = "1"
    return env
