"""The supervisor: the composition root that wires the parts and exposes the fleet API.

It holds no low-level logic of its own: the registry, capacity and lane, policy, ownership,
watchdogs, diagnostics, launchers, worktrees and the paper each live in their own module. Its
read side (``peek``, ``wait``, the notification stream, a child's log, the moderator brief,
``holds_nothing``) reads those parts; its commands delegate to them. Use it embedded::

    async with open_supervisor(config) as sup:
        [a1] = await sup.spawn([SpawnRequest(task="find the config loader")])
        notes = await sup.wait([a1.key])
"""

import contextlib
import fcntl
import functools
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

import ipc
from orchestrator._config import Config
from orchestrator._errors import (
    NotFound,
    PolicyError,
    Refused,
    TimedOut,
    UsageError,
)
from orchestrator._records import ChildRecord, SpawnRequest
from orchestrator._runtime import ensure_session_runtime, register_home, remove_session_runtime
from orchestrator._trees import remove_tree
from orchestrator.batch import IntegrationQueue, Map, Maps, MapSpec
from orchestrator.coordination._brief import Facts, paper_line, render, voting_line
from orchestrator.coordination._democracy import Democracy
from orchestrator.coordination._paper import PARENT, Paper
from orchestrator.core._admission import ListenerDoor, Refusals, unlink_quietly
from orchestrator.core._capacity import Capacity, Lane
from orchestrator.core._hibernation import Hibernation
from orchestrator.core._isolation import Worktrees, apply_settlement
from orchestrator.core._journaling import Journal, NoJournal
from orchestrator.core._kept import Kept
from orchestrator.core._launching import Launching, child_environment
from orchestrator.core._notes import Notes
from orchestrator.core._registry import Registry
from orchestrator.core._remote import Remote
from orchestrator.core._run import ChildRun, Question
from orchestrator.core._services import Services
from orchestrator.core._spawning import Spawning
from orchestrator.definitions import AgentDefinition, expand_agent_dirs, load_agents
from orchestrator.governance._diagnostics import RejectKind, RejectLog
from orchestrator.governance._ownership import LockTable
from orchestrator.governance._policy import check_mode
from orchestrator.governance._redaction import SecretSet
from orchestrator.governance._watchdog import BudgetPolicy, resolve_policy
from orchestrator.launch._forkserver import ForkServer
from orchestrator.launch._launcher import Launched, Launcher, child_argv
from orchestrator.launch._sandboxing import fork_server_wrapper
from orchestrator.notify import Notifier
from orchestrator.spend._budgets import Budgets
from orchestrator.spend._keyless import keyless
from orchestrator.spend._limits import parse_policy
from orchestrator.spend._pacing import parse_pacing
from orchestrator.workspace._quarantine import HoldRules
from orchestrator.workspace._review import ReviewStore

__all__ = ["PARENT", "SpawnRequest", "Supervisor", "open_supervisor"]


