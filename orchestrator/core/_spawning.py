"""Spawning: a batch planned, reserved, prepared and launched (one child's launch is
:mod:`orchestrator.core._launching`).

A batch is all-or-nothing up to its launch: every request is planned and checked (definition,
mode, sandbox availability, surface, names) and the capacity for all of it is reserved before
anything is written; then every child's scratch directory, loadout and log are written
concurrently in worker threads (a loadout's two fsyncs would otherwise stall every running
child's I/O, one child after another), and a failure there refuses the whole batch with nothing
started. The batch then launches together.

A ``process`` child's loadout is never a file: it inherits a sealed memfd holding it and its
end of a socket pair that is its connection, and the hello on our end may name only that child
(:mod:`orchestrator.core._admission`). Only a pane's child (tmux, cmux), which the terminal
starts and so cannot inherit from us, gets a 0600 loadout file and connects to the listener.
"""

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

import ipc
from orchestrator._errors import FleetError, OperationFailed, UsageError
from orchestrator._records import ChildRecord, SpawnRequest
from orchestrator._runtime import fenced_paths
from orchestrator.core._launching import inherits
from orchestrator.core._plan import plan_spawn, resume_id
from orchestrator.core._remote import REMOTE_SURFACES, node_directory, node_layout
from orchestrator.core._run import ChildRun
from orchestrator.governance._checked import instruction
from orchestrator.governance._diagnostics import RunLog
from orchestrator.launch._sandboxing import check_available
from orchestrator.spend._roles import load_roles

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


class _PrepareError(Exception):
    """One record of a batch could not be prepared; *cause* says why."""

    def __init__(self, key: str, cause: Exception) -> None:
        super().__init__(f"{key}: {cause}")
        self.key = key
        self.cause = cause


@attrs.define(eq=False)
class Spawning:
    """The supervisor's spawning: batches and their files (launches: :mod:`._launching`)."""

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
            sup.spend.check_spawn(len(plans), None if parent is None else parent.key)
            for plan in plans:
                check_available(sup.config, plan.agent, remote=plan.surface in REMOTE_SURFACES)
                sup.launcher_for(plan.surface)  # refuses tmux:current outside tmux, up front
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
                record.key, node_directory(sup.config.session, record.key), loadout_fields
            )
            if record.surface in REMOTE_SURFACES
            else loadout_fields
            for record, loadout_fields in zip(records, fields, strict=True)
        ]

        # The same for the whole batch: a registry of many homes costs ms a look.
        fenced = await trio.to_thread.run_sync(_fenced)

        async def prepare(record: ChildRecord, loadout_fields: dict[str, Any]) -> None:
            try:
                prepared[record.key] = await trio.to_thread.run_sync(
                    self.prepare_one, record, loadout_fields, fenced
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

    def prepare_one(
        self,
        record: ChildRecord,
        fields: dict[str, Any],
        fenced: Sequence[str] | None = None,
    ) -> "_Prepared":
        """One child's scratch directory, loadout and log (blocking: runs in a thread).
        *fenced*: every other fleet's paths as a batch found them (``None``: look now)."""
        fields = dict(fields)
        sup = self.sup
        paths = sup.config.paths
        # A remote child's scratch is in its node directory, made on its node, not here.
        scratch = Path(fields.pop("scratch", "") or paths.scratch / record.key)
        remote = record.surface in REMOTE_SURFACES
        if not remote:
            ipc.ensure_private_dir(scratch)
        if record.mode == "worktree":
            record.workspace = str(sup.worktrees.path_for(record.key))
        # Fresh for every launch: a child woken from hibernation or revived gets a new token,
        # and whatever held its old one (a leaked loadout, a log) is refused at hello.
        token = ipc.derive_token(sup.session_key, record.key, ipc.new_launch())
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
            fenced=list(_fenced() if fenced is None else fenced),
            surface=record.surface,
            request_timeout=sup.config.request_timeout,
            **fields,
        )
        loadout_path = ""
        if remote:
            # Its actor writes it on the node (from the card) when it makes the node directory.
            loadout_path = str(node_layout(scratch.parent).loadout)
        elif not inherits(record.surface):
            loadout_path = str(paths.loadouts / f"{record.key}.json")
            ipc.write_loadout(Path(loadout_path), loadout)
        log = RunLog(
            paths.logs / f"{record.key}.log",
            secrets=sup.secrets,
            record_output=sup.config.record_output,
            transport=sup.launchers[record.surface].name,
        )
        return _Prepared(token=token, card=loadout, loadout=loadout_path, log=log)


def task_prompt(record: ChildRecord) -> str:
    """The first prompt: the task, and for a checked child the one line asking for its result."""
    if record.schema is None:
        return record.task
    return f"{record.task}\n\n{instruction(record.schema)}"


def _fenced() -> tuple[str, ...]:
    return tuple(str(path) for path in fenced_paths())
