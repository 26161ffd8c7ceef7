"""The supervisor's budgets: every child's usage into the ledger, and what a reached limit does.

A child's soft limit steers it once with :data:`SOFT_STEER` and tells the parent (a note and a
``budget`` event); its hard limit stops it with an ``incomplete`` handoff. A tree's (one
top-level child and its descendants) soft cap steers every live child of that tree once and
tells the parent; its hard cap makes the gateway refuse every further model request of the
tree (:meth:`Budgets.refusal`) and stops each of its live children ``incomplete`` — other trees
go on. The session's soft limit tells the parent once; its hard limit refuses every new turn
(spawn, prompt, resume, ask) with one :class:`PolicyError` line. Hard spawn and turn caps (a
child's, its tree's, the session's) refuse the spawn or turn that would pass them
(:meth:`Budgets.check_spawn`, :meth:`Budgets.check_turn`). Limits come from the configuration,
lowered (never raised) by a definition and a spawn; a nested child's is capped by its parent's.
"""

import contextlib
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import attrs
import trio

import ipc
from orchestrator._errors import FleetError, PolicyError, UsageError
from orchestrator._records import ChildRecord
from orchestrator.notify import Notifier, budget_event
from orchestrator.spend._ledger import Crossing, Ledger
from orchestrator.spend._limits import (
    Limit,
    SpendPolicy,
    clamp,
    parse_limit,
    resolve_limit,
)
from orchestrator.spend._metering import Metered
from orchestrator.spend._pacing import Pacing

__all__ = ["SOFT_STEER", "Budgets"]

SOFT_STEER = "budget nearly spent: finish and report"


class Notes(Protocol):
    """Where the parent's notes wait (``core._notes.Notes``)."""

    @property
    def pending(self) -> list[dict[str, Any]]: ...
    def changed(self) -> None: ...


class Budgeted(Protocol):
    """The run a usage report came from (``ChildRun``)."""

    @property
    def key(self) -> str: ...
    @property
    def record(self) -> ChildRecord: ...
    def flag_usage(self, line: str) -> None: ...
    async def steer(self, text: str) -> None: ...
    async def stop_incomplete(self, reason: str) -> None: ...


