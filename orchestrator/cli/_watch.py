"""``fleet peek``, ``fleet top`` and ``fleet attach``: looking at the fleet."""

import argparse
import os
import shutil
import subprocess
import sys
from typing import Any, NoReturn

from orchestrator._errors import FleetError, UsageError
from orchestrator.cli import _render
from orchestrator.cli._common import call, config_of, out
from orchestrator.control._client import call_async, op_timeout
from orchestrator.control._daemon_client import ensure_daemon

WATCH_INTERVAL = 0.25


def cmd_peek(args: argparse.Namespace) -> int:
    payload = {"agents": list(args.agents)}
    if not args.watch:
        data = call(args, "peek", payload)
        out(args, data, lambda d: _render.peek_table(d, width=shutil.get_terminal_size().columns))
        return 0
    return _watch(args, list(args.agents))


def cmd_usage(args: argparse.Namespace) -> int:
    data = call(args, "usage", {"agents": list(args.agents)})
    out(args, data, _render.usage_table)
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    return _watch(args, [])


def _watch(args: argparse.Namespace, refs: list[str]) -> int:
    """The live fleet view: redrawn in place on a terminal, one line per change otherwise.

    It ends when the fleet, having had children, is empty again (or on Ctrl-C).
    """
    import trio  # noqa: PLC0415 - a one-shot verb starts without it

    config = config_of(args)
    token = ensure_daemon(config)
    socket = config.paths.control_socket
    screen = _render.LiveScreen(sys.stdout) if sys.stdout.isatty() and not args.json else None
    lines = _render.ChangeLines(sys.stdout, json_output=args.json)

    async def peek(agents: list[str]) -> dict[str, Any]:
        payload = {"agents": agents}
        return await call_async(socket, token, "peek", payload, timeout=op_timeout("peek"))

    async def loop() -> bool:
        seen = False
        while True:
            data = await peek(refs)
            agents = _render.live_agents(data)
            if screen is not None:
                size = shutil.get_terminal_size()
                screen.draw(_render.fleet_view(data, width=size.columns), height=size.lines)
            else:
                for key in lines.update(agents):
                    try:
                        [final] = (await peek([key]))["agents"]
                    except FleetError:
                        continue  # no longer retained: nothing more to say about it
                    lines.left(final)
            seen = seen or bool(agents)
            if seen and not agents:
                return True
            await trio.sleep(WATCH_INTERVAL)

    emptied = False
    try:
        emptied = trio.run(loop)
    except KeyboardInterrupt:
        pass
    finally:
        if screen is not None:
            screen.close()
    if emptied and screen is not None:
        print("fleet is empty")
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    data = call(args, "attach", {"agent": args.agent or ""})
    if args.json:
        out(args, data, str)
        return 0
    socket, target = data["socket"], data["target"]
    inside = os.environ.get("TMUX", "").partition(",")[0]
    if inside and _same_file(inside, socket):
        # Already a client of that server: move this client rather than nest another.
        switch = ["tmux", "-S", socket, "switch-client", "-t", target]
        return subprocess.run(switch, check=False).returncode
    if not sys.stdin.isatty():
        raise UsageError(
            f"attach: stdin is not a terminal, so tmux cannot attach to {target} "
            "(run it in a terminal, or pass --json for the target)"
        )
    return _exec_attach(socket, target)


def _exec_attach(socket: str, target: str) -> NoReturn:
    """Become ``tmux attach``: the user talks to tmux directly, and its exit status is ours.

    ``$TMUX`` is dropped so that inside another tmux server this nests a client, as asked.
    """
    env = {k: v for k, v in os.environ.items() if k not in {"TMUX", "TMUX_PANE"}}
    sys.stdout.flush()
    os.execvpe("tmux", ["tmux", "-S", socket, "attach-session", "-t", target], env)  # noqa: S606


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
