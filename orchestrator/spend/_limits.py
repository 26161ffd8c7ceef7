"""Usage budgets: limits, prices and how a spawn may change a limit (issue 18, item 1; caps 37.3).

A :class:`Limit` is a soft/hard pair in tokens, US dollars, spawns and/or turns; any of the
eight may be absent (no limit). One limit type serves every scope: a child (``child``,
``agents.NAME``), a tree (``tree``: one top-level child and all its descendants) and the
session (``session``). The configuration (``subagents.budget`` and ``subagents.prices``) is parsed
and validated as a whole by :func:`parse_policy`: every value a non-negative number, soft below
hard, unknown keys refused — each problem one :class:`UsageError` line. A spawn (and a
definition, and a nested spawn) may only *lower* the limit it would get: :func:`lower` refuses
a raise with one :class:`PolicyError` line, :func:`clamp` silently takes the lower of two.
The accounting itself is :mod:`orchestrator.spend._ledger`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Literal

import attrs

from orchestrator._errors import PolicyError, UsageError

Level = Literal["soft", "hard"]
Unit = Literal["tokens", "usd", "spawns", "turns"]
UNITS: Final[tuple[Unit, ...]] = ("tokens", "usd", "spawns", "turns")
#: The units counted in whole numbers (dollars are not).
WHOLE: Final = ("tokens", "spawns", "turns")
LIMIT_KEYS: Final = (
    "soft_tokens",
    "hard_tokens",
    "soft_usd",
    "hard_usd",
    "soft_spawns",
    "hard_spawns",
    "soft_turns",
    "hard_turns",
)
PRICE_KEYS: Final = ("input", "output", "cache_read", "cache_write")
POLICY_KEYS: Final = ("session", "tree", "child", "agents")
_PER_TOKEN: Final = 1e-6  # prices are US dollars per million tokens


def _amount(where: str, key: str, value: object, *, whole: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{where}: {key} {value!r} must be a number")
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{where}: {key} {value!r} must be a finite number >= 0")
    if whole:
        if value != int(value):
            raise UsageError(f"{where}: {key} {value!r} must be a whole number")
        return int(value)
    return float(value)


def _mapping(where: str, value: object, known: tuple[str, ...]) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} must be a mapping of {', '.join(known)}")
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (one of {', '.join(known)})")
    return value


@attrs.frozen(kw_only=True)
class Limit:
    """A soft/hard pair in tokens, dollars, spawns and turns; ``None``: no limit of that kind."""

    soft_tokens: int | None = None
    hard_tokens: int | None = None
    soft_usd: float | None = None
    hard_usd: float | None = None
    #: Children spawned: by a child (its own nested spawns), in a tree (its nested children),
    #: in the session (every child).
    soft_spawns: int | None = None
    hard_spawns: int | None = None
    #: Turns the supervisor admitted: a spawn's task, each prompt, ask and revive.
    soft_turns: int | None = None
    hard_turns: int | None = None

    def check(self, where: str) -> Limit:
        """This limit, or one :class:`UsageError` line when a soft is not below its hard."""
        for unit in UNITS:
            soft, hard = getattr(self, f"soft_{unit}"), getattr(self, f"hard_{unit}")
            if soft is not None and hard is not None and soft >= hard:
                raise UsageError(
                    f"{where}: soft_{unit} {soft:g} must be below hard_{unit} {hard:g}"
                )
        return self

    def as_json(self) -> dict[str, float | int]:
        return {key: value for key in LIMIT_KEYS if (value := getattr(self, key)) is not None}

    @property
    def empty(self) -> bool:
        return not self.as_json()

    def reached(self, level: Level, tokens: int, cost: float | None) -> str:
        """What of *level* is reached at *tokens* / *cost* (``"50000 of 50000 tokens"``), or ""."""
        limit_tokens = getattr(self, f"{level}_tokens")
        limit_usd = getattr(self, f"{level}_usd")
        if limit_tokens is not None and tokens >= limit_tokens:
            return f"{tokens} of {limit_tokens} tokens"
        if limit_usd is not None and cost is not None and cost >= limit_usd:
            return f"${cost:.4f} of ${limit_usd:g}"
        return ""

    def allows(self, unit: Unit, count: int, more: int = 1) -> str:
        """Why *more* of *unit* may not be added to *count* (``"3 of 3 spawns"``), or ""."""
        hard = getattr(self, f"hard_{unit}")
        if hard is not None and count + more > hard:
            return f"{count} of {hard} {unit}" + (f" (+{more} asked)" if more > 1 else "")
        return ""


NO_LIMIT: Final = Limit()


def parse_limit(value: object, where: str) -> Limit:
    """A :class:`Limit` from a mapping of :data:`LIMIT_KEYS` (``None``: no limit)."""
    if value is None or isinstance(value, Limit):
        return (value or NO_LIMIT).check(where)
    data = _mapping(where, value, LIMIT_KEYS)
    fields = {
        key: _amount(where, key, data[key], whole=key.endswith(WHOLE))
        for key in LIMIT_KEYS
        if key in data and data[key] is not None
    }
    return Limit(**fields).check(where)  # type: ignore[arg-type]


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _consistent(merged: dict[str, float | None], explicit: Limit) -> Limit:
    """A merged limit whose soft fell to or above its lowered hard drops that soft (unless it
    was asked for explicitly, which :meth:`Limit.check` then refuses)."""
    for unit in UNITS:
        soft, hard = merged[f"soft_{unit}"], merged[f"hard_{unit}"]
        inverted = soft is not None and hard is not None and soft >= hard
        if inverted and getattr(explicit, f"soft_{unit}") is None:
            merged[f"soft_{unit}"] = None
    return Limit(**merged)  # type: ignore[arg-type]


def lower(configured: Limit, requested: Limit | None, where: str = "spawn") -> Limit:
    """*configured* lowered by *requested*: any value above its configured one is a raise,
    refused with one :class:`PolicyError` line; a value where none is configured sets it."""
    if requested is None or requested.empty:
        return configured
    for key in LIMIT_KEYS:
        mine, theirs = getattr(configured, key), getattr(requested, key)
        if mine is not None and theirs is not None and theirs > mine:
            raise PolicyError(
                f"{where}: budget {key} {theirs:g} is above the configured {mine:g} "
                "(a spawn may lower a budget, never raise it)"
            )
    merged = {key: _min(getattr(configured, key), getattr(requested, key)) for key in LIMIT_KEYS}
    return _consistent(merged, requested).check(where)


def clamp(limit: Limit, cap: Limit | None) -> Limit:
    """The lower of *limit* and *cap*, value by value (no error: a cap the caller holds)."""
    if cap is None or cap.empty:
        return limit
    merged = {key: _min(getattr(limit, key), getattr(cap, key)) for key in LIMIT_KEYS}
    return _consistent(merged, NO_LIMIT)


@attrs.frozen(kw_only=True)
class Price:
    """US dollars per million tokens of each kind."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0

    def cost(self, *, input: int, output: int, cache_read: int, cache_write: int) -> float:  # noqa: A002
        return _PER_TOKEN * (
            input * self.input
            + output * self.output
            + cache_read * self.cache_read
            + cache_write * self.cache_write
        )


