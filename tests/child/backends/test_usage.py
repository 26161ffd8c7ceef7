"""Each backend's usage records mapped to one cumulative ipc.Usage (the records as the CLIs
write them; the end-to-end mapping runs against the real CLIs in test_claude/test_pi/...)."""

import ipc
from child.backends._usage import accumulate, claude_usage, codex_usage, openai_usage, pi_usage


def test_claude_adds_each_result_and_keeps_the_cli_cumulative_cost():
    first = {
        "usage": {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 40,
        },
        "total_cost_usd": 0.01,
        "modelUsage": {"claude-sonnet-4-5": {}},
    }
    second = {"usage": {"input_tokens": 1, "output_tokens": 2}, "total_cost_usd": 0.03}
    usage = claude_usage(claude_usage(ipc.Usage(), first), second)
    assert usage == ipc.Usage(
        tokens=18,
        cost_usd=0.03,
        input_tokens=11,
        output_tokens=7,
        cache_read_tokens=100,
        cache_write_tokens=40,
        model="claude-sonnet-4-5",
    )
    # a result without a cost keeps the last one; junk counts are no counts
    same = claude_usage(usage, {"usage": {"input_tokens": "many"}})
    assert (same.tokens, same.cost_usd) == (18, 0.03)


def test_pi_adds_each_message_and_its_cost():
    message = {
        "usage": {
            "input": 50,
            "output": 10,
            "cacheRead": 7,
            "cacheWrite": 3,
            "totalTokens": 70,
            "cost": {"total": 0.002},
        },
        "model": "gpt-test",
    }
    usage = pi_usage(pi_usage(ipc.Usage(), message), message)
    assert usage == ipc.Usage(
        tokens=140,
        cost_usd=0.004,
        input_tokens=100,
        output_tokens=20,
        cache_read_tokens=14,
        cache_write_tokens=6,
        model="gpt-test",
    )
    # no cost reported: unknown, so the supervisor prices the tokens
    assert pi_usage(ipc.Usage(), {"usage": {"totalTokens": 5}}).cost_usd is None


def test_codex_total_replaces_and_splits_the_cached_input():
    record = {
        "total": {
            "inputTokens": 300,
            "cachedInputTokens": 120,
            "outputTokens": 30,
            "totalTokens": 330,
        }
    }
    usage = codex_usage(ipc.Usage(tokens=5, model="o4"), record)
    assert usage == ipc.Usage(
        tokens=330, input_tokens=180, output_tokens=30, cache_read_tokens=120, model="o4"
    )


def test_openai_step_and_the_builtin_loop_accumulates_costs():
    step = openai_usage(
        {
            "prompt_tokens": 90,
            "completion_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 40},
            "cost": 0.5,
        },
        "m",
    )
    assert step == ipc.Usage(
        tokens=100, cost_usd=0.5, input_tokens=50, output_tokens=10, cache_read_tokens=40, model="m"
    )
    # The builtin loop's fix: each step's cost is that step's, so the child's total adds them.
    total = accumulate(accumulate(ipc.Usage(), step), step)
    assert (total.tokens, total.cost_usd, total.cache_read_tokens) == (200, 1.0, 80)
    without_cost = accumulate(ipc.Usage(), ipc.Usage(tokens=3))
    assert without_cost.cost_usd is None
