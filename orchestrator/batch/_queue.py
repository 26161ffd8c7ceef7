"""The integration queue: held worker changes landed one at a time behind a conflict check and
a test gate (docs/worktrees.md "The integration queue").

A worker stopped with ``fleet stop aN --hold`` keeps its change in its worktree; it enters the
queue in key order. :meth:`IntegrationQueue.land` takes the first queued change and

1. **pre-checks** its ordinary files' patch with ``git apply --check`` against the parent's
   checkout as it is now (earlier landings included): a conflict holds the change with the
   files git names;
2. runs the **gate** (``integration.gate``, a shell command) in a fresh worktree of the
   parent's current tree with the patch applied, inside the sandbox under the ``worker``
   policy (that worktree writable, no network, the state directory hidden): a non-zero exit
   holds the change with the tail of the gate's output;
3. on a green gate only, **lands** the change's ordinary files through the same copy-back as
   ``fleet apply`` (its conflict rule and path guard). Held-class files (they run later or
   instruct an agent) never land here: the result names them for ``fleet apply aN PATH``.

Every status change is one line in ``queue.jsonl`` in the session directory (the journal's
record shape); a later supervisor reads it back, so a held change keeps its reason.
"""

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import attrs
import orjson
import trio

import sandbox
from orchestrator._errors import UsageError
from orchestrator.durability import JournalRecord, parse_journal
from orchestrator.workspace._copyback import Pending
from orchestrator.workspace._git import WorktreeError, git_env, run_git
from orchestrator.workspace._worktree import Snapshot, create_worktree, remove_worktree

__all__ = ["GATE_TAIL", "Entry", "IntegrationQueue", "QueueWorktrees"]

#: The most characters of a red gate's output kept as the reason.
GATE_TAIL: Final = 2000


class QueueWorktrees(Protocol):
    """What the queue needs of the supervisor's worktrees (``core._isolation.Worktrees``)."""

    repo: Path
    snapshots: dict[str, Snapshot]
    holding: set[str]

    async def change(self, key: str, paths: list[str]) -> list[tuple[Pending, str]]: ...
    async def apply(self, key: str, names: list[str] | None) -> dict[str, Any]: ...


@attrs.define(eq=False)
class Entry:
    """One held change in the queue."""

    key: str
    status: str = "queued"  # queued, landed, held
    reason: str = ""
    conflicts: list[str] = attrs.Factory(list)
    gate: str = ""
    held_files: list[dict[str, str]] = attrs.Factory(list)
    landed: list[str] = attrs.Factory(list)

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _order(key: str) -> tuple[int, str]:
    return (int(key[1:]), key) if key[1:].isdigit() else (1 << 30, key)