@attrs.define(eq=False)
class Supervisor:
    """The fleet API. Create it with :func:`open_supervisor`."""

    config: Config
    session_key: bytes
    nursery: trio.Nursery
    budgets: BudgetPolicy
    registry: Registry = attrs.Factory(Registry)
    runs: dict[str, ChildRun] = attrs.Factory(dict)
    notes: Notes = attrs.Factory(Notes)
    questions: dict[str, Question] = attrs.Factory(dict)
    mode: str = "build"
    warnings: list[str] = attrs.Factory(list)
    capacity: Capacity = attrs.field(init=False)
    lane: Lane = attrs.field(init=False)
    rejects: RejectLog | None = None
    #: Every secret held (session key, control token, every child token ever issued); each
    #: run log, the reject log and every control reply redact them.
    secrets: SecretSet = attrs.Factory(SecretSet)
    #: Children a previous supervisor of the session left when it ended (see ``_daemon``).
    stale: list[dict[str, Any]] = attrs.Factory(list)
    launchers: dict[str, Launcher] = attrs.Factory(dict)
    #: Claude Code / Pi agent directories (``Config.agent_dirs``, changed by ``configure``).
    agent_dirs: tuple[str, ...] = ()
    #: Forks unsandboxed ``process`` children from preloaded imports (``None``: turned off).
    fork_server: ForkServer | None = None
    #: Forks sandboxed ``process`` children inside its own sandbox (``None``: they start under
    #: bwrap one by one).
    boxed_fork_server: ForkServer | None = None
    _agents: dict[str, AgentDefinition] | None = None
    #: The session journal (``fleet serve`` wires the real one in).
    journal: Journal = attrs.Factory(NoJournal)
    paper: Paper = attrs.field(init=False)
    review: ReviewStore = attrs.field(init=False)
    worktrees: Worktrees = attrs.field(init=False)
    democracy: Democracy = attrs.field(init=False)
    services: Services = attrs.field(init=False)
    spawning: Spawning = attrs.field(init=False)
    launching: Launching = attrs.field(init=False)
    #: Hellos refused, by reason (an impostor's, a child that died mid-hello, ...).
    refusals: Refusals = attrs.field(init=False)
    door: ListenerDoor = attrs.field(init=False)
    #: The session CA and TLS door for children on other nodes (made on first use).
    remote: Remote = attrs.field(init=False)
    #: Events for people (``subagents.notify``): fed every settle note the parent gets.
    notifier: Notifier = attrs.field(init=False)
    #: Usage budgets and the ledger (``subagents.budget``, ``subagents.prices``).
    spend: Budgets = attrs.field(init=False)
    #: Idle children stopped without finalizing (``subagents.hibernate_after_s``).
    hibernation: Hibernation = attrs.field(init=False)
    #: ``fleet map`` runs (one fresh child per row; docs/map.md).
    maps: Maps = attrs.field(init=False)
    #: Held worker changes landed one at a time behind a test gate (``fleet land``).
    queue: IntegrationQueue = attrs.field(init=False)
    #: Each ended child's full report and transcript, until it is discarded.
    kept: Kept = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.capacity = Capacity(
            cap=self.config.max_subagents, max_retained=self.config.max_retained
        )
        self.hibernation = Hibernation(sup=self, after_s=self.config.hibernate_after_s)
        self.hibernation.start(self.nursery)
        self.lane = Lane(capacity=self.config.lane)
        self.kept = Kept(self.config.paths.root / "kept")
        self.paper = Paper(self.config.paths.paper)
        self.review = ReviewStore(self.config.paths.review)
        self.worktrees = Worktrees(
            root=self.config.paths.worktrees,
            repo=self.config.workspace,
            review=self.review,
            rules=HoldRules(extra=self.config.copyback_hold),
        )
        self.democracy = Democracy(fleet=self)
        self.maps = Maps.open(self, self.config.paths.root / "maps")
        self.queue = IntegrationQueue(
            worktrees=self.worktrees,
            gate=self.config.integration_gate,
            gate_timeout=self.config.integration_timeout,
            root=self.config.paths.root,
            hidden=(self.config.home,),
            allow_unsandboxed=self.config.allow_unsandboxed,
        )
        self.queue.restore()
        self.services = Services(
            fleet=self,
            config=self.config,
            locks=LockTable(),
            paper=self.paper,
            questions=self.questions,
            rejects=self.rejects,
        )
        self.spawning = Spawning(sup=self)
        self.launching = Launching(sup=self)
        self.refusals = Refusals(log=lambda owner, args: self.reject("hello-refused", owner, args))
        self.door = ListenerDoor(runs=self.runs, config=self.config, refusals=self.refusals)
        self.remote = Remote(
            session=self.config.session,
            runs=self.runs,
            token_for=self.door.token_for,
            refuse=self.refusals.refuse,
            nursery=self.nursery,
            host=self.config.ray_listen,
            lease_s=self.config.lease_s,
            hello_timeout=self.config.hello_timeout,
            request_timeout=self.config.request_timeout,
        )
        self.agent_dirs = self.config.agent_dirs
        self.notifier = Notifier(
            self.config.notify,
            self.config.session,
            scrub=self.secrets.scrub,
            is_open=self.questions.__contains__,
        )
        self.notifier.start(self.nursery)
        self.spend = Budgets(
            policy=parse_policy(self.config.budget, self.config.prices),
            pacing=parse_pacing(self.config.pacing),
            nursery=self.nursery,
            notes=self.notes,
            notifier=self.notifier,
            session=self.config.session,
            scrub=self.secrets.scrub,
            runs=self.runs,
        )
        if self.config.fork_server:
            self.fork_server = ForkServer(
                python=child_argv(self.config.python, "")[0],
                label=str(self.config.paths.root),
                env=child_environment(os.environ),
                nursery=self.nursery,
                log_path=self.config.paths.root / "fork-server.log",
            )
            wrapper = fork_server_wrapper(self.config)
            if wrapper is not None:
                self.boxed_fork_server = attrs.evolve(
                    self.fork_server,
                    wrapper=wrapper,
                    # Its forks are sandboxed children: its memory holds no credential of ours.
                    env=keyless(self.fork_server.env),
                    log_path=self.config.paths.root / "fork-server-sandboxed.log",
                )

    @property
    def locks(self) -> LockTable:
        """The ownership lock table: one, held by the services that take locks for runs."""
        return self.services.locks

    @locks.setter
    def locks(self, table: LockTable) -> None:
        self.services.locks = table

    @property
    def paths(self) -> Any:
        return self.config.paths

    # -- what it shows: peek, wait, the notification stream, a child's log, the brief ------

    def all_records(self) -> dict[str, ChildRecord]:
        merged = dict(self.registry.retired)
        merged.update(self.registry.records)
        return merged

    def peek(self, refs: Sequence[str] = ()) -> dict[str, Any]:
        records = [self.registry.find(ref) for ref in refs] if refs else list(self.registry.live())
        return {
            # Oldest first, and first: a child blocked on its parent is what needs it most.
            "questions": [
                {"id": q.id, "key": q.key, "text": q.text} for q in self.questions.values()
            ],
            "session": self.config.session,
            "mode": self.mode,
            "cap": self.capacity.cap,
            "lane": self.lane.statistics(),
            "agents": [r.peek() for r in records],
            "locks": {k: list(v) for k, v in self.locks.snapshot().items()},
            "stale": self.stale,
            "notify": self.notifier.counts(),
            "usage": self.spend.report()["session"],
        }

    async def wait(
        self,
        refs: Sequence[str] = (),
        *,
        every: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - fleet wait --timeout
    ) -> list[dict[str, Any]]:
        keys = [self.registry.find(ref).key for ref in refs]
        result = await self.notes.wait(
            self.all_records(),
            keys,
            every=every,
            timeout=float("inf") if timeout is None else timeout,
        )
        if result is None:
            raise TimedOut(f"wait: nothing settled within {timeout:g} s")
        return result

    async def notifications(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Coalesced settle notifications, forever."""
        async for batch in self.notes.stream(self.all_records()):
            yield batch

    def logs(self, ref: str, tail: int = 8192) -> dict[str, Any]:
        record = self.registry.find(ref)
        path = self.paths.logs / f"{record.key}.log"
        run = self.runs.get(record.key)
        text = run.log.tail if run is not None else ""
        if not text:
            with contextlib.suppress(OSError):
                text = path.read_text(encoding="utf-8", errors="replace")
        return {"key": record.key, "path": str(path), "tail": text[-tail:]}

    async def brief(self) -> str:
        """The moderator brief for this fleet now (``fleet brief``)."""
        lane = self.lane.statistics()
        facts = Facts(
            mode=self.mode,
            used=self.capacity.used,
            cap=self.capacity.cap,
            working=lane["working"],
            lane=lane["capacity"],
            queued=lane["queued"],
            workspace=str(self.config.workspace),
            children=tuple(self.registry.live()),
            questions=tuple((q.id, q.key, q.text) for q in self.questions.values()),
            unread=tuple(dict.fromkeys(note["key"] for note in self.notes.pending)),
            unresolved=tuple(
                r for r in self.registry.retired.values() if r.conflicts or r.remaining
            ),
            paper=await paper_line(self.paper),
            voting=voting_line(self.democracy.current),
        )
        return render(facts)

    def holds_nothing(self) -> bool:
        """Whether nothing would be lost if this supervisor ended now: no live or retained
        child, no unread note, no open question, no unresolved worktree, no vote."""
        return not (
            self.registry.records
            or self.runs
            or self.notes.pending
            or self.questions
            or self.worktrees.unresolved()
            or self.democracy.current is not None
            or self.maps.running()
        )

    # -- agents -------------------------------------------------------------------------

    def agents(self, scope: str | None = None) -> dict[str, AgentDefinition]:
        """Agent definitions for *scope* (the session's scope, cached, by default)."""
        workspace = self.config.workspace
        extra = expand_agent_dirs(self.agent_dirs, workspace=workspace)
        if scope is not None and scope != self.config.agents_scope:
            return load_agents(scope, cwd=workspace, extra_dirs=extra)
        if self._agents is None:
            self._agents = load_agents(self.config.agents_scope, cwd=workspace, extra_dirs=extra)
        return self._agents

    def set_agent_dirs(self, entries: Sequence[str]) -> None:
        """Read these Claude Code / Pi agent directories from now on (``--agent-dirs``)."""
        self.agent_dirs = tuple(entries)
        self._agents = None

    # -- spawning -----------------------------------------------------------------------

    async def spawn(
        self, requests: Sequence[SpawnRequest], *, parent: ChildRun | None = None
    ) -> list[ChildRecord]:
        """Launch a batch: validated and reserved all-or-nothing before any launch."""
        try:
            self.spend.check_turn("spawn")
            return await self.spawning.spawn(requests, parent=parent)
        except PolicyError as exc:
            agents = [request.agent for request in requests]
            owner = PARENT if parent is None else parent.key
            self.reject("policy", owner, {"agents": agents, "mode": self.mode, "error": str(exc)})
            raise

    def launcher_for(self, surface: str) -> Launcher:
        """The launcher for a validated *surface*, created on first use and then shared."""
        return self.launching.launcher_for(surface)

    async def launch(self, run: ChildRun, nursery: trio.Nursery) -> Launched:
        """Start *run*'s process through the session's launcher, sandboxed by its policy."""
        return await self.launching.launch(run, nursery)

    async def map(self, spec: MapSpec, rows: Sequence[Mapping[str, Any]]) -> Map:
        """Run *spec* over *rows* to the end (one fresh child per row, at most the lane's width
        at once); the returned map's ``status()`` has the counts, its ledger every outcome."""
        running = await self.maps.start(spec, rows)
        try:
            await running.finished.wait()
        finally:
            if not running.finished.is_set():
                with trio.CancelScope(shield=True):
                    await self.maps.cancel(running.id)
        return running

    # -- driving children ---------------------------------------------------------------

    def run_for(self, ref: str) -> ChildRun:
        record = self.registry.find(ref, include_retired=False)
        run = self.runs.get(record.key)
        if run is None:
            raise UsageError(f"{record.key} is {record.state}; fleet resume or fleet ask wakes it")
        return run

    async def prompt(self, ref: str, text: str) -> ChildRecord:
        """Resume: a new prompt to the same child (its context is kept; a hibernated one
        wakes for it)."""
        record = self.registry.find(ref, include_retired=False)
        self.spend.check_turn(f"prompt {record.key}", record.key)
        if self.hibernation.asleep(record.key):
            self.hibernation.prompt(record, text)
        else:
            self.run_for(record.key).queue_prompt(text)
        self.journal.changed(record)
        self.notes.changed()
        return record

    async def steer(self, ref: str, text: str) -> ChildRecord:
        record = self.registry.find(ref, include_retired=False)
        if self.hibernation.asleep(record.key):
            self.hibernation.steer(record, text)
            return record
        run = self.run_for(ref)
        await run.steer(text)
        return run.record

    async def pause(self, ref: str) -> tuple[ChildRecord, bool]:
        run = self.run_for(ref)
        settled = await run.pause()
        self.journal.changed(run.record)
        self.notes.changed()
        return run.record, settled

    async def ask(self, ref: str, text: str) -> str:
        key = self.registry.find(ref, include_retired=False).key
        self.spend.check_turn(f"ask {key}", key)
        async with self.hibernation.awake(ref) as run:  # a hibernated child wakes first
            return await run.ask(text)

    def answer(self, ref: str, text: str) -> Question:
        """Answer a question by id (``q3``) or the single open question of a child."""
        question = self.services.answer(ref, text, self.registry.find)
        self.journal.answered(question.key, question.id, text)
        return question

    async def stop(self, refs: Sequence[str], *, hold: bool = False) -> list[dict[str, Any]]:
        """Stop each child (final) and return its handoff; with *hold*, a worker's change is
        kept for review (``fleet apply``) instead of copied back."""
        records = [self.registry.find(ref) for ref in refs]
        handoffs = [record.handoff() for record in records]
        if hold:
            self.worktrees.holding.update(r.key for r in records if r.mode == "worktree")

        async def stop_one(index: int, run: ChildRun) -> None:
            handoffs[index] = await run.stop()
            if run.key in self.hibernation.sleeping:  # it was going to sleep: finalize it
                handoffs[index] = await self.hibernation.finish(run.key)

        async def finish_one(index: int, key: str) -> None:
            handoffs[index] = await self.hibernation.finish(key)

        async def resolve_one(index: int, record: ChildRecord) -> None:
            # A retired worker whose worktree is unresolved: try the copy-back again.
            apply_settlement(record, await self.worktrees.settle(record.key, copy_back=True))
            handoffs[index] = record.handoff()

        async with trio.open_nursery() as nursery:
            for index, record in enumerate(records):
                run = self.runs.get(record.key)
                if run is not None:
                    nursery.start_soon(stop_one, index, run)
                elif record.key in self.hibernation.sleeping:
                    nursery.start_soon(finish_one, index, record.key)
                elif record.key in self.worktrees.snapshots:
                    nursery.start_soon(resolve_one, index, record)
        return handoffs

    def run_done(self, key: str) -> trio.Event | None:
        """The event set when *key*'s run has finished, or ``None`` if it has no run."""
        run = self.runs.get(key)
        return self.hibernation.ended(key) if run is None else run.done

    async def stop_all(self, *, hold: bool = False) -> list[dict[str, Any]]:
        return await self.stop([r.key for r in self.registry.live()], hold=hold)

    async def discard(self, ref: str) -> str:
        """Forget a child: stop it if live and drop its record and unresolved state."""
        record = self.registry.find(ref)
        run = self.runs.get(record.key)
        if run is not None:
            await run.stop()
        if record.key in self.hibernation.sleeping:
            await self.hibernation.finish(record.key)
        await self.worktrees.discard(record.key)
        await trio.to_thread.run_sync(self.kept.forget, record.key)
        self.registry.retired.pop(record.key, None)
        self.runs.pop(record.key, None)
        return record.key

    def set_mode(self, mode: str | None) -> str:
        if mode is not None:
            self.mode = check_mode(mode)
        return self.mode

    # -- services for runs ----------------------------------------------------------------

    def notify(
        self,
        record: ChildRecord,
        *,
        report: str = "",
        error: str = "",
        question: Question | None = None,
        failure: bool = False,
    ) -> None:
        if question is not None:
            self.journal.asked(record.key, question.id, question.text)
        elif not failure:
            self.journal.settled(record, report=report, error=error)
        # A map row's settle note is the row's outcome: it goes to the map's out file.
        if question is None and self.maps.collect(
            record, report=report, error=error, failure=failure
        ):
            return
        # A voter's settle note is its ballot: the round takes it, so the parent sees no ballot
        # before the tally. Questions still reach the parent.
        if question is None and self.democracy.collect(
            record, report=report, error=error, failure=failure
        ):
            self.notes.changed()
            return
        # A nested child's result or failure belongs to the child that spawned it: the parent
        # agent sees only that child's report. Its questions still reach the parent.
        if question is None and record.parent is not None:
            self.services.nested_settled(record.key)
            self.notes.changed()
            return
        asked = None if question is None else (question.id, question.text)
        self.notes.push(record, report=report, error=error, question=asked, failure=failure)
        self.notifier.note(record, report=report, error=error, question=asked, failure=failure)

    def reject(self, kind: RejectKind, owner: str, args: Mapping[str, Any]) -> None:
        self.services.reject(kind, owner, args)

    def new_question(self, key: str, text: str) -> Question:
        return self.services.new_question(key, text)

    def drop_question(self, qid: str) -> None:
        self.services.drop_question(qid)

    def cancel_questions(self, key: str) -> None:
        self.services.cancel_questions(key)

    def take_ownership(self, run: ChildRun, paths: Sequence[str]) -> ipc.Message:
        return self.services.take_ownership(run, paths)

    async def discuss_for(self, run: ChildRun, body: ipc.Discuss) -> ipc.Message:
        return await self.services.discuss_for(run, body)

    async def nested_spawn(self, run: ChildRun, body: ipc.Spawn) -> ipc.Message:
        return await self.services.nested_spawn(run, body)

    async def release(self, run: ChildRun) -> None:
        """Give back everything a finished run held (called once, by the run)."""
        unlink_quietly(run.loadout)  # a pane's child that never connected leaves its file
        self.journal.handed_off(run.record)
        self.hibernation.forget(run.key)
        if run.record.report:
            await trio.to_thread.run_sync(self.kept.keep_report, run.key, run.record.report)
        self.locks.release(run.key)
        self.remote.release(run.key)
        self.capacity.release()
        self.registry.retire(run.key, pinned=self.worktrees.unresolved())
        self.runs.pop(run.key, None)
        self.notes.changed()

    async def drop_scratch(self, key: str) -> None:
        """Delete child *key*'s scratch once nothing can run it again (stopped, failed, a
        hibernated or lost child finalized or discarded): its backend's session store goes, a
        bounded copy of its transcript is kept first (``fleet report --transcript``)."""
        scratch = self.config.paths.scratch / key
        await trio.to_thread.run_sync(self.kept.keep_transcript, key, scratch)
        await trio.to_thread.run_sync(remove_tree, scratch)

    async def report(self, ref: str, part: str = "report", offset: int = 0) -> dict[str, Any]:
        """One page of a child's full report or transcript (``fleet report``); the files are
        read in a thread (a transcript may be megabytes)."""
        try:
            record = self.registry.find(ref)
        except NotFound:
            if not (ref.startswith("a") and ref[1:].isdigit()):
                raise
            key, live, scratch = ref, None, None
        else:
            key = record.key
            live = record.report if part == "report" and record.report else None
            running = key in self.runs
            scratch = self.config.paths.scratch / key if running else None
        page = functools.partial(self.kept.page, key, part, offset, live=live, scratch=scratch)
        return await trio.to_thread.run_sync(page)

    # -- connections ----------------------------------------------------------------------

    def refuse_hello(self, reason: str, owner: str, **evidence: Any) -> None:
        """Count (and reject-log) a refused hello; the peer is never told why."""
        self.refusals.refuse(reason, owner, **evidence)


@contextlib.contextmanager
def session_lock(path: Path) -> Iterator[None]:
    """Hold the session's supervisor lock (``supervisor.lock``, our pid in it) or refuse in one
    line naming the holder: two supervisors of one session would bind the same sockets."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise Refused(
                f"session {path.parent.name} already has a supervisor (pid {holder}): attach "
                "to it with orchestrator.connect(), or end it with fleet serve --stop"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def open_supervisor(config: Config, *, locked: bool = False) -> AsyncIterator[Supervisor]:
    """Run a supervisor for *config*; on exit every child is stopped and reaped.

    It holds the session lock for its life (``locked``: the caller, ``fleet serve``, already
    does): a second supervisor of the same session is refused in one line."""
    ipc.ensure_private_dir(config.home)
    ipc.ensure_private_dir(config.home / "sessions")
    ipc.ensure_private_dir(config.paths.root)
    # Sockets and secrets go to the per-user runtime root; the home joins the registry every
    # sandbox of every fleet of this user hides (orchestrator._runtime).
    ensure_session_runtime(config.paths.runtime)
    register_home(config.home)
    with contextlib.ExitStack() as stack:
        if not locked:
            stack.enter_context(session_lock(config.paths.lock))
        async with _open_supervisor(config) as sup:
            yield sup


@contextlib.asynccontextmanager
async def _open_supervisor(config: Config) -> AsyncIterator[Supervisor]:
    budgets, warning = resolve_policy(config.idle_timeout_ms, config.max_total_ms)
    parse_policy(config.budget, config.prices)  # a bad one is one line before anything starts
    parse_pacing(config.pacing)
    listener = ipc.Listener(config.paths.ipc_socket)
    session_key = ipc.new_session_key()
    secrets = SecretSet([session_key])
    rejects = None
    if config.reject_log:
        rejects = RejectLog(config.paths.logs / "rejected.jsonl", secrets=secrets)
    async with trio.open_nursery() as nursery:
        sup = Supervisor(
            config=config,
            session_key=session_key,
            nursery=nursery,
            budgets=budgets,
            rejects=rejects,
            secrets=secrets,
        )
        if warning:
            sup.warnings.append(warning)
        await nursery.start(listener.serve, sup.door.handle_connection)
        if sup.fork_server is not None and config.sandbox == "off":
            # Every process child will be a fork: have the server ready before the first.
            sup.fork_server.start()
        if sup.boxed_fork_server is not None:
            sup.boxed_fork_server.start()  # the same, for every sandboxed child
        try:
            yield sup
        finally:
            with trio.CancelScope(shield=True):
                await sup.stop_all()
                await listener.aclose()
                for forks in (sup.fork_server, sup.boxed_fork_server):
                    if forks is not None:
                        await forks.aclose()
                remove_session_runtime(config.paths.runtime)  # a daemon's token keeps it
            nursery.cancel_scope.cancel()
