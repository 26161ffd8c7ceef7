"""Each backend's usage records as one cumulative :class:`ipc.Usage` for the child's life.

``input_tokens`` is uncached input only (OpenAI-style counts that include cached input are
split); cache reads and writes are their own. A backend's own cost is kept when it reports one
(the supervisor prices the tokens otherwise).
"""

import math
from collections.abc import Mapping
from typing import Any

import ipc

__all__ = ["accumulate", "claude_usage", "codex_usage", "openai_usage", "pi_usage"]


def _count(usage: object, key: str) -> int:
    value = usage.get(key) if isinstance(usage, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return 0
    return int(value)


def _number(value: object) -> float | None:
    """A cost as reported: a finite number >= 0, else None (a model may report nonsense; a
    negative cost would unspend the child's budget)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _add(prior: ipc.Usage, **step: Any) -> ipc.Usage:
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    added = {name: getattr(prior, name) + step.get(name, 0) for name in counts}
    return ipc.Usage(
        tokens=prior.tokens + step.get("tokens", 0),
        cost_usd=step.get("cost_usd", prior.cost_usd),
        model=step.get("model") or prior.model,
        **added,
    )


def claude_usage(prior: ipc.Usage, record: Mapping[str, Any]) -> ipc.Usage:
    """*prior* plus a Claude ``result`` record: its ``usage`` is the turn's, its
    ``total_cost_usd`` the CLI's own cumulative cost (it replaces the prior one)."""
    usage = _mapping(record.get("usage"))
    models = record.get("modelUsage")
    new_in, new_out = _count(usage, "input_tokens"), _count(usage, "output_tokens")
    cost = _number(record.get("total_cost_usd"))
    return _add(
        prior,
        tokens=new_in + new_out,
        input_tokens=new_in,
        output_tokens=new_out,
        cache_read_tokens=_count(usage, "cache_read_input_tokens"),
        cache_write_tokens=_count(usage, "cache_creation_input_tokens"),
        cost_usd=prior.cost_usd if cost is None else cost,
        model=str(next(iter(models), "")) if isinstance(models, Mapping) else "",
    )


def pi_usage(prior: ipc.Usage, message: Mapping[str, Any]) -> ipc.Usage:
    """*prior* plus one Pi assistant message: ``usage`` input/output/cacheRead/cacheWrite and
    ``cost.total`` are that message's, so both add up."""
    usage = _mapping(message.get("usage"))
    step = _number(_mapping(usage.get("cost")).get("total"))
    cost = prior.cost_usd if step is None else round((prior.cost_usd or 0.0) + step, 6)
    return _add(
        prior,
        tokens=_count(usage, "totalTokens"),
        input_tokens=_count(usage, "input"),
        output_tokens=_count(usage, "output"),
        cache_read_tokens=_count(usage, "cacheRead"),
        cache_write_tokens=_count(usage, "cacheWrite"),
        cost_usd=cost,
        model=str(message.get("model") or ""),
    )


def codex_usage(prior: ipc.Usage, token_usage: Mapping[str, Any]) -> ipc.Usage:
    """A Codex ``thread/tokenUsage/updated`` ``tokenUsage``: its ``total`` is cumulative
    already (it replaces the prior counts); ``inputTokens`` includes the cached ones."""
    total = _mapping(token_usage.get("total"))
    cached = _count(total, "cachedInputTokens")
    return ipc.Usage(
        tokens=_count(total, "totalTokens"),
        cost_usd=prior.cost_usd,
        input_tokens=max(0, _count(total, "inputTokens") - cached),
        output_tokens=_count(total, "outputTokens"),
        cache_read_tokens=cached,
        model=prior.model,
    )


def openai_usage(usage: Mapping[str, Any], model: str = "") -> ipc.Usage:
    """One OpenAI chat-completions ``usage`` (a step's, not cumulative): ``prompt_tokens``
    includes ``prompt_tokens_details.cached_tokens``; ``cost`` when a gateway reports one."""
    prompt, completion = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
    cached = min(prompt, _count(_mapping(usage.get("prompt_tokens_details")), "cached_tokens"))
    total = _count(usage, "total_tokens") or prompt + completion
    return ipc.Usage(
        tokens=total,
        cost_usd=_number(usage.get("cost")),
        input_tokens=prompt - cached,
        output_tokens=completion,
        cache_read_tokens=cached,
        model=model,
    )


def accumulate(prior: ipc.Usage, step: ipc.Usage) -> ipc.Usage:
    """*prior* plus one model step's usage (the builtin loop): counts and step costs add up."""
    cost = prior.cost_usd
    if step.cost_usd is not None:
        cost = round((cost or 0.0) + step.cost_usd, 6)
    return _add(
        prior,
        tokens=step.tokens,
        input_tokens=step.input_tokens,
        output_tokens=step.output_tokens,
        cache_read_tokens=step.cache_read_tokens,
        cache_write_tokens=step.cache_write_tokens,
        cost_usd=cost,
        model=step.model,
    )
