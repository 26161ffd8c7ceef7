"""What the supervisor offers a running child: questions, ownership, the paper, nested spawns.

:class:`Services` is owned by the supervisor, which keeps
thin delegating methods for the runs that call these; the state only these services touch
(question numbering, nested children's settle events) lives here.
"""

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

import ipc
from orchestrator._config import Config
from orchestrator._errors import FleetError, NotFound, PolicyError, UsageError
from orchestrator._records import ChildRecord, SpawnRequest, State
from orchestrator._sync import wait_first
from orchestrator.coordination._paper import Paper, PaperError
from orchestrator.core._remote import REMOTE_SURFACES
from orchestrator.core._run import ChildRun, Question
from orchestrator.governance._diagnostics import RejectKind, RejectLog
from orchestrator.governance._ownership import LockConflict, LockTable
from orchestrator.governance._policy import validate_nested

if TYPE_CHECKING:
    from orchestrator.core._host import ServiceHost

__all__ = ["Services"]


@attrs.define(eq=False)
class Services:
    """The supervisor's services for running children."""

    fleet: "ServiceHost[ChildRun]"
    config: Config
    locks: LockTable
    paper: Paper
    questions: dict[str, Question]
    rejects: RejectLog | None = None
    _question_ids: int = 0
    _nested_settled: dict[str, trio.Event] = attrs.Factory(dict)

    def reject(self, kind: RejectKind, owner: str, args: Mapping[str, Any]) -> None:
        """Record a refused request in the opt-in reject log (config ``reject_log``)."""
        if self.rejects is not None:
            self.rejects.record(kind, owner, args)

    def nested_settled(self, key: str) -> None:
        """Wake the ``subagent`` call waiting on nested child *key*."""
        self._nested_settled.setdefault(key, trio.Event()).set()

    def new_question(self, key: str, text: str) -> Question:
        self._question_ids += 1
        question = Question(id=f"q{self._question_ids}", key=key, text=text)
        self.questions[question.id] = question
        return question

    def answer(self, ref: str, text: str, find: Callable[..., ChildRecord]) -> Question:
        """Answer a question by id (``q3``) or the single open question of a child (*find*
        looks a child up by key or name, as the registry does)."""
        question = self.questions.get(ref)
        if question is None:
            with contextlib.suppress(FleetError):
                key = find(ref, include_retired=False).key
                mine = [q for q in self.questions.values() if q.key == key]
                if len(mine) > 1:
                    raise UsageError(
                        f"answer: {ref} has {len(mine)} open questions (name one: "
                        f"{', '.join(q.id for q in mine)})"
                    )
                question = mine[0] if mine else None
        if question is None:
            raise NotFound(f"answer: no open question {ref!r} (see fleet peek)")
        question.answer = text
        question.answered.set()
        return question

    def drop_question(self, qid: str) -> None:
        self.questions.pop(qid, None)

    def cancel_questions(self, key: str) -> None:
        questions = self.questions
        for question in [q for q in questions.values() if q.key == key]:
            question.answered.set()
            questions.pop(question.id, None)

    def take_ownership(self, run: ChildRun, paths: Sequence[str]) -> ipc.Message:
        """A writer asks, before its first write to each path, to own it.

        A child whose definition declares ownership specs takes all of them at its first
        request (all or nothing) and may then write only what they cover; a child that declares
        none owns each concrete path it writes. Paths in a worktree map to the repository.
        """
        if run.record.mode != "worktree" and run.record.backend == "builtin":
            return ipc.Reply(ok=False, error="read-only children take no ownership")
        targets = [self._repo_path(run, path) for path in paths]
        try:
            if run.declared:
                if run.key not in self.locks.snapshot():
                    self.locks.acquire(run.key, run.declared, root=self.config.workspace)
                outside = [t for t in targets if not self.locks.holds(run.key, Path(t))]
                if outside:
                    specs = ", ".join(run.declared)
                    return ipc.Reply(
                        ok=False, error=f"{outside[0]} is outside {run.key}'s ownership ({specs})"
                    )
            else:
                self.locks.acquire(run.key, targets, root=self.config.workspace)
        except (LockConflict, ValueError) as exc:
            if isinstance(exc, LockConflict):
                args = {"paths": list(paths), "holder": exc.holder, "error": str(exc)}
                self.reject("lock-conflict", run.key, args)
            return ipc.Reply(ok=False, error=str(exc))
        return ipc.Reply(ok=True, data={"held": list(self.locks.snapshot().get(run.key, ()))})

    def _repo_path(self, run: ChildRun, path: str) -> str:
        """The repository path a child's *path* (in its workspace as the child sees it) stands
        for; *path* itself when it is outside that workspace."""
        try:
            if run.record.surface in REMOTE_SURFACES and run.card is not None:
                # Its workspace is its node's checkout, which does not exist here: mapped by
                # its lexical form (the node's own guard saw the file; copy-back checks again).
                seen = Path(os.path.normpath(run.card.workspace))
                return str(self.config.workspace / Path(os.path.normpath(path)).relative_to(seen))
            workspace = Path(run.record.workspace)
            return str(
                self.config.workspace / Path(path).resolve().relative_to(workspace.resolve())
            )
        except ValueError:
            return path

    async def discuss_for(self, run: ChildRun, body: ipc.Discuss) -> ipc.Message:
        """A child's ``discuss`` tool call on the session's paper."""
        try:
            if body.op == "ask":
                text = await self.paper.ask(run.key, body.text, to=body.to)
            elif body.op == "answer":
                text = await self.paper.answer(run.key, body.question or "", body.text)
            else:
                listed = await self.paper.list(run.key, since=body.since, question=body.question)
                text = listed.text
        except PaperError as exc:
            return ipc.Reply(ok=False, error=str(exc))
        return ipc.Reply(ok=True, data={"text": text})

    async def nested_spawn(self, run: ChildRun, body: ipc.Spawn) -> ipc.Message:
        """A child's ``subagent`` call: checked, launched, awaited; only the report returns."""
        definition = self.fleet.agents().get(run.record.agent)
        allowlist = definition.subagent_agents if definition is not None else ()
        try:
            validate_nested(
                caller_agent=run.record.agent,
                caller_mode=run.record.mode,
                allowlist=allowlist,
                depth=run.record.depth,
                agent=body.agent,
            )
        except PolicyError as exc:
            self.reject("policy", run.key, {"subagent": body.agent, "error": str(exc)})
            return ipc.Reply(ok=False, error=exc.for_child)
        try:
            [record] = await self.fleet.spawn(
                [SpawnRequest(task=body.task, agent=body.agent, name=body.name or None)],
                parent=run,
            )
        except FleetError as exc:  # its hint (a mode, a setting, a flag) is the parent's
            return ipc.Reply(ok=False, error=exc.for_child)
        settled = self._nested_settled.setdefault(record.key, trio.Event())
        done = self.fleet.run_done(record.key)
        try:
            async with run.waiting_on_supervisor():
                await wait_first(settled, *([] if done is None else [done]))
        finally:
            # Also when the caller ends first (its request is cancelled): nobody else would
            # ever collect the nested child, so it must not outlive the call.
            with trio.CancelScope(shield=True):
                handoff = (await self.fleet.stop([record.key]))[0]
            self._nested_settled.pop(record.key, None)
        if handoff["state"] == str(State.FAILED) and handoff.get("error"):
            return ipc.Reply(ok=False, error=f"{record.key} failed: {handoff['error']}")
        if handoff.get("incomplete"):
            return ipc.Reply(ok=False, error=f"{record.key} incomplete: {handoff['incomplete']}")
        # The whole report, as the nested spawn promises: only the handoff's ``last`` is clipped.
        return ipc.Reply(ok=True, data={"key": record.key, "report": record.report})
