"""Human output: tables and lines for the CLI (``--json`` bypasses all of this)."""

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TextIO

TERMINAL_STATES: Final = frozenset({"stopped", "failed"})


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, width: int = 120) -> str:
    """A plain left-aligned table; the last column is cut to fit *width*."""
    if not rows:
        return ""
    cells = [list(headers), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers) - 1)]
    lines = []
    for row in cells:
        head = "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=False))
        line = f"{head}  {row[-1]}" if head else row[-1]
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return "\n".join(lines)


def _progress(progress: Mapping[str, Any]) -> str:
    return f"{progress['done']}/{progress['total']}" if progress.get("total") else "-"


def _head(data: Mapping[str, Any]) -> str:
    lane = data["lane"]
    return (
        f"session {data['session']} · mode {data['mode']} · cap {data['cap']} · lane "
        f"{lane['working']}/{lane['capacity']} working, {lane['queued']} queued"
    )


def waiting_first(agents: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """*agents* with those asking the parent a question (``waiting``) first, else in order."""
    return sorted(agents, key=lambda a: a["state"] != "waiting")


def _revive_hint(stale: dict[str, Any]) -> str:
    """How a lost child comes back, or why it cannot (the journal's verdict)."""
    if stale.get("revivable"):
        return f"; fleet revive {stale['key']} brings it back"
    return f"; not revivable: {stale['revive']}" if stale.get("revive") else ""


def peek_table(data: Mapping[str, Any], *, width: int = 120) -> str:
    head = _head(data)
    rows = [
        [
            a["key"],
            a["name"],
            a["agent"],
            # A child launched under another workflow mode keeps that mode's toolset.
            _state(a)
            + (
                f" [{a['workflow_mode']}]"
                if a.get("workflow_mode", data["mode"]) != data["mode"]
                else ""
            ),
            _progress(a["progress"]),
            f"{a['last_event_age_s']:.0f}s",
            _activity(a),
        ]
        for a in waiting_first(data["agents"])
    ]
    stale = [
        f"stale {s['key']} {s['name']} ({s['state']}, pid {s['pid']}): log {s['log']}"
        + (f", worktree {s['worktree']}" if s.get("worktree") else "")
        + _revive_hint(s)
        for s in data.get("stale", [])
    ]
    if not rows:
        return "\n".join([head, "no live children", *stale])
    body = table(["KEY", "NAME", "AGENT", "STATE", "DONE", "AGE", "ACTIVITY"], rows, width=width)
    extra = [f"{q['id']} from {q['key']}: {q['text']}" for q in data.get("questions", [])]
    extra += [f"lock {owner}: {', '.join(specs)}" for owner, specs in data.get("locks", {}).items()]
    extra += [line for a in data["agents"] if (line := _usage_line(a))]
    extra += [
        f"held {a['key']}: {a['held']} file(s) wait for a person (fleet diff {a['key']})"
        for a in data["agents"]
        if a.get("held")
    ]
    return "\n".join([head, body, *extra, *stale])


def _usage_line(agent: Mapping[str, Any]) -> str:
    """``usage a1: 120 tokens (in 100, out 20, cache 0/0) $0.0004 · budget hard 5000 tok``;
    "" for a child that has used nothing and has no budget."""
    usage = agent.get("usage") or {}
    budget = usage.get("budget") or {}
    if not usage.get("tokens") and not budget:
        return ""
    counts = ""
    if "input_tokens" in usage:
        counts = (
            f" (in {usage['input_tokens']}, out {usage['output_tokens']}, cache "
            f"{usage['cache_read_tokens']}/{usage['cache_write_tokens']})"
        )
    reached = usage.get("reached") or []
    return (
        f"usage {agent['key']}: {usage.get('tokens', 0)} tokens{counts} "
        f"{_money(usage.get('cost_usd'))} · budget {_limit(budget)}"
        + (f" (reached {'+'.join(reached)})" if reached else "")
    )


def _money(cost: float | None) -> str:
    return "-" if cost is None else f"${cost:.4f}"


def _limit(budget: Mapping[str, Any]) -> str:
    """``soft 800 tok, hard 1000 tok $2 3 spawns 20 turns`` (``-``: no budget)."""
    parts = []
    for level in ("soft", "hard"):
        words = _amounts({k.partition("_")[2]: v for k, v in budget.items() if k.startswith(level)})
        if words:
            parts.append(f"{level} {words}")
    return ", ".join(parts) or "-"


def _amounts(values: Mapping[str, Any]) -> str:
    """``1000 tok $2 3 spawns 20 turns`` of a mapping of unit to amount."""
    words = [f"{values['tokens']} tok"] if values.get("tokens") is not None else []
    words += [f"${values['usd']:g}"] if values.get("usd") is not None else []
    words += [f"{values[u]} {u}" for u in ("spawns", "turns") if values.get(u) is not None]
    return " ".join(words)


def _left(left: Mapping[str, Any]) -> str:
    """`` · left 20 tok 1 spawns`` (the hard caps' remainder; "" with no hard cap)."""
    words = _amounts({k.partition("_")[2]: v for k, v in left.items() if k.startswith("hard")})
    return f" · left {words}" if words else ""


def _reached(reached: Sequence[str]) -> str:
    return f" (reached {'+'.join(reached)})" if reached else ""


def usage_table(data: Mapping[str, Any]) -> str:
    """``fleet usage``: one row per child, then the definitions and the session."""
    rows = [
        [
            a["key"],
            a["agent"],
            str(a["tokens"]),
            str(a["input_tokens"]),
            str(a["output_tokens"]),
            f"{a['cache_read_tokens']}/{a['cache_write_tokens']}",
            _money(a["cost_usd"]),
            str(a.get("turns", 0)),
            _limit(a["budget"]) + _reached(a["reached"]),
        ]
        for a in data["agents"]
    ]
    headers = ["KEY", "AGENT", "TOKENS", "IN", "OUT", "CACHE R/W", "COST", "TURNS", "BUDGET"]
    body = table(headers, rows) if rows else "no children yet"
    definitions = [
        f"{name}: {d['tokens']} tokens, {_money(d['cost_usd'])} over {d['children']} children"
        for name, d in data["definitions"].items()
    ]
    trees = [
        f"tree {t['key']} ({t['children']} children): {t['tokens']} tokens, "
        f"{_money(t['cost_usd'])}, {t['spawns']} spawns, {t['turns']} turns, "
        f"cap {_limit(t['budget'])}{_left(t['left'])}{_reached(t['reached'])}"
        for t in data.get("trees", ())
        if t["budget"] or t["children"] > 1
    ]
    session = data["session"]
    line = (
        f"session: {session['tokens']} tokens, {_money(session['cost_usd'])}, "
        f"{session.get('spawns', 0)} spawns, {session.get('turns', 0)} turns, "
        f"budget {_limit(session['budget'])}{_left(session.get('left', {}))}"
        f"{_reached(session['reached'])}"
    )
    return "\n".join([body, *definitions, *trees, line])


def _age(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _state(agent: Mapping[str, Any]) -> str:
    from orchestrator._records import shown_state  # noqa: PLC0415 - a --json verb needs none

    state, _ = shown_state(str(agent["state"]), str(agent["activity"]))
    return state + (" (queued)" if agent.get("queued") else "")


def _activity(agent: Mapping[str, Any]) -> str:
    """The activity, unless it only repeats the state (``idle idle``, ``starting starting``)."""
    from orchestrator._records import shown_state  # noqa: PLC0415 - a --json verb needs none

    _, activity = shown_state(str(agent["state"]), str(agent["activity"]))
    return activity


def live_agents(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The entries a live view shows: a child leaves it on reaching a terminal state."""
    return [a for a in data["agents"] if a["state"] not in TERMINAL_STATES]


def fleet_view(data: Mapping[str, Any], *, width: int = 120) -> list[str]:
    """The live fleet table of ``fleet top`` / ``fleet peek --watch``, one string per line."""
    agents = live_agents(data)
    if not agents:
        return [_head(data), "fleet is empty"]
    rows = [
        [
            a["key"],
            a["name"],
            _state(a),
            a["mode"],
            _progress(a["progress"]),
            _age(a["last_event_age_s"]),
            a.get("surface", "process"),
            _activity(a),
        ]
        for a in waiting_first(agents)
    ]
    headers = ["KEY", "NAME", "STATE", "MODE", "DONE", "AGE", "SURFACE", "ACTIVITY"]
    return [_head(data), *table(headers, rows, width=width).splitlines()]


def watch_line(agent: Mapping[str, Any]) -> str:
    """One plain line for a changed entry (the non-TTY live view)."""
    activity = _activity(agent)
    return (
        f"{agent['key']} {agent['name']} {_state(agent)} {agent['mode']} "
        f"{_progress(agent['progress'])} {agent.get('surface', 'process')}"
        + (f": {activity}" if activity else "")
    )


def watch_change(agent: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must differ for the non-TTY view to print a new line (the age does not count)."""
    progress = agent["progress"]
    return (
        agent["state"],
        agent.get("queued"),
        progress.get("done"),
        progress.get("total"),
        agent["activity"],
    )


class LiveScreen:
    """Redraws a block of lines in place on a terminal's alternate screen.

    Each frame rewrites every line and clears what is left, so there is no flicker and no
    stale text; closing restores the normal screen and the cursor.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._open = False

    def draw(self, lines: Sequence[str], *, height: int) -> None:
        if not self._open:
            self._stream.write("\x1b[?1049h\x1b[?25l")
            self._open = True
        shown = list(lines[: max(1, height - 1)])
        if len(lines) > len(shown):
            shown[-1] = f"… {len(lines) - len(shown) + 1} more lines (enlarge the terminal)"
        self._stream.write("\x1b[H" + "".join(f"{line}\x1b[K\r\n" for line in shown) + "\x1b[J")
        self._stream.flush()

    def close(self) -> None:
        if self._open:
            self._stream.write("\x1b[?25h\x1b[?1049l")
            self._stream.flush()
            self._open = False


class ChangeLines:
    """The non-TTY live view: one line per entry that changed or left, text or JSON."""

    def __init__(self, stream: TextIO, *, json_output: bool) -> None:
        self._stream = stream
        self._json = json_output
        self._last: dict[str, tuple[Any, ...]] = {}

    def update(self, agents: Sequence[Mapping[str, Any]]) -> list[str]:
        """Print what changed; return the keys that left the view since the last update."""
        current = {a["key"]: a for a in agents}
        for key, agent in current.items():
            change = watch_change(agent)
            if self._last.get(key) != change:
                self._last[key] = change
                self._emit(agent, left=False)
        gone = [key for key in self._last if key not in current]
        for key in gone:
            del self._last[key]
        return gone

    def left(self, agent: Mapping[str, Any]) -> None:
        """Print *agent*'s final entry (its terminal state) as it leaves the view."""
        self._emit(agent, left=True)

    def _emit(self, agent: Mapping[str, Any], *, left: bool) -> None:
        if self._json:
            line = json.dumps({**agent, "left": left})
        else:
            line = watch_line(agent) + (" (left the fleet)" if left else "")
        self._stream.write(line + "\n")
        self._stream.flush()


def settled_text(notes: Sequence[Mapping[str, Any]]) -> str:
    if not notes:
        return "nothing to wait for (no child is working)"
    parts = []
    for note in notes:
        parts.append(f"── {note['peek']}")
        if "question" in note:
            q = note["question"]
            parts.append(f"question {q['id']}: {q['text']}  (fleet answer {q['id']} TEXT)")
        if note.get("failure"):
            failure = note["failure"]
            parts.append(
                f"failed ({failure['kind']}) via {failure['transport']}: {failure['error']}"
            )
            parts.append(f"log: {failure['log']}")
            if failure.get("tail"):
                parts.append(failure["tail"][-800:])
        elif note.get("error"):
            parts.append(f"error: {note['error']}")
        if note.get("report"):
            parts.append(note["report"].rstrip())
    return "\n".join(parts)


def handoff_text(handoffs: Sequence[Mapping[str, Any]], shown: Callable[[str], str] = str) -> str:
    """Human handoffs; *shown* turns a repository path into the one the user types."""
    parts = []
    for h in handoffs:
        parts.append(f"── {h['key']} {h['name']} {h['state']}")
        if h.get("error"):
            parts.append(f"error: {h['error']}")
        parts += [
            f"{label}: {', '.join(h[label])}"
            for label in ("changed", "applied", "remaining")
            if h.get(label)
        ]
        parts += [f"conflict: {c['path']}: {c['reason']}" for c in h.get("conflicts", [])]
        if h.get("pending"):
            parts.append(f"kept for review: {', '.join(h['pending'])} (fleet apply {h['key']})")
        parts += [
            f"held: {e['path']}: {e['why']} (fleet diff {h['key']} {shown(e['path'])} reviews "
            f"it, fleet apply {h['key']} {shown(e['path'])} lands it)"
            for e in h.get("held", [])
        ]
        if h.get("last"):
            parts.append(h["last"].rstrip())
    return "\n".join(parts)


def render_outcome(data: Mapping[str, Any]) -> str:
    """Human text for an :meth:`Outcome.to_json` mapping (the CLI has only the JSON)."""
    counts = ", ".join(f"{option} {count}" for option, count in data["counts"].items())
    head = f"round {data['round']}: {data['status']}"
    lines = [f"{head} ({counts or 'no valid ballots'}; {data['invited']} invited)"]
    for ballot in data["ballots"]:
        said = (
            f"{ballot['option']}: {ballot['rationale']}" if ballot["option"] else ballot["reason"]
        )
        lines.append(f"  {ballot['voter']} {ballot['status']} {said}")
    if data["status"] == "winner":
        lines.append(f"Recommendation: {data['winner']}. A majority recommends; nothing was done.")
    elif data["status"] == "needs-user":
        lines.append("No strict majority. Leading options, for the user to decide:")
        lines.extend(
            f"  {option['id']} ({option['votes']}): {option['title']}. "
            f"Tradeoffs: {option['tradeoffs']}"
            for option in data["leading"]
        )
    else:
        lines.append(data["reason"])
    return "\n".join(lines)


def spawned_line(agent: Mapping[str, Any]) -> str:
    """``a1 scout-1 (scout) starting``; the mode is named only when it differs from the agent."""
    kind = (
        agent["agent"] if agent["mode"] == agent["agent"] else f"{agent['agent']}, {agent['mode']}"
    )
    return f"{agent['key']} {agent['name']} ({kind}) {agent['state']}"


def agents_text(agents: Sequence[Mapping[str, Any]]) -> str:
    """``fleet agents``: the table, then one line per import warning (docs/agents.md)."""
    rows = [
        [a["name"], a["mode"], a["source"], ",".join(a["tools"]), a["description"]] for a in agents
    ]
    lines = [table(["NAME", "MODE", "SOURCE", "TOOLS", "DESCRIPTION"], rows)]
    lines += [
        f"warning: {a['name']} ({a.get('path') or a['source']}): {warning}"
        for a in agents
        for warning in a.get("warnings", [])
    ]
    return "\n".join(line for line in lines if line)
