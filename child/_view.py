"""The in-pane activity view: what a child in a tmux window or cmux surface shows a person.

A full-screen live view, redrawn at most every :data:`REDRAW_INTERVAL` seconds (and once a
second for the clock): who the child is, its state and turn, the task, the current tool and its
arguments, the text the model is streaming, the checklist (done/total, the current item, the next
ones), usage, the last few finished steps, and the last report. The runtime feeds it the same
events it sends to the supervisor (:meth:`ActivityView.on_event`) plus turn starts and settled
results.

It draws on the terminal's alternate screen, repainting the whole screen each time, so a window
resized by an attaching client never leaves torn frames behind. When the view stops, the last
frame is printed once more on the normal screen, where it stays in the scrollback (and in a dead
pane's screen). A child killed outright leaves its last frame on the alternate screen instead.

Nothing else may write to the terminal while the view is live: the child's logging and stray
writes to ``sys.stdout``/``sys.stderr`` become the view's log rows for as long as it runs. A
traceback of a crash is printed after the view stops, where it stays readable — and where a failed
run's screen capture finds it.

The view shows only what the child already knows and reports: never the loadout's token.
"""

import collections
import contextlib
import io
import logging
import sys
import time
from collections.abc import Iterator
from typing import Final, TextIO

import attrs
import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import ipc

REDRAW_INTERVAL: Final = 0.25
CLOCK_INTERVAL: Final = 1.0
RECENT_STEPS: Final = 6
LOG_LINES: Final = 3
TEXT_TAIL: Final = 600
REPORT_LINES: Final = 40


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


class _ViewWriter(io.TextIOBase):
    """Stands in for ``sys.stdout``/``sys.stderr`` while the view runs: lines become log rows."""

    def __init__(self, view: "ActivityView") -> None:
        self.view = view
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if line.strip():
                self.view.log_line(line)
        return len(text)


class _ViewHandler(logging.Handler):
    def __init__(self, view: "ActivityView") -> None:
        super().__init__()
        self.view = view
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.view.log_line(self.format(record))


