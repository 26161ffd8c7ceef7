"""What a run needs of its supervisor: the one narrow face of the composition root a run sees.

The supervisor wires itself in as the host of every run; a run never imports it. The protocol is
generic in the run type so this module needs nothing of :mod:`orchestrator.core._run`.
"""

from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

import ipc
from orchestrator._config import Config
from orchestrator._records import ChildRecord, SpawnRequest
from orchestrator.core._agents import AgentDefinition
from orchestrator.core._budgets import Budgets
from orchestrator.core._capacity import Capacity, Lane
from orchestrator.core._isolation import Worktrees
from orchestrator.core._journaling import Journal
from orchestrator.core._notes import Notes
from orchestrator.core._registry import Registry
from orchestrator.core._requests import Question
from orchestrator.governance._diagnostics import RejectKind
from orchestrator.governance._redaction import SecretSet
from orchestrator.governance._watchdog import BudgetPolicy
from orchestrator.launch._forkserver import ForkServer
from orchestrator.launch._launcher import Launched, Launcher

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.core._terms import RemoteTerms

__all__ = ["RemoteHost", "RunHost", "ServiceHost", "SpawnHost", "SpawnMemory"]

R_contra = TypeVar("R_contra", contravariant=True)


class RunHost(Protocol[R_contra]):
    """What a run needs of its supervisor, which wires itself in as the host of every run."""

    @property
    def config(self) -> Config: ...
    @property
    def lane(self) -> Lane: ...
    @property
    def worktrees(self) -> Worktrees: ...
    @property
    def spend(self) -> Budgets: ...
    @property
    def journal(self) -> Journal: ...
    async def launch(self, run: R_contra, nursery: trio.Nursery) -> Launched: ...
    async def release(self, run: R_contra) -> None: ...
    def take_ownership(self, run: R_contra, paths: Sequence[str]) -> ipc.Message: ...
    async def nested_spawn(self, run: R_contra, body: ipc.Spawn) -> ipc.Message: ...
    async def discuss_for(self, run: R_contra, body: ipc.Discuss) -> ipc.Message: ...
    def new_question(self, key: str, text: str) -> Question: ...
    def drop_question(self, qid: str) -> None: ...
    def cancel_questions(self, key: str) -> None: ...
    def reject(self, kind: RejectKind, owner: str, args: Mapping[str, Any]) -> None: ...
    def notify(
        self,
        record: ChildRecord,
        *,
        report: str = "",
        error: str = "",
        question: Question | None = None,
        failure: bool = False,
    ) -> None: ...


class RemoteHost(Protocol):
    """What spawning needs for children on other nodes (``core._remote.Remote``)."""

    async def fields_for(
        self, key: str, scratch: "Path", checkouts: "Path", fields: dict[str, Any]
    ) -> dict[str, Any]: ...
    def certify(self, owner: str, csr: bytes) -> tuple[bytes, bytes]: ...
    def terms_for(self, key: str, lease_s: float) -> "RemoteTerms": ...


class SpawnMemory(Protocol):
    """What keeps each child's loadout fields for a later wake (``core._hibernation``)."""

    def spawned(self, record: ChildRecord, fields: Mapping[str, Any]) -> None: ...


class SpawnHost(RunHost[R_contra], Protocol[R_contra]):
    """What spawning needs: the fleet's tables, its capacity, its launchers, and a run's host."""

    @property
    def nursery(self) -> trio.Nursery: ...
    @property
    def session_key(self) -> bytes: ...
    @property
    def secrets(self) -> SecretSet: ...
    @property
    def mode(self) -> str: ...
    @property
    def budgets(self) -> BudgetPolicy: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def capacity(self) -> Capacity: ...
    @property
    def notes(self) -> Notes: ...
    @property
    def runs(self) -> MutableMapping[str, Any]: ...
    @property
    def launchers(self) -> MutableMapping[str, Launcher]: ...
    @property
    def fork_server(self) -> ForkServer | None: ...
    @property
    def boxed_fork_server(self) -> ForkServer | None: ...
    @property
    def remote(self) -> "RemoteHost": ...
    @property
    def hibernation(self) -> "SpawnMemory": ...
    def agents(self, scope: str | None = None) -> dict[str, AgentDefinition]: ...
    def refuse_hello(self, reason: str, owner: str, **evidence: Any) -> None: ...


class ServiceHost(Protocol[R_contra]):
    """What the services for running children need of the fleet beyond their own tables."""

    def agents(self, scope: str | None = None) -> dict[str, AgentDefinition]: ...
    async def spawn(
        self, requests: Sequence[SpawnRequest], *, parent: R_contra | None = None
    ) -> list[ChildRecord]: ...
    async def stop(self, refs: Sequence[str]) -> list[dict[str, Any]]: ...
    def run_done(self, key: str) -> trio.Event | None: ...
