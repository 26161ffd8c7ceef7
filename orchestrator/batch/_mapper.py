"""Maps against a live fleet: one fresh child per row, as many at once as the lane allows.

A map

1. selects its rows (:mod:`._worklist`: every row filled and checked before anything runs),
   writes its ledger's first record (the spec and the rows) and returns its id;
2. runs ``width`` workers (``min(lane capacity, max_subagents)``, never more than the lane):
   each takes the next row, spawns one fresh child for it (capacity reserved by the spawn,
   atomically; a full fleet makes the row wait, never fail), and waits for its settle note,
   which the supervisor hands to :meth:`Maps.collect` instead of the parent's notes;
3. stops a row's child at ``max_runtime`` (its handoff goes into the row's error), retries a
   failed row up to ``retries`` more times in a fresh child, then records the row's one final
   outcome: the ledger first (fsynced), then the out file, then the counts;
4. discards every row's child once its row is recorded, so a 4,096-row map holds at most
   ``width`` children and the parent's notes never see a row.

A fresh child per row keeps one row's context out of the next row's answer; a resumed map
(:meth:`Maps.resume`) runs exactly the rows its ledger has no outcome for.
"""

import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import attrs
import trio

from orchestrator._errors import FleetError, NotFound, UsageError
from orchestrator._records import ChildRecord, SpawnRequest, clip
from orchestrator._sync import wait_first
from orchestrator.batch._outfile import append_out, out_line, reconcile_out
from orchestrator.batch._spawner import Spawner
from orchestrator.batch._spec import MapSpec
from orchestrator.batch._worklist import Row, select_rows
from orchestrator.durability import MapBook
from orchestrator.governance._checked import check_schema

__all__ = ["Map", "MapFleet", "MapSpec", "Maps"]

log = logging.getLogger(__name__)

#: The longest error kept for a row.
ERROR_CLIP: Final = 2000


class MapFleet(Protocol):
    """What a map needs of the supervisor."""

    nursery: trio.Nursery

    @property
    def capacity(self) -> Any: ...
    @property
    def lane(self) -> Any: ...

    async def spawn(self, requests: Sequence[SpawnRequest]) -> list[ChildRecord]: ...
    async def stop(self, refs: Sequence[str]) -> list[dict[str, Any]]: ...
    async def discard(self, ref: str) -> str: ...
    def run_done(self, key: str) -> trio.Event | None: ...


@attrs.define(eq=False)
class _Slot:
    """One attempt's wait for its child's settle note."""

    key: str | None = None
    note: dict[str, Any] | None = None
    settled: trio.Event = attrs.Factory(trio.Event)


@attrs.define(eq=False)
class Map:
    """One map: its rows, counts and (once ``finished`` is set) its end."""

    id: str
    spec: MapSpec
    rows: list[Row]
    width: int
    dropped: int = 0
    #: Rows a previous supervisor finished (a resumed map does not run them).
    skipped: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0
    state: str = "running"
    error: str = ""
    started: float = attrs.Factory(time.monotonic)
    ended: float | None = None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    spawner: Spawner = attrs.field(kw_only=True)
    #: Where finished rows' children are discarded (set while the map runs).
    drops: trio.Nursery = attrs.field(init=False)
    finished: trio.Event = attrs.Factory(trio.Event)

    def status(self) -> dict[str, Any]:
        """The ``map`` op's shape: counts, rate (rows/s) and elapsed seconds."""
        elapsed = (self.ended or time.monotonic()) - self.started
        finished = self.done + self.failed
        total = len(self.rows)
        return {
            "map": self.id,
            "state": self.state,
            "total": total,
            "done": self.done + self.skipped,
            "failed": self.failed,
            "running": self.running,
            "queued": max(0, total - self.skipped - finished - self.running),
            "dropped": self.dropped,
            "resumed": self.skipped,
            "width": self.width,
            "elapsed_s": round(elapsed, 3),
            "rate": round(finished / elapsed, 3) if elapsed > 0 else 0.0,
            "out": self.spec.out,
            "error": self.error,
        }


def _usage(record: ChildRecord) -> dict[str, Any]:
    return {**record.usage, "tokens": record.tokens, "cost_usd": record.cost_usd}


