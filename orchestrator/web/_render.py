"""What the pages draw from control replies: the fleet's order, diffs, the usage chart.

Everything a child wrote reaches the page escaped: Pygments escapes the diff it highlights, the
SVG chart escapes its labels, and the templates autoescape the rest.
"""

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import markupsafe
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer

#: Who needs the person first: a child waiting for an answer, then the busy, then the rest.
ORDER: Final = {"waiting": 0, "working": 1, "starting": 2, "paused": 3, "idle": 4}
_FORMATTER: Final = HtmlFormatter(nowrap=True, classprefix="hl-")


def fleet_order(agents: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """*agents* with waiting children first (a pending question counts), then by state, key."""

    def rank(agent: Mapping[str, Any]) -> tuple[int, int, str]:
        state = "waiting" if agent.get("question") else str(agent.get("state"))
        key = str(agent.get("key", ""))
        number = int(key[1:]) if key[1:].isdigit() else 0
        return ORDER.get(state, 5), number, key

    return sorted(agents, key=rank)


def age(seconds: float | None) -> str:
    """``42s``, ``3m``, ``2h``: how long ago, in a few characters."""
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def since(at: float | None) -> float | None:
    return None if at is None else time.time() - at


def highlighted_diff(text: str) -> markupsafe.Markup:
    """A unified diff as escaped HTML spans (Pygments escapes every character it is given)."""
    return markupsafe.Markup(highlight(text, DiffLexer(), _FORMATTER))  # noqa: S704 - escaped


def highlight_css() -> str:
    return str(_FORMATTER.get_style_defs(".diff"))  # type: ignore[no-untyped-call]


def budget_of(usage: Mapping[str, Any]) -> str:
    """``1200 / 50000 tokens`` or ``$0.12 / $1.00``: spend against the tightest hard limit."""
    budget = usage.get("budget") or {}
    tokens = usage.get("tokens", 0)
    cost = usage.get("cost_usd")
    if "hard_tokens" in budget:
        return f"{tokens} / {budget['hard_tokens']} tokens"
    if "hard_usd" in budget:
        return f"${cost or 0:.2f} / ${budget['hard_usd']:.2f}"
    cost_text = f", ${cost:.4f}" if isinstance(cost, int | float) else ""
    return f"{tokens} tokens{cost_text}"


def model_of(agent: Mapping[str, Any], spawned: Mapping[str, Any] | None) -> str:
    models = agent.get("models") or []
    if models:
        return str(models[-1])
    model = (spawned or {}).get("model")
    if isinstance(model, Mapping):
        return str(model.get("name") or model.get("kind") or "")
    return str(model or (agent.get("usage") or {}).get("model") or "")


BAR_HEIGHT: Final = 22
LABEL_WIDTH: Final = 140
CHART_WIDTH: Final = 640


def bar_chart(rows: Sequence[tuple[str, float, str]]) -> markupsafe.Markup:
    """A horizontal bar chart as inline SVG: one bar per (label, value, caption)."""
    if not rows:
        return markupsafe.Markup("<p class='muted'>no usage yet</p>")
    top = max(value for _, value, _ in rows) or 1.0
    span = CHART_WIDTH - LABEL_WIDTH - 160
    height = BAR_HEIGHT * len(rows) + 8
    parts = [
        markupsafe.Markup(
            '<svg class="chart" role="img" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
        ).format(w=CHART_WIDTH, h=height)
    ]
    for index, (label, value, caption) in enumerate(rows):
        y = index * BAR_HEIGHT + 4
        width = max(1, round(span * value / top))
        parts.append(
            markupsafe.Markup(
                '<text x="0" y="{ty}" class="label">{label}</text>'
                '<rect x="{x}" y="{y}" width="{width}" height="{bh}" class="bar"></rect>'
                '<text x="{cx}" y="{ty}" class="caption">{caption}</text>'
            ).format(
                ty=y + BAR_HEIGHT - 8,
                label=label,
                x=LABEL_WIDTH,
                y=y,
                width=width,
                bh=BAR_HEIGHT - 6,
                cx=LABEL_WIDTH + width + 6,
                caption=caption,
            )
        )
    parts.append(markupsafe.Markup("</svg>"))
    return markupsafe.Markup("").join(parts)


def usage_rows(entries: Iterable[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, float, str]]:
    rows = []
    for label, usage in entries:
        tokens = float(usage.get("tokens") or 0)
        cost = usage.get("cost_usd")
        caption = f"{int(tokens)} tokens" + (
            f" · ${cost:.4f}" if isinstance(cost, int | float) else ""
        )
        rows.append((label, tokens, caption))
    return rows


def line_chart(points: Sequence[tuple[float, float]]) -> markupsafe.Markup:
    """The session's tokens over time (seconds since the first point) as an inline SVG line."""
    if len(points) < 2:
        return markupsafe.Markup("<p class='muted'>not enough samples yet</p>")
    start, end = points[0][0], points[-1][0]
    top = max(value for _, value in points) or 1.0
    width, height, pad = CHART_WIDTH, 160, 30
    span = (end - start) or 1.0
    coordinates = " ".join(
        f"{pad + (width - 2 * pad) * (at - start) / span:.1f},"
        f"{height - pad - (height - 2 * pad) * value / top:.1f}"
        for at, value in points
    )
    return markupsafe.Markup(
        '<svg class="chart line" role="img" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
        '<polyline points="{c}" class="line"></polyline>'
        '<text x="{pad}" y="{top_y}" class="caption">{top:.0f} tokens</text>'
        '<text x="{pad}" y="{bottom_y}" class="caption">{age} ago</text>'
        '<text x="{right}" y="{bottom_y}" class="caption" text-anchor="end">now</text>'
        "</svg>"
    ).format(
        w=width,
        h=height,
        c=coordinates,
        pad=pad,
        top_y=pad - 10,
        top=top,
        bottom_y=height - 8,
        age=age(time.time() - start),
        right=width - pad,
    )