@attrs.define(eq=False)
class ActivityView:
    """One child's live panel; see the module docstring."""

    title: str
    key: str
    console: Console
    state: str = "starting"
    turn: int = 0
    side: bool = False
    task: str = ""
    tool: str = ""
    tool_args: str = ""
    tool_status: str = ""
    text: str = ""
    progress: ipc.Progress | None = None
    tokens: int = 0
    cost_usd: float | None = None
    steer: str = ""
    report: str = ""
    report_label: str = ""
    recent: collections.deque[str] = attrs.Factory(lambda: collections.deque(maxlen=RECENT_STEPS))
    logs: collections.deque[str] = attrs.Factory(lambda: collections.deque(maxlen=LOG_LINES))
    _started: float = attrs.Factory(time.monotonic)
    _turn_started: float = attrs.Factory(time.monotonic)
    _turn_ended: float | None = None
    _dirty: trio.Event = attrs.Factory(trio.Event)

    @classmethod
    def for_loadout(cls, loadout: ipc.Loadout, stream: TextIO) -> "ActivityView":
        title = f"{loadout.owner} · {loadout.name} · {loadout.agent} ({loadout.mode})"
        return cls(title=title, key=loadout.owner, console=Console(file=stream, highlight=False))

    # -- inputs ---------------------------------------------------------------------------

    def on_turn(self, turn: int, text: str, *, side: bool) -> None:
        self.turn, self.side = turn, side
        self.state = "answering a side question" if side else "working"
        self.task = text.strip().splitlines()[0] if text.strip() else ""
        self.tool = self.tool_args = self.tool_status = self.text = self.steer = ""
        self._turn_started = time.monotonic()
        self._turn_ended = None
        self._changed()

    def on_steer(self, text: str) -> None:
        self.steer = text
        self._changed()

    def on_event(self, event: ipc.Event) -> None:
        activity = event.activity
        if activity == "tool_start":
            self.tool, self.tool_args, self.tool_status = event.tool, event.text, "running"
        elif activity == "tool_update":
            self.tool_args = event.text or self.tool_args
        elif activity == "tool_end":
            self.tool_status = event.text or "done"
            mark = "✗" if self.tool_status == "error" else "✓"
            stamp = time.strftime("%H:%M:%S")
            self.recent.append(f"{stamp} {mark} {event.tool} {_clip(self.tool_args, 60)}")
        elif activity == "message":
            self.text = event.text[-TEXT_TAIL:]
        elif activity == "status" and event.text:
            self.state = event.text
        if event.progress is not None:
            self.progress = event.progress
        if event.usage is not None:
            self.tokens = event.usage.tokens
            if event.usage.cost_usd is not None:
                self.cost_usd = event.usage.cost_usd
        self._changed()

    def on_settled(self, settled: ipc.Settled) -> None:
        if settled.aborted:
            self.state = "paused (aborted)"
        elif not settled.ok:
            self.state = f"idle · turn failed: {_clip(settled.error, 80)}"
        else:
            self.state = "idle"
        self.tool_status = "" if self.tool_status == "running" else self.tool_status
        self._turn_ended = time.monotonic()
        if settled.text:
            self.report = settled.text.rstrip()
            self.report_label = "side answer" if settled.side else f"turn {settled.turn} report"
        self._changed()

    def log_line(self, line: str) -> None:
        self.logs.append(_clip(" ".join(line.split()), 200))
        self._changed()

    # -- drawing --------------------------------------------------------------------------

    def render(self) -> RenderableType:
        now = time.monotonic()
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("task", self.task or "—")
        if self.steer:
            grid.add_row("steered", self.steer)
        if self.tool:
            marks = {"running": "▶", "ok": "✓", "error": "✗"}
            mark = marks.get(self.tool_status, "·")
            grid.add_row("tool", Text(f"{mark} {self.tool} {_clip(self.tool_args, 200)}"))
        if self.text:
            lines = self.text.strip().splitlines()[-3:]
            grid.add_row("says", Text("\n".join(lines)))
        if self.progress is not None and self.progress.total:
            progress = self.progress
            todo = f"{progress.done}/{progress.total} done"
            if progress.current:
                todo += f" · now: {progress.current}"
            grid.add_row("todo", todo)
            if progress.next:
                grid.add_row("", "next: " + " · ".join(progress.next[:3]))
        usage = f"{self.tokens} tokens"
        if self.cost_usd is not None:
            usage += f" · ${self.cost_usd:.4f}"
        grid.add_row("usage", usage)
        for index, step in enumerate(self.recent):
            grid.add_row("recent" if index == 0 else "", step)
        for index, line in enumerate(self.logs):
            grid.add_row("log" if index == 0 else "", Text(line, style="dim"))
        took = (self._turn_ended or now) - self._turn_started
        status = f"{self.state} · turn {self.turn} · {_clock(took)}"
        footer = f"alive {_clock(now - self._started)}"
        panel = Panel(
            grid,
            title=Text(self.title, style="bold"),
            title_align="left",
            # The key again at the bottom: a dead pane's last message can scroll the top away.
            subtitle=f"{self.key} {status} · {footer}",
            subtitle_align="right",
        )
        if not self.report:
            return panel
        lines = self.report.splitlines()
        shown = "\n".join(lines[:REPORT_LINES])
        if len(lines) > REPORT_LINES:
            shown += f"\n… {len(lines) - REPORT_LINES} more lines (the parent has them all)"
        report = Panel(
            Text(shown), title=self.report_label, title_align="left", border_style="green"
        )
        return Group(panel, report)

    def _changed(self) -> None:
        self._dirty.set()

    # -- running --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _writes_into_view(self) -> Iterator[None]:
        """Route logging and stray writes to stdout/stderr into the view's log rows."""
        root = logging.getLogger()
        saved = root.handlers[:], sys.stdout, sys.stderr
        root.handlers = [_ViewHandler(self)]
        sys.stdout = sys.stderr = _ViewWriter(self)
        try:
            yield
        finally:
            root.handlers, sys.stdout, sys.stderr = saved

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Show the view until cancelled; then print its last frame on the normal screen."""
        live = Live(
            self.render(),
            console=self.console,
            screen=True,
            auto_refresh=False,  # redraws happen here, on the trio thread, not a timer thread
            redirect_stdout=False,  # _writes_into_view keeps them, where Live would drop them
            redirect_stderr=False,
            vertical_overflow="crop",
        )
        try:
            with self._writes_into_view(), live:
                task_status.started()
                while True:
                    with trio.move_on_after(CLOCK_INTERVAL):
                        await self._dirty.wait()
                    self._dirty = trio.Event()
                    live.update(self.render(), refresh=True)
                    await trio.sleep(REDRAW_INTERVAL)
        finally:
            self.state = f"{self.state} · exited"
            self.console.print(self.render())
