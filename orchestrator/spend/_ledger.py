"""The usage ledger: what every child spent, per child, per agent definition and per session.

A child's usage is cumulative over its process's life (every backend reports it so), so within
one *life* each report replaces the last (never lowering it). A child that starts again — woken
from hibernation, revived — reports from zero: :meth:`Ledger.new_life` banks what it spent so
far and the new life's reports add to that. :meth:`Ledger.restore` seeds an account from the
session journal (a supervisor restart), and :meth:`Ledger.spent` is what is journaled.

A life's cost is the backend's own reported cumulative cost when
there is one, else its tokens priced by the configured table, else unknown (``None``: only
token limits apply). :meth:`Ledger.record` returns the limits a report newly reached; each level
is reached at most once per child, once per tree and once per session.

A *tree* is one top-level child and all its descendants (an account knows its ``parent`` and
its tree's root, ``tree``); its tokens and dollars are its accounts' sum, its ``spawns`` its
nested children, its ``turns`` every turn of its children. The session's ``spawns`` are all
its children. A child's ``spawns`` are the nested children it spawned itself.

Nothing is ever negative: a report is a child's (or its model's) word, so a count that is not a
whole number >= 0 counts as 0 and a cost that is negative or not finite is refused (the price
table prices the tokens instead). Each such report is *flagged* on the account (``flags`` in
``fleet usage``) and returned to the caller, which logs it; it can never lower what was spent.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import attrs

from orchestrator.spend._limits import NO_LIMIT, Level, Limit, SpendPolicy

if TYPE_CHECKING:
    from collections.abc import Collection

    from orchestrator.spend._metering import Metered

Scope = Literal["child", "tree", "session"]

#: How many flags an account keeps (a hostile child may report nonsense on every step).
MAX_FLAGS: Final = 20


class UsageReport(Protocol):
    """What a usage event carries (``ipc.Usage`` has these fields)."""

    @property
    def tokens(self) -> int: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cache_read_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...
    @property
    def model(self) -> str: ...
    @property
    def cost_usd(self) -> float | None: ...


@attrs.frozen(kw_only=True)
class Crossing:
    """A limit a report reached: which *scope* and *level*, and what (``"9 of 8 tokens"``)."""

    scope: Scope
    level: Level
    what: str
    #: The tree's root key (a ``tree`` crossing).
    tree: str = ""


@attrs.define(eq=False)
class Account:
    """One child's usage so far and its limit."""

    key: str
    agent: str
    limit: Limit = NO_LIMIT
    #: The child that spawned it (None: the parent agent did) and its tree's root key.
    parent: str | None = None
    tree: str = ""
    #: Turns the supervisor admitted for it (its task, each prompt, ask and revive).
    turns: int = 0
    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    model: str = ""
    cost_usd: float | None = None
    reached: set[Level] = attrs.Factory(set)
    #: What was wrong with reports this account refused or clamped (the first MAX_FLAGS).
    flags: list[str] = attrs.Factory(list)
    #: What earlier lives spent (counts and cost), and what this life's reports say so far.
    banked: dict[str, int] = attrs.Factory(dict)
    banked_cost: float | None = None
    life: dict[str, int] = attrs.Factory(dict)
    life_cost: float | None = None
    #: What the model gateway metered for this child (all lives), when it relays its traffic.
    metered: dict[str, int] = attrs.Factory(dict)

    def flag(self, line: str) -> None:
        if len(self.flags) < MAX_FLAGS:
            self.flags.append(line)

    def __attrs_post_init__(self) -> None:
        self.tree = self.tree or self.key

    def as_json(self, spawns: int = 0) -> dict[str, Any]:
        metered = {"metered_tokens": self.metered.get("tokens", 0)} if self.metered else {}
        return (
            metered
            | {
                "tokens": self.tokens,
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "cache_read_tokens": self.cache_read_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "model": self.model,
                "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
                "parent": self.parent,
                "tree": self.tree,
                "spawns": spawns,
                "turns": self.turns,
                "budget": self.limit.as_json(),
                "left": left(self.limit, self.tokens, self.cost_usd, spawns, self.turns),
                "reached": sorted(self.reached),
            }
            | ({"flags": list(self.flags)} if self.flags else {})
        )