@attrs.define(eq=False)
class IntegrationQueue:
    """The session's queue (``Supervisor.queue``)."""

    worktrees: QueueWorktrees
    #: ``integration.gate``: the shell command a change must pass ("" refuses ``land``).
    gate: str
    #: Where gate worktrees, their scratch and ``queue.jsonl`` go (the session directory).
    root: Path
    #: Paths the gate must not see (the whole state directory).
    hidden: tuple[Path, ...] = ()
    #: ``integration.timeout``: a gate still running after this is stopped and the change held.
    #: ``integration.auto`` lands outside any request, so its gate may use all of it; a
    #: ``fleet land`` by hand is one control request, which its client waits on ~100 s at most.
    gate_timeout: float = 1800.0
    #: Runs the gate unsandboxed only when the session allows unsandboxed children.
    allow_unsandboxed: bool = False
    entries: dict[str, Entry] = attrs.Factory(dict)
    _lock: trio.Lock = attrs.Factory(trio.Lock)
    _seq: int = 0

    @property
    def journal(self) -> Path:
        return self.root / "queue.jsonl"

    def restore(self) -> None:
        """Read back what a previous supervisor recorded (a held change keeps its reason)."""
        try:
            data = self.journal.read_bytes()
        except FileNotFoundError:
            return
        for record in parse_journal(data, where=str(self.journal)).records:
            if record.kind != "queue":
                continue
            fields = {k: v for k, v in record.fields.items() if k in attrs.fields_dict(Entry)}
            self.entries[record.key] = Entry(**{**fields, "key": record.key})
            self._seq = record.seq

    def refresh(self) -> None:
        """Queue every held change not queued yet, in key order; forget resolved ones."""
        kept = self.worktrees.snapshots
        for key in sorted(self.worktrees.holding & set(kept), key=_order):
            if key not in self.entries or self.entries[key].status == "landed":
                self.entries[key] = Entry(key=key)
                self._record(self.entries[key])
        for key, entry in list(self.entries.items()):
            if entry.status != "landed" and key not in kept:
                del self.entries[key]  # discarded or applied by hand

    def show(self) -> list[dict[str, Any]]:
        self.refresh()
        ordered = sorted(self.entries.values(), key=lambda e: _order(e.key))
        return [entry.as_json() for entry in ordered]

    async def land(self, key: str | None = None) -> tuple[Entry, dict[str, Any]] | None:
        """Land the first queued change (or *key*, queued or held): the entry and, when it
        landed, the copy-back's handoff fields; ``None``: nothing is queued."""
        if not self.gate.strip():
            raise UsageError(
                "land: no integration.gate is configured (set it in fleet's config.yaml: "
                'integration: {gate: "pytest -q"}; fleet serve --stop to reload)'
            )
        async with self._lock:
            self.refresh()
            if key is None:
                queued = [e for e in self.entries.values() if e.status == "queued"]
                if not queued:
                    return None
                entry = min(queued, key=lambda e: _order(e.key))
            else:
                found = self.entries.get(key)
                if found is None or found.status == "landed":
                    raise UsageError(f"land: {key} has no held change in the queue (fleet queue)")
                entry = found
            fields = await self._land(entry)
            self._record(entry)
            return entry, fields

    async def _land(self, entry: Entry) -> dict[str, Any]:
        pairs = await self.worktrees.change(entry.key, [])
        ordinary = [(p, text) for p, text in pairs if not p.why and not p.landed]
        entry.held_files = [{"path": p.path, "why": p.why} for p, _ in pairs if p.why]
        entry.conflicts, entry.gate, entry.reason = [], "", ""
        if not ordinary:
            entry.status, entry.reason = "held", "no ordinary file to land (held files only)"
            return {}
        patch = "".join(text for _, text in ordinary).encode()
        problem = await trio.to_thread.run_sync(self._check, patch)
        if problem is not None:
            entry.status = "held"
            entry.conflicts = _named(problem, [p.path for p, _ in ordinary])
            entry.reason = f"conflict with the parent's tree: {', '.join(entry.conflicts)}"
            return {}
        code, output = await self._gate(patch)
        if code != 0:
            entry.status, entry.gate = "held", output[-GATE_TAIL:]
            entry.reason = f"gate `{self.gate}` failed (exit {code})"
            return {}
        # Shielded: a stop (or a dropped request) after a green gate lands the whole change,
        # never half of it; before this point it leaves the change queued, nothing applied.
        with trio.CancelScope(shield=True):
            fields = await self.worktrees.apply(entry.key, [p.path for p, _ in ordinary])
        if fields.get("conflicts") or fields.get("error"):
            entry.status = "held"
            entry.conflicts = [c["path"] for c in fields.get("conflicts", [])]
            entry.reason = fields.get("error") or "conflict while landing"
            return fields
        entry.status, entry.landed = "landed", list(fields.get("applied", []))
        return fields

    def _check(self, patch: bytes) -> str | None:
        try:
            run_git(
                ["apply", "--check", "-"],
                cwd=self.worktrees.repo,
                env=git_env(),
                op="land: conflict check",
                stdin=patch,
            )
        except WorktreeError as exc:
            return str(exc)
        return None

    async def _gate(self, patch: bytes) -> tuple[int, str]:
        """The gate's exit code and output, run on the parent's tree with *patch* applied."""
        base = self.root / "gates"
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(prefix="gate-", dir=base))
        tree, scratch = where / "tree", where / "scratch"
        scratch.mkdir()
        snapshot = None
        try:
            snapshot = await trio.to_thread.run_sync(create_worktree, self.worktrees.repo, tree)
            await trio.to_thread.run_sync(
                lambda: run_git(
                    ["apply", "-"], cwd=tree, env=git_env(), op="land: gate", stdin=patch
                )
            )
            argv = ["sh", "-c", self.gate]
            spec = sandbox.SandboxSpec(
                policy=sandbox.Policy.WORKER,
                scratch=scratch,
                writable=(tree,),
                visible=(self.worktrees.repo,),
                hidden=self.hidden,
                network=False,
                cwd=tree,
            )
            wrapped = sandbox.wrap(argv, spec)
            if not wrapped.wrapped and not self.allow_unsandboxed:
                return 126, f"the gate needs a sandbox and none works here: {wrapped.reason}"
            env = {**os.environ, **wrapped.env}
            with trio.move_on_after(self.gate_timeout) as timer:
                done = await trio.run_process(
                    list(wrapped.argv),
                    cwd=str(tree),
                    env=env,
                    check=False,
                    capture_stdout=True,
                    stderr=subprocess.STDOUT,  # one stream, in order
                    stdin=b"",
                )
            if timer.cancelled_caught:
                return 124, f"the gate ran past {self.gate_timeout:g} s and was stopped"
            return done.returncode, done.stdout.decode("utf-8", "replace")
        except WorktreeError as exc:
            return 125, f"the change does not apply to the parent's tree: {exc}"
        finally:
            with trio.CancelScope(shield=True):
                if snapshot is not None:
                    await trio.to_thread.run_sync(remove_worktree, snapshot)
                await trio.to_thread.run_sync(lambda: shutil.rmtree(where, ignore_errors=True))

    def _record(self, entry: Entry) -> None:
        self._seq += 1
        fields = {k: v for k, v in entry.as_json().items() if k != "key"}
        line = JournalRecord(
            seq=self._seq, at=time.time(), kind="queue", key=entry.key, fields=fields
        )
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, orjson.dumps(line.as_json()) + b"\n")
        finally:
            os.close(fd)


def _named(problem: str, paths: Sequence[str]) -> list[str]:
    """The changed paths git's refusal names (all of them when it names none)."""
    named = [p for p in paths if p in problem]
    return named or list(paths)
