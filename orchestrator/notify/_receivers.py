"""The receivers: a command, a webhook, the desktop notifier. Each delivers one event or raises."""

import json
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Final

import trio

from orchestrator.notify._events import Event

#: What the desktop shows as the title and body of each kind.
_TITLES: Final = {
    "needs-input": "needs your input",
    "settled": "settled",
    "failed": "failed",
    "budget": "hit its budget",
}


def _title(event: Event) -> str:
    return f"fleet: {event['name'] or event['key']} {_TITLES.get(event['kind'], event['kind'])}"


def _applescript_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def desktop_argv(
    event: Event, *, platform: str = sys.platform, which: Callable[[str], str | None] = shutil.which
) -> list[str]:
    """The desktop notifier's argv for *event*, or ``[]`` where none exists.

    Every value is one argv word (no shell); on macOS the AppleScript strings are quoted.
    """
    title, body = _title(event), event["context"] or event["state"]
    if platform == "darwin":
        osascript = which("osascript")
        if not osascript:
            return []
        script = (
            f"display notification {_applescript_string(body)} "
            f"with title {_applescript_string(title)}"
        )
        return [osascript, "-e", script]
    notify_send = which("notify-send")
    if not notify_send:
        return []
    urgency = "critical" if event["kind"] in {"needs-input", "failed"} else "normal"
    return [notify_send, "--app-name=fleet", f"--urgency={urgency}", "--", title, body]


async def run_command(argv: Sequence[str], event: Event, *, limit_s: float) -> None:
    """Run *argv* with the event JSON on stdin; a non-zero exit or a timeout raises."""
    data = (json.dumps(event) + "\n").encode()
    with trio.fail_after(limit_s):
        await trio.run_process(
            list(argv),
            stdin=data,
            capture_stdout=True,
            capture_stderr=True,
            check=True,
        )


def _post(url: str, body: bytes, timeout: float) -> int:
    request = urllib.request.Request(  # noqa: S310 - the URL is the user's own setting, checked
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "fleet-notify"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the connection open
        return int(exc.code)


async def post_webhook(url: str, event: Event, *, limit_s: float) -> None:
    """POST the event as JSON; a non-2xx reply, a refused connection or a timeout raises."""
    body = json.dumps(event).encode()
    with trio.fail_after(limit_s + 1):
        status = await trio.to_thread.run_sync(_post, url, body, limit_s, abandon_on_cancel=True)
    if not 200 <= status < 300:
        raise OSError(f"webhook answered HTTP {status}")