_SUMMED = ("tokens", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def left(
    limit: Limit, tokens: int, cost: float | None, spawns: int = 0, turns: int = 0
) -> dict[str, float | int]:
    """What is left of each of *limit*'s values at *tokens* / *cost* / *spawns* / *turns*
    (never below 0; a dollar limit of an unknown cost is left out)."""
    counts = {"tokens": tokens, "spawns": spawns, "turns": turns}
    remaining: dict[str, float | int] = {}
    for key, value in limit.as_json().items():
        unit = key.partition("_")[2]
        if unit in counts:
            remaining[key] = max(0, int(value) - counts[unit])
        elif cost is not None:
            remaining[key] = round(max(0.0, value - cost), 6)
    return remaining


def _count(usage: UsageReport, name: str, problems: list[str]) -> int:
    value = getattr(usage, name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(f"{name} {value!r} is not a whole number >= 0: counted as 0")
        return 0
    return value


def _reported_cost(usage: UsageReport, problems: list[str]) -> float | None:
    return _reported_cost_value(getattr(usage, "cost_usd", None), problems)


def _reported_cost_value(value: object, problems: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"cost_usd {value!r} is not a number: refused")
        return None
    if value < 0:
        problems.append(f"cost_usd {value!r} is negative: refused")
        return None
    return float(value)


def _sum(accounts: list[Account]) -> dict[str, Any]:
    total: dict[str, Any] = {name: sum(getattr(a, name) for a in accounts) for name in _SUMMED}
    costs = [a.cost_usd for a in accounts if a.cost_usd is not None]
    total["cost_usd"] = round(sum(costs), 6) if costs else None
    total["children"] = len(accounts)
    total["turns"] = sum(a.turns for a in accounts)
    return total


def _newly(
    scope: Scope, limit: Limit, reached: set[Level], tokens: int, cost: float | None
) -> list[Crossing]:
    """The level of *limit* newly reached (hard wins and implies soft), marked in *reached*."""
    for level in ("hard", "soft"):
        what = limit.reached(level, tokens, cost)
        if what:
            if level in reached:
                return []
            reached.update(("hard", "soft") if level == "hard" else ("soft",))
            return [Crossing(scope=scope, level=level, what=what)]
    return []


@attrs.define(eq=False)
class Ledger:
    """Every child's account (kept after the child ends) and the session's reached levels."""

    policy: SpendPolicy = attrs.Factory(SpendPolicy)
    accounts: dict[str, Account] = attrs.Factory(dict)
    session_reached: set[Level] = attrs.Factory(set)
    #: Each tree's reached levels (tokens and dollars), by its root's key.
    tree_reached: dict[str, set[Level]] = attrs.Factory(dict)
    #: The soft spawn/turn caps already noted (``"tree a1 turns"``): each once.
    counted: set[str] = attrs.Factory(set)

    def open(self, key: str, agent: str, limit: Limit, parent: str | None = None) -> Account:
        """*key*'s account with *limit*, in its *parent*'s tree (its own when None); one
        restored from the journal keeps what it spent."""
        before = self.accounts.get(key)
        above = None if parent is None else self.accounts.get(parent)
        tree = key if parent is None else above.tree if above is not None else parent
        account = Account(key=key, agent=agent, limit=limit, parent=parent, tree=tree)
        self.accounts[key] = account
        if before is not None:
            self.restore(key, self.spent(before))
            account.parent, account.tree = parent, tree
        return account

    # -- trees, spawns and turns --------------------------------------------------------

    def tree_of(self, key: str) -> str:
        """The root key of *key*'s tree (*key* itself for a top-level or unknown child)."""
        account = self.accounts.get(key)
        return key if account is None else account.tree

    def members(self, tree: str) -> list[Account]:
        return [a for a in self.accounts.values() if a.tree == tree]

    def spawns_of(self, key: str) -> int:
        """The nested children *key* spawned itself."""
        return sum(a.parent == key for a in self.accounts.values())

    def tree(self, root: str) -> dict[str, Any]:
        """*root*'s tree summed: tokens, cost, children, turns and ``spawns`` (nested ones)."""
        total = _sum(self.members(root))
        return total | {"spawns": max(0, total["children"] - 1)}

    def refuse_spawn(self, parent: str | None, count: int) -> str:
        """Why *count* new children under *parent* (None: the parent agent) would pass a hard
        spawn or turn cap (each new child's task is a turn), or ""."""
        session = self.session()
        checks = [
            ("session", self.policy.session.allows("spawns", len(self.accounts), count)),
            ("session", self.policy.session.allows("turns", session["turns"], count)),
        ]
        if parent is None:  # each a new tree, whose task is its first turn
            checks.append(("tree", self.policy.tree.allows("turns", 0)))
        else:
            root = self.tree_of(parent)
            spent = self.tree_refusal(parent)
            if spent:
                return f"{spent}: no new children"
            tree = self.tree(root)
            limit = self.limit_of(parent) or NO_LIMIT
            checks += [
                (f"tree {root}", self.policy.tree.allows("spawns", tree["spawns"], count)),
                (f"tree {root}", self.policy.tree.allows("turns", tree["turns"], count)),
                (parent, limit.allows("spawns", self.spawns_of(parent), count)),
            ]
        for where, what in checks:
            if what:
                return f"{where} cap reached ({what}): no new children"
        return ""

    def refuse_turn(self, key: str) -> str:
        """Why one more turn for *key* would pass a hard turn cap, or a hard token or dollar
        cap of its tree or its own is already reached; ""."""
        account = self.accounts.get(key)
        if account is None:
            return ""
        root = account.tree
        if "hard" in account.reached:
            return f"{key} budget spent: no new turns"
        if self.tree_refusal(key) is not None:
            return f"tree {root} budget spent: no new turns"
        tree = self.tree(root)
        for where, limit, turns in (
            ("session", self.policy.session, self.session()["turns"]),
            (f"tree {root}", self.policy.tree, tree["turns"]),
            (key, account.limit, account.turns),
        ):
            what = limit.allows("turns", turns)
            if what:
                return f"{where} turn cap reached ({what}): no new turns"
        return ""

    def count_turn(self, key: str) -> list[Crossing]:
        """One more turn for *key*; the soft turn caps it newly reached."""
        account = self.accounts.get(key)
        if account is None:
            return []
        account.turns += 1
        return self.soft_counts(key)

    def soft_counts(self, key: str) -> list[Crossing]:
        """The soft spawn and turn caps of *key*'s scopes newly reached (each once)."""
        account = self.accounts.get(key)
        if account is None:
            return []
        root = account.tree
        tree, session = self.tree(root), self.session()
        session_counts = {"spawns": len(self.accounts), "turns": session["turns"]}
        crossings: list[Crossing] = []
        for scope, mark, limit, counts in (
            ("child", key, account.limit, {"spawns": self.spawns_of(key), "turns": account.turns}),
            ("tree", root, self.policy.tree, {"spawns": tree["spawns"], "turns": tree["turns"]}),
            ("session", "", self.policy.session, session_counts),
        ):
            for unit in ("spawns", "turns"):
                soft = getattr(limit, f"soft_{unit}")
                seen = f"{scope} {mark} {unit}"
                if soft is not None and counts[unit] >= soft and seen not in self.counted:
                    self.counted.add(seen)
                    what = f"{counts[unit]} of {soft} {unit}"
                    crossings.append(
                        Crossing(scope=scope, level="soft", what=what, tree=root)  # type: ignore[arg-type]
                    )
        return crossings

    def new_life(self, key: str) -> None:
        """*key* starts again (woken, revived): its next reports count from zero and add to
        what it spent so far."""
        account = self.accounts.get(key)
        if account is None:
            return
        account.banked = {name: getattr(account, name) for name in _SUMMED}
        account.banked_cost = account.cost_usd
        account.life, account.life_cost = {}, None

    def restore(self, key: str, spent: object, agent: str = "") -> None:
        """Seed *key*'s account with *spent* as journaled (bad values count 0), as a banked
        life; an account that does not exist yet is opened without a limit."""
        if not isinstance(spent, dict):
            return
        account = self.accounts.get(key)
        if account is None:
            account = self.accounts[key] = Account(key=key, agent=agent)
        ignored: list[str] = []
        for name in _SUMMED:
            value = spent.get(name, 0)
            setattr(account, name, value if isinstance(value, int) and value >= 0 else 0)
        cost = spent.get("cost_usd")
        account.cost_usd = _reported_cost_value(cost, ignored)
        model = spent.get("model")
        account.model = model[:200] if isinstance(model, str) else account.model
        turns, parent, tree = spent.get("turns"), spent.get("parent"), spent.get("tree")
        account.turns = turns if isinstance(turns, int) and turns >= 0 else account.turns
        if isinstance(parent, str) and isinstance(tree, str) and tree:
            account.parent, account.tree = parent, tree[:64]
        elif isinstance(tree, str) and tree:
            account.tree = tree[:64]
        if spent.get("metered") is True:  # the gateway goes on counting from there
            account.metered = {name: getattr(account, name) for name in _SUMMED}
        self.new_life(key)

    @staticmethod
    def spent(account: Account) -> dict[str, Any]:
        """What *account* spent, as the journal keeps it."""
        spent: dict[str, Any] = {name: getattr(account, name) for name in _SUMMED}
        return spent | {
            "cost_usd": account.cost_usd,
            "model": account.model,
            "metered": bool(account.metered),
            "turns": account.turns,
            "parent": account.parent,
            "tree": account.tree,
        }

    def limit_of(self, key: str) -> Limit | None:
        account = self.accounts.get(key)
        return None if account is None else account.limit

    def record(
        self, key: str, usage: UsageReport, problems: list[str] | None = None
    ) -> list[Crossing]:
        """Take *key*'s cumulative *usage*; the limits it newly reached, hard before soft.
        What was wrong with the report is flagged on the account and added to *problems*."""
        account = self.accounts.get(key)
        if account is None:
            return []
        wrong: list[str] = []
        counts = {name: _count(usage, name, wrong) for name in _SUMMED}
        reported = _reported_cost(usage, wrong)
        for line in wrong:
            account.flag(line)
        if problems is not None:
            problems.extend(wrong)
        # Cumulative within a life: a report never lowers what was spent (a child cannot
        # unspend its budget); earlier lives' spend is added.
        for name in _SUMMED:
            account.life[name] = max(account.life.get(name, 0), counts[name])
        model = usage.model if isinstance(usage.model, str) else ""
        account.model = model[:200] or account.model
        cost = self._cost(account, reported)
        if cost is not None and account.life_cost is not None:
            cost = max(cost, account.life_cost)
        account.life_cost = account.life_cost if cost is None else cost
        self._total(account)
        return self._crossings(account)

    def meter(self, key: str, metered: Metered) -> list[Crossing]:
        """Add one response's bill as the gateway read it; the limits newly reached."""
        account = self.accounts.get(key)
        if account is None:
            return []
        account.metered["tokens"] = account.metered.get("tokens", 0) + metered.tokens
        for name in _SUMMED[1:]:
            account.metered[name] = account.metered.get(name, 0) + getattr(metered, name)
        account.model = account.model or metered.model[:200]
        self._total(account)
        return self._crossings(account)

    def reported(self, account: Account) -> int:
        """The tokens *account*'s child itself reported (every life's)."""
        return account.banked.get("tokens", 0) + account.life.get("tokens", 0)

    def _total(self, account: Account) -> None:
        """*account*'s spend: what its child reported or the gateway metered, whichever is
        more, count by count (a child that under-reports is counted what it was billed)."""
        for name in _SUMMED:
            reported = account.banked.get(name, 0) + account.life.get(name, 0)
            setattr(account, name, max(reported, account.metered.get(name, 0)))
        costs = []
        if account.life_cost is not None or account.banked_cost is not None:
            costs.append((account.banked_cost or 0.0) + (account.life_cost or 0.0))
        price = self.policy.price_for(account.model)
        if account.metered and price is not None:
            costs.append(
                price.cost(
                    input=account.metered.get("input_tokens", 0),
                    output=account.metered.get("output_tokens", 0),
                    cache_read=account.metered.get("cache_read_tokens", 0),
                    cache_write=account.metered.get("cache_write_tokens", 0),
                )
            )
        if costs:
            account.cost_usd = max(costs)

    def _crossings(self, account: Account) -> list[Crossing]:
        session = self.session()
        tree = self.tree(account.tree) if not self.policy.tree.empty else None
        in_tree = (
            []
            if tree is None
            else [
                attrs.evolve(crossing, tree=account.tree)
                for crossing in _newly(
                    "tree",
                    self.policy.tree,
                    self.tree_reached.setdefault(account.tree, set()),
                    tree["tokens"],
                    tree["cost_usd"],
                )
            ]
        )
        return [
            *_newly("child", account.limit, account.reached, account.tokens, account.cost_usd),
            *in_tree,
            *_newly(
                "session",
                self.policy.session,
                self.session_reached,
                session["tokens"],
                session["cost_usd"],
            ),
        ]

    def _cost(self, account: Account, reported: float | None) -> float | None:
        """This life's cost: as reported, else its tokens priced, else unknown."""
        if reported is not None:
            return float(reported)
        price = self.policy.price_for(account.model)
        if price is None:
            return None
        life = account.life
        return price.cost(
            input=life.get("input_tokens", 0),
            output=life.get("output_tokens", 0),
            cache_read=life.get("cache_read_tokens", 0),
            cache_write=life.get("cache_write_tokens", 0),
        )

    def session(self) -> dict[str, Any]:
        return _sum(list(self.accounts.values()))

    def tree_refusal(self, key: str) -> str | None:
        """Why *key*'s tree may make no more model requests (its hard cap reached), or None."""
        if self.policy.tree.empty:
            return None
        root = self.tree_of(key)
        tree = self.tree(root)
        # From the totals too: a supervisor restored from the journal has not seen the
        # crossing, and a spent tree must stay spent.
        what = self.policy.tree.reached("hard", tree["tokens"], tree["cost_usd"])
        if not what and "hard" not in self.tree_reached.get(root, set()):
            return None
        return f"tree {root} budget spent ({what or 'hard limit reached'})"

    def session_refusal(self) -> str | None:
        """Why no new turn may start (the session's hard limit is reached), or None."""
        if "hard" not in self.session_reached:
            return None
        session = self.session()
        what = self.policy.session.reached("hard", session["tokens"], session["cost_usd"])
        return (
            f"session budget spent ({what or 'hard limit reached'}): no new turns "
            "(raise subagents.budget.session and restart the supervisor)"
        )

    def report(self, keys: Collection[str] = ()) -> dict[str, Any]:
        """``fleet usage --json``: the session, each child (only *keys*, when given) and each
        agent definition."""
        definitions: dict[str, list[Account]] = {}
        for account in self.accounts.values():
            definitions.setdefault(account.agent, []).append(account)
        totals = self.session()
        totals["spawns"] = totals["children"]
        session = totals | {
            "budget": self.policy.session.as_json(),
            "left": _left_of(self.policy.session, totals),
            "reached": sorted(self.session_reached),
        }
        roots = list(dict.fromkeys(a.tree for a in self.accounts.values()))
        trees = []
        for root in roots:
            members = self.members(root)
            if keys and not any(a.key in keys for a in members):
                continue
            tree = self.tree(root)
            trees.append(
                {"key": root}
                | tree
                | {
                    "members": [a.key for a in members],
                    "budget": self.policy.tree.as_json(),
                    "left": _left_of(self.policy.tree, tree),
                    "reached": sorted(self.tree_reached.get(root, set())),
                }
            )
        return {
            "session": session,
            "trees": trees,
            "agents": [
                {"key": key, "agent": a.agent} | a.as_json(self.spawns_of(key))
                for key, a in self.accounts.items()
                if not keys or key in keys
            ],
            "definitions": {name: _sum(group) for name, group in sorted(definitions.items())},
        }


def _left_of(limit: Limit, total: dict[str, Any]) -> dict[str, float | int]:
    return left(limit, total["tokens"], total["cost_usd"], total["spawns"], total["turns"])