@attrs.define(eq=False)
class Maps:
    """The supervisor's map runner (``Supervisor.maps``)."""

    fleet: MapFleet
    book: MapBook
    maps: dict[str, Map] = attrs.Factory(dict)
    #: Child name -> the attempt waiting for its note (named before the spawn: a child may
    #: settle before its spawn call returns).
    _waiting: dict[str, _Slot] = attrs.Factory(dict)

    @classmethod
    def open(cls, fleet: MapFleet, root: Path) -> "Maps":
        """The map runner of *fleet*, its ledgers under *root* (made on the first map)."""
        return cls(fleet=fleet, book=MapBook(root))

    def running(self) -> bool:
        return any(not m.finished.is_set() for m in self.maps.values())

    def _width(self) -> int:
        width: int = min(self.fleet.lane.capacity, self.fleet.capacity.cap)
        return max(1, width)

    async def start(self, spec: MapSpec, rows: Sequence[Mapping[str, Any]]) -> Map:
        """Check every row, write the ledger, start the map; returns at once."""
        selected, dropped = select_rows(
            rows, spec.template, dedupe_key=spec.dedupe_key, max_items=spec.max_items
        )
        if not selected:
            raise UsageError("map: the work list has no rows")
        if spec.schema is not None:
            check_schema(spec.schema, source="map --schema")
        map_id = self.book.new_id()
        head = {
            "spec": spec.as_json(),
            "rows": [attrs.asdict(row) for row in selected],
            "dropped": dropped,
        }
        await trio.to_thread.run_sync(self.book.begin, map_id, head)
        running = Map(
            id=map_id,
            spec=spec,
            rows=selected,
            width=self._width(),
            dropped=dropped,
            spawner=Spawner(fleet=self.fleet),
        )
        self.maps[map_id] = running
        self.fleet.nursery.start_soon(self._run, running, frozenset[int]())
        return running

    async def resume(self, map_id: str) -> Map:
        """Run the rows of *map_id* that its ledger has no outcome for."""
        current = self.maps.get(map_id)
        if current is not None and not current.finished.is_set():
            raise UsageError(f"map: {map_id} is still running (fleet map --wait {map_id})")
        state = await trio.to_thread.run_sync(self.book.read, map_id)
        spec = MapSpec.from_mapping(state.spec["spec"])
        rows = [Row(**row) for row in state.spec["rows"]]
        finished = frozenset(state.outcomes)
        running = Map(
            id=map_id,
            spec=spec,
            rows=rows,
            width=self._width(),
            dropped=int(state.spec.get("dropped", 0)),
            skipped=sum(1 for o in state.outcomes.values() if o.get("status") == "done"),
            failed=sum(1 for o in state.outcomes.values() if o.get("status") != "done"),
            spawner=Spawner(fleet=self.fleet),
        )
        if spec.out is not None:
            await trio.to_thread.run_sync(reconcile_out, Path(spec.out), state)
        self.maps[map_id] = running
        self.fleet.nursery.start_soon(self._run, running, finished)
        return running

    def find(self, map_id: str) -> Map:
        found = self.maps.get(map_id)
        if found is None:
            raise NotFound(f"map: no map {map_id!r} runs in this supervisor (fleet map --resume)")
        return found

    async def wait(self, map_id: str, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
        """The map's status once it ends, or after *timeout* seconds."""
        found = self.find(map_id)
        with trio.move_on_after(timeout):
            await found.finished.wait()
        return found.status()

    async def cancel(self, map_id: str) -> dict[str, Any]:
        """Stop a running map (its rows' children are stopped; it can be resumed)."""
        found = self.find(map_id)
        found.scope.cancel()
        await found.finished.wait()
        return found.status()

    def collect(self, record: ChildRecord, *, report: str, error: str, failure: bool) -> bool:
        """Take a settle note if a map's row is waiting for it; ``True``: the parent never
        sees it."""
        slot = self._waiting.get(record.name)
        if slot is None or (slot.key is not None and slot.key != record.key):
            return False
        if slot.note is None:
            slot.key = record.key
            slot.note = {
                "report": report,
                "error": error or record.error,
                "failure": failure,
                "result": record.result,
                "usage": _usage(record),
            }
            slot.settled.set()
        return True

    # -- running ----------------------------------------------------------------------------

    async def _run(self, running: Map, finished: frozenset[int]) -> None:
        send, receive = trio.open_memory_channel[Row](math.inf)
        for row in running.rows:
            if row.id not in finished:
                send.send_nowait(row)
        send.close()
        try:
            with running.scope:
                async with trio.open_nursery() as drops:
                    running.drops = drops
                    async with trio.open_nursery() as spawning:
                        spawning.start_soon(running.spawner.serve)
                        async with trio.open_nursery() as workers:
                            for _ in range(running.width):
                                workers.start_soon(self._worker, running, receive.clone())
                        spawning.cancel_scope.cancel()
            receive.close()
            running.state = "cancelled" if running.scope.cancelled_caught else "done"
        except Exception as exc:
            # A map's bug must not end the supervisor: the map ends, resumable, and says why.
            log.exception("map %s failed", running.id)
            running.state = "failed"
            running.error = f"{type(exc).__name__}: {exc}"
        finally:
            with trio.CancelScope(shield=True):
                for key in running.spawner.orphans:
                    await self._drop(running, key)
            running.ended = time.monotonic()
            if running.state == "running":
                running.state = "cancelled"
            running.finished.set()

    async def _worker(self, running: Map, rows: trio.MemoryReceiveChannel[Row]) -> None:
        async with rows:
            async for row in rows:
                running.running += 1
                try:
                    outcome = await self._row(running, row)
                finally:
                    running.running -= 1
                await self._record(running, row, outcome)

    async def _row(self, running: Map, row: Row) -> dict[str, Any]:
        spec = running.spec
        outcome: dict[str, Any] = {}
        for attempt in range(1, spec.retries + 2):
            outcome = await self._attempt(running, row, attempt)
            outcome["attempts"] = attempt
            if outcome["status"] == "done":
                break
        return outcome

    async def _attempt(self, running: Map, row: Row, attempt: int) -> dict[str, Any]:
        spec = running.spec
        name = f"{running.id}-row{row.id}-{attempt}"
        slot = _Slot()
        self._waiting[name] = slot
        request = SpawnRequest(
            task=row.task,
            agent=spec.agent,
            mode=spec.mode,
            name=name,
            model=spec.model,
            role=spec.role,
            schema=spec.schema,
        )
        try:
            try:
                record = await running.spawner.spawn(request)
            except FleetError as exc:
                return {"status": "failed", "error": clip(str(exc), ERROR_CLIP), "child": None}
            slot.key = record.key
            try:
                return await self._settle(record, slot, spec.max_runtime)
            finally:
                # Off the row's path: the next row starts while this child goes.
                running.drops.start_soon(self._drop, running, record.key)
        finally:
            del self._waiting[name]

    async def _settle(self, record: ChildRecord, slot: _Slot, cap: float | None) -> dict[str, Any]:
        base: dict[str, Any] = {"child": record.key}
        done = self.fleet.run_done(record.key)
        if done is None:
            done = trio.Event()
        with trio.move_on_after(math.inf if cap is None else cap) as timer:
            await wait_first(slot.settled, done)
        if timer.cancelled_caught and slot.note is None:
            with trio.CancelScope(shield=True):
                [handoff] = await self.fleet.stop([record.key])
            return base | {
                "status": "failed",
                "error": f"stopped at its runtime cap of {cap:g} s",
                "handoff": handoff,
                "usage": _usage(record),
            }
        note = slot.note
        if note is None:
            error = record.error or f"its child ended {record.state} without a result"
            return base | {
                "status": "failed",
                "error": clip(error, ERROR_CLIP),
                "usage": _usage(record),
            }
        if note["failure"] or note["error"]:
            error = note["error"] or "its child failed"
            return base | {
                "status": "failed",
                "error": clip(error, ERROR_CLIP),
                "usage": note["usage"],
            }
        result = note["result"] if record.schema is not None else note["report"]
        return base | {"status": "done", "result": result, "usage": note["usage"]}

    async def _drop(self, running: Map, key: str) -> None:
        with trio.CancelScope(shield=True), contextlib.suppress(FleetError):  # already gone
            await self.fleet.discard(key)
        running.spawner.given_back()

    async def _record(self, running: Map, row: Row, outcome: dict[str, Any]) -> None:
        """The row's one final outcome: ledger (fsynced), then out file, then counts."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.book.finished, running.id, row.id, outcome)
            if running.spec.out is not None:
                line = out_line(running.id, row.id, row.key, outcome)
                await trio.to_thread.run_sync(append_out, Path(running.spec.out), line)
        if outcome["status"] == "done":
            running.done += 1
        else:
            running.failed += 1