@attrs.frozen(kw_only=True)
class SpendPolicy:
    """The configured budgets and the price table, validated as a whole."""

    session: Limit = NO_LIMIT
    #: Every tree's cap: one top-level child and all its descendants together.
    tree: Limit = NO_LIMIT
    child: Limit = NO_LIMIT
    agents: Mapping[str, Limit] = attrs.Factory(dict)
    prices: Mapping[str, Price] = attrs.Factory(dict)

    def price_for(self, model: str) -> Price | None:
        """The price of *model*: its own entry, else that of its name after ``provider/``."""
        if not model:
            return None
        return self.prices.get(model) or self.prices.get(model.rpartition("/")[2])

    def configured(self, agent: str) -> Limit:
        """The limit a child of *agent* gets before any spawn lowers it."""
        return self.agents.get(agent, self.child)


def _parse_prices(value: object) -> dict[str, Price]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError("subagents.prices must be a mapping of model name to prices")
    prices = {}
    for model, entry in value.items():
        where = f"subagents.prices.{model}"
        data = _mapping(where, entry, PRICE_KEYS)
        prices[str(model)] = Price(
            **{key: float(_amount(where, key, data[key], whole=False)) for key in data}
        )
    return prices


def parse_policy(budget: object, prices: object = None) -> SpendPolicy:
    """``subagents.budget`` and ``subagents.prices`` as one policy, or one UsageError line."""
    table = _parse_prices(prices)
    if budget is None:
        return SpendPolicy(prices=table)
    data = _mapping("subagents.budget", budget, POLICY_KEYS)
    agents_value = data.get("agents") or {}
    if not isinstance(agents_value, Mapping):
        raise UsageError("subagents.budget.agents must be a mapping of agent name to a budget")
    child = parse_limit(data.get("child"), "subagents.budget.child")
    return SpendPolicy(
        session=parse_limit(data.get("session"), "subagents.budget.session"),
        tree=parse_limit(data.get("tree"), "subagents.budget.tree"),
        child=child,
        agents={
            str(name): parse_limit(entry, f"subagents.budget.agents.{name}")
            for name, entry in agents_value.items()
        },
        prices=table,
    )


def resolve_limit(
    policy: SpendPolicy,
    agent: str,
    *,
    definition: Limit | None = None,
    requested: Limit | None = None,
    parent: Limit | None = None,
) -> Limit:
    """A new child's limit: the configured one for *agent*, capped by its *definition*'s,
    lowered by the spawn's *requested* one (a raise is refused), and capped by the *parent*'s
    limit for a nested spawn, so a child can never hand a grandchild more than it holds."""
    limit = clamp(policy.configured(agent), definition)
    limit = lower(limit, requested, f"spawn {agent}")
    return clamp(limit, parent)
