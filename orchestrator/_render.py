"""Human output: tables and lines for the CLI (``--json`` bypasses all of this)."""

from collections.abc import Mapping, Sequence
from typing import Any


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


def peek_table(data: Mapping[str, Any], *, width: int = 120) -> str:
    lane = data["lane"]
    head = (
        f"session {data['session']} · mode {data['mode']} · cap {data['cap']} · lane "
        f"{lane['working']}/{lane['capacity']} working, {lane['queued']} queued"
    )
    rows = [
        [
            a["key"],
            a["name"],
            a["agent"],
            a["state"] + (" (queued)" if a.get("queued") else ""),
            _progress(a["progress"]),
            f"{a['last_event_age_s']:.0f}s",
            a["activity"],
        ]
        for a in data["agents"]
    ]
    if not rows:
        return f"{head}\nno live children"
    body = table(["KEY", "NAME", "AGENT", "STATE", "DONE", "AGE", "ACTIVITY"], rows, width=width)
    extra = [f"{q['id']} from {q['key']}: {q['text']}" for q in data.get("questions", [])]
    extra += [f"lock {owner}: {', '.join(specs)}" for owner, specs in data.get("locks", {}).items()]
    return "\n".join([head, body, *extra])


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


def handoff_text(handoffs: Sequence[Mapping[str, Any]]) -> str:
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
        if h.get("last"):
            parts.append(h["last"].rstrip())
    return "\n".join(parts)