@attrs.define(eq=False)
class Budgets:
    """The session's ledger and the actions its limits take."""

    policy: SpendPolicy
    nursery: trio.Nursery
    notes: Notes
    notifier: Notifier
    session: str
    scrub: Callable[[str], str] = str
    #: The session's provider gates (the model gateway paces every child's requests here).
    pacing: Pacing | None = None
    #: The live runs by key (the supervisor's own table): a tree's cap acts on all of them.
    runs: Mapping[str, Budgeted] = attrs.Factory(dict)
    ledger: Ledger = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.ledger = Ledger(policy=self.policy)

    # -- limits -------------------------------------------------------------------------

    def limit_for(
        self,
        agent: str,
        *,
        definition: Limit | None,
        requested: Mapping[str, Any] | None,
        parent: str | None,
    ) -> Limit:
        """The limit of a new child of *agent*; a raise is one PolicyError line."""
        asked = None if requested is None else parse_limit(requested, f"spawn {agent}: budget")
        capped = None if parent is None else self.ledger.limit_of(parent)
        return resolve_limit(
            self.policy, agent, definition=definition, requested=asked, parent=capped
        )

    def open(self, record: ChildRecord, limit: Limit, model: str = "") -> None:
        """*record*'s account in its parent's tree, its budget shown in ``peek`` from the
        start; a new child's task is its first turn (a revived one's turn was counted by
        :meth:`check_turn`)."""
        fresh = record.key not in self.ledger.accounts
        account = self.ledger.open(record.key, record.agent, limit, record.parent)
        account.model = model or account.model
        crossings = self.ledger.count_turn(record.key) if fresh else []
        record.usage = account.as_json()
        for crossing in crossings:
            self._act(None, record, crossing)
        if record.parent is not None:  # the parent's own soft spawn cap
            parent = self.runs.get(record.parent)
            if parent is not None:
                self._show(parent)  # its spawns, in peek
            for crossing in self.ledger.soft_counts(record.parent):
                if parent is not None:
                    self._act(parent, parent.record, crossing)

    def revived(self, record: ChildRecord, journaled: Mapping[str, Any] | None) -> None:
        """A revived child's account: the budget it was spawned with, never more than the
        configuration gives its definition now; what it spent before (restored from the
        journal) is kept."""
        try:
            before = parse_limit(journaled, f"revive {record.key}: budget")
        except UsageError:
            before = None  # a journal line from elsewhere: the configured limit applies
        self.open(record, clamp(self.policy.configured(record.agent), before))

    def new_life(self, key: str) -> None:
        """*key*'s process starts again (woken, revived): its reports from zero add up."""
        self.ledger.new_life(key)

    def restore(self, key: str, agent: str, spent: object) -> None:
        """What *key* spent as the session journal says (a supervisor restart)."""
        self.ledger.restore(key, spent, agent)

    def spent(self, key: str) -> dict[str, Any] | None:
        """What *key* spent so far, as journaled; None for no account."""
        account = self.ledger.accounts.get(key)
        return None if account is None else self.ledger.spent(account)

    def check_turn(self, what: str, key: str | None = None) -> None:
        """Refuse a new turn once the session's hard limit is reached; for *key*'s turn, also
        once its own or its tree's hard limit is reached or a hard turn cap would be passed.
        An admitted turn of *key* is counted."""
        refusal = self.ledger.session_refusal()
        if refusal is not None:
            raise PolicyError(f"{what}: {refusal}")
        if key is None:
            return
        refused = self.ledger.refuse_turn(key)
        if refused:
            raise PolicyError(f"{what}: {refused}")
        run = self.runs.get(key)
        for crossing in self.ledger.count_turn(key):
            if run is not None:
                self._act(run, run.record, crossing)

    def turn_refused(self, key: str) -> bool:
        """Whether *key* may start no turn of its own (a background shell's wake): the session
        or its tree is spent, or a hard turn cap is reached. Nothing is counted."""
        return self.ledger.session_refusal() is not None or bool(self.ledger.refuse_turn(key))

    def check_spawn(self, count: int, parent: str | None) -> None:
        """Refuse *count* new children under *parent* (None: the parent agent's own spawn)
        when a hard spawn or turn cap would be passed, or the parent's tree is spent."""
        refused = self.ledger.refuse_spawn(parent, count)
        if refused:
            raise PolicyError(f"spawn: {refused}")

    # -- usage --------------------------------------------------------------------------

    def on_usage(self, run: Budgeted, usage: ipc.Usage) -> None:
        """Account *run*'s cumulative *usage* and act on every limit it newly reached; what
        was wrong with the report (a negative count or cost) is flagged (run log, reject log)."""
        problems: list[str] = []
        crossings = self.ledger.record(run.key, usage, problems)
        for problem in problems:
            run.flag_usage(problem)
        account = self.ledger.accounts.get(run.key)
        if account is not None:
            run.record.usage = account.as_json(self.ledger.spawns_of(run.key))
            run.record.tokens = account.tokens
            if account.cost_usd is not None:
                run.record.cost_usd = round(account.cost_usd, 6)
        for crossing in crossings:
            self._act(run, run.record, crossing)

    def on_metered(self, run: Budgeted, metered: Metered) -> None:
        """One response's bill as the model gateway read it: the ledger's own count."""
        crossings = self.ledger.meter(run.key, metered)
        self._show(run)
        for crossing in crossings:
            self._act(run, run.record, crossing)

    def refusal(self, key: str) -> str | None:
        """Why the gateway must refuse *key*'s next model request: its own, its tree's or the
        session's hard limit is reached."""
        account = self.ledger.accounts.get(key)
        if account is not None and "hard" in account.reached:
            what = account.limit.reached("hard", account.tokens, account.cost_usd)
            return f"fleet: budget spent ({what or 'hard limit reached'}): no more model requests"
        tree = self.ledger.tree_refusal(key)
        if tree is not None:
            return f"fleet: {tree}: no more model requests"
        session = self.ledger.session_refusal()
        return None if session is None else f"fleet: {session}"

    def cross_check(self, run: Budgeted) -> None:
        """After a turn: a child that reported fewer tokens than the gateway metered is
        flagged (it is counted what was metered either way)."""
        account = self.ledger.accounts.get(run.key)
        if account is None or not account.metered:
            return
        reported, metered = self.ledger.reported(account), account.metered.get("tokens", 0)
        if reported < metered:
            line = f"the child reported {reported} tokens, the gateway metered {metered}"
            if line not in account.flags:
                account.flag(line)
                run.flag_usage(line)
                self._show(run)

    def _show(self, run: Budgeted) -> None:
        account = self.ledger.accounts.get(run.key)
        if account is not None:
            run.record.usage = account.as_json(self.ledger.spawns_of(run.key))
            run.record.tokens = account.tokens
            if account.cost_usd is not None:
                run.record.cost_usd = round(account.cost_usd, 6)

    def _act(self, run: Budgeted | None, record: ChildRecord, crossing: Crossing) -> None:
        """What *crossing* (reached by *record*'s usage, spawn or turn) does."""
        if crossing.scope == "child":
            if run is None:
                run = self.runs.get(record.key)
            if crossing.level == "hard":
                if run is not None:
                    self.nursery.start_soon(run.stop_incomplete, f"budget spent: {crossing.what}")
                return
            if run is not None:
                self.nursery.start_soon(self._steer, run)
        elif crossing.scope == "tree":
            self._act_on_tree(crossing)
        scope = {"session": "session budget", "tree": "tree budget"}.get(crossing.scope, "budget")
        line = f"{scope} {crossing.level} limit reached: {crossing.what}"
        self._tell(record, crossing, line)

    def _act_on_tree(self, crossing: Crossing) -> None:
        """A tree's soft cap steers each of its live children, its hard cap stops each
        ``incomplete`` (the deepest first, so a nested child's caller hears why)."""
        members = {a.key for a in self.ledger.members(crossing.tree)}
        live = sorted(
            (run for key, run in list(self.runs.items()) if key in members),
            key=lambda run: -run.record.depth,
        )
        for run in live:
            if crossing.level == "hard":
                reason = f"tree budget spent: {crossing.what}"
                self.nursery.start_soon(run.stop_incomplete, reason)
            else:
                self.nursery.start_soon(self._steer, run)

    async def _steer(self, run: Budgeted) -> None:
        with contextlib.suppress(FleetError):  # between turns or ending: nothing to steer
            await run.steer(SOFT_STEER)

    def _tell(self, record: ChildRecord, crossing: Crossing, line: str) -> None:
        """The parent agent's note (for the session, or a top-level child: a nested one's
        parent is a child, which its own budget governs) and the ``budget`` event."""
        root = self.runs.get(crossing.tree) if crossing.scope == "tree" else None
        record = record if root is None else root.record  # a tree's note names its root
        if record.parent is None or crossing.scope in ("session", "tree"):
            self.notes.pending.append(
                {
                    "key": record.key,
                    "name": record.name,
                    "state": str(record.state),
                    "peek": record.peek_line(),
                    "report": "",
                    "error": "",
                    "budget": {"scope": crossing.scope, "level": crossing.level, "line": line},
                }
            )
            self.notes.changed()
        self.notifier.emit(budget_event(record, session=self.session, line=line, scrub=self.scrub))

    def report(self, keys: Collection[str] = ()) -> dict[str, Any]:
        """``fleet usage``: the session, per child (*keys* only, when given), per definition."""
        return self.ledger.report(keys)
