"""The ``fleet`` command line (contract: ``docs/cli.md``).

Every verb but ``serve``, ``doctor`` and ``demo`` talks to the session's supervisor over its
control socket, starting it first when none runs. Human output by default, ``--json`` for
programs; errors are one line on stderr (and an ``error`` object on stdout with ``--json``).
"""

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from orchestrator._errors import FleetError, TimedOut, UsageError
from orchestrator.cli import _render
from orchestrator.cli._common import call, config_of, out
from orchestrator.cli._coordination import cmd_brief, cmd_discuss, cmd_vote
from orchestrator.cli._drive import (
    cmd_answer,
    cmd_ask,
    cmd_discard,
    cmd_logs,
    cmd_pause,
    cmd_report,
    cmd_resume,
    cmd_spawn,
    cmd_steer,
    cmd_stop,
    cmd_wait,
)
from orchestrator.cli._durable import cmd_events, cmd_revive
from orchestrator.cli._land import add_verbs as add_land_verbs
from orchestrator.cli._map import add_verb as add_map_verb
from orchestrator.cli._outcome import error_code, exit_with, internal_error_code
from orchestrator.cli._parents import add_verbs as add_parent_verbs
from orchestrator.cli._review import cmd_accept, cmd_apply, cmd_diff, cmd_revert
from orchestrator.cli._watch import cmd_attach, cmd_peek, cmd_top, cmd_usage
from orchestrator.control._client import call as call_control
from orchestrator.control._client import read_token
from orchestrator.control._daemon_client import STOP_TIMEOUT, ensure_daemon, wait_released


class _ArgumentError(Exception):
    """A command line argparse refused; :func:`main` reports it like any usage error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        if " " in self.prog:
            verb = self.prog.split()[-1]
            raise _ArgumentError(f"{verb}: {message} (see fleet {verb} --help)")
        raise _ArgumentError(f"{message} (see fleet --help)")


def _wants_json(argv: Sequence[str]) -> bool:
    """Whether *argv* asks for ``--json`` (before any ``--``), even if it does not parse."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse *argv*; a bad command line is one stderr line (and the JSON error), exit 2."""
    try:
        return parser.parse_args(argv)
    except _ArgumentError as exc:
        message = str(exc)
        if _wants_json(sys.argv[1:] if argv is None else argv):
            print(json.dumps({"error": {"kind": UsageError.kind, "message": message}}))
        print(f"fleet {message}", file=sys.stderr)
        sys.exit(UsageError.exit_code)


def cmd_agents(args: argparse.Namespace) -> int:
    data = call(args, "agents", {"scope": args.scope})
    out(args, data, lambda d: _render.agents_text(d["agents"]))
    return 0


def cmd_mode(args: argparse.Namespace) -> int:
    data = call(args, "mode", {"name": args.name})
    out(args, data, lambda d: d["mode"])
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_of(args)
    if args.stop:
        paths = config.paths
        if not paths.control_socket.exists():
            out(args, {"stopped": False}, lambda _: "no supervisor runs for this session")
            return 0
        token = read_token(paths.control_token)
        call_control(paths.control_socket, token, "shutdown", {}, timeout=60)
        # Stopped means ended: its children reaped and the session free for the next one.
        holder = wait_released(paths.lock)
        if holder is not None:
            raise TimedOut(
                f"the supervisor (pid {holder}) is still stopping its children after "
                f"{STOP_TIMEOUT:g} s (see {paths.daemon_log})"
            )
        out(args, {"stopped": True}, lambda _: "supervisor stopped")
        return 0
    if args.foreground:
        # The daemon alone needs the supervisor: every other verb starts without it.
        import trio  # noqa: PLC0415

        from orchestrator.control._daemon import serve  # noqa: PLC0415

        trio.run(serve, config)
        return 0
    ensure_daemon(config)
    out(
        args,
        {"session": config.session},
        lambda d: f"supervisor running for session {d['session']}",
    )
    return 0


def cmd_web(args: argparse.Namespace) -> int:
    # The web stack is imported by this verb alone.
    from orchestrator.web import _server  # noqa: PLC0415

    config = config_of(args)
    if args.stop:
        stopped = _server.stop(config)
        out(args, {"stopped": stopped}, lambda d: "web view stopped" if d["stopped"] else "")
        return 0
    if args.foreground:

        def announce(url: str) -> None:
            if not args.quiet:
                print(f"fleet web: {url}", flush=True)

        _server.run_foreground(config, announce)
        return 0
    data = _server.start_or_reuse(config)
    out(args, data, lambda d: f"open {d['url']}\n(one-time login link, good for 5 minutes)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from orchestrator.control._doctor import run_checks  # noqa: PLC0415

    checks = run_checks(config_of(args))
    out(
        args,
        {"checks": checks},
        lambda d: "\n".join(
            f"{'ok ' if c['ok'] else 'NO '} {c['name']}: {c['detail']}" for c in d["checks"]
        ),
    )
    return 0 if all(c["ok"] or not c.get("required") for c in checks) else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from orchestrator.cli._bench import cmd_bench as bench  # noqa: PLC0415

    return bench(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestrator.cli._demo import run_demo  # noqa: PLC0415

    return run_demo(json_output=args.json, ray=args.ray)


# -- parser ---------------------------------------------------------------------------------


def _common(*, suppress: bool) -> "_Parser":
    # The global flags work before and after the verb; after it they must not reset a value
    # given before it, hence SUPPRESS defaults on the verbs' copy.
    common = _Parser(add_help=False)
    kw: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    common.add_argument("--json", action="store_true", help="machine-readable output", **kw)
    common.add_argument(
        "--session", help="session id (default: FLEET_SESSION, else per repo)", **kw
    )
    common.add_argument("--debug", action="store_true", help="show tracebacks", **kw)
    common.add_argument("--max-subagents", type=int, help="retained-fleet cap (2,4,6,8,16)", **kw)
    common.add_argument("--lane", type=int, help="how many children may work at once", **kw)
    common.add_argument(
        "--default-model", dest="model_default", help="model for builtin agents", **kw
    )
    common.add_argument(
        "--allow-unsandboxed", action="store_true", help="run without a sandbox", **kw
    )
    common.add_argument(
        "--agent-dirs",
        metavar="DIRS",
        help="also read Claude Code / Pi agent files: comma-separated claude, pi or directories",
        **kw,
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common(suppress=True)
    parser = _Parser(
        prog="fleet",
        description="Delegate tasks to child coding agents.",
        parents=[_common(suppress=False)],
    )
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    def verb(
        name: str, func: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = verb("spawn", cmd_spawn, "start children on tasks")
    p.add_argument("task", nargs="*", help="the task")
    p.add_argument("--agent", default="scout")
    p.add_argument("--mode", choices=["scout", "fork", "worktree"])
    p.add_argument("--name")
    p.add_argument("--backend")
    p.add_argument(
        "--model",
        help="scripted:FILE, openai:MODEL[@URL], anthropic:MODEL[@URL], a bare name for a CLI "
        "backend, or @ROLE[:EFFORT] (docs/cli.md)",
    )
    p.add_argument(
        "--role", help="a model role of roles.yaml: its first available model, with fallbacks"
    )
    p.add_argument(
        "--command",
        help="the command backend's argv as one shell-quoted string, e.g. \"sh -c 'make lint'\"",
    )
    p.add_argument(
        "--surface",
        choices=["process", "tmux", "tmux:current", "cmux", "ray"],
        help="where the child runs: process (default), a tmux window on fleet's own server, "
        "a window in your current tmux session, a cmux surface, or a Ray actor (ray)",
    )
    p.add_argument(
        "--budget",
        help="lower the child's usage budget: a number of tokens (hard), or "
        "KEY=NUMBER,... of soft_/hard_ tokens, usd, spawns, turns",
    )
    p.add_argument("--batch", help="JSON file with a list of task objects")
    p.add_argument(
        "--schema",
        metavar="FILE",
        help="a JSON Schema file: the child ends its report with a fenced json block that must "
        "validate (one corrective steer, then it fails); wait returns it as result",
    )
    p.add_argument("--wait", action="store_true", help="wait until they settle")

    p = verb("peek", cmd_peek, "show the fleet from memory")
    p.add_argument("agents", nargs="*")
    p.add_argument("--watch", action="store_true", help="a live view (as fleet top)")
    p.add_argument("--locks", action="store_true", help="include ownership locks")

    verb("top", cmd_top, "the live fleet view (fleet peek --watch)")

    p = verb("usage", cmd_usage, "tokens and cost per child, per definition and for the session")
    p.add_argument("agents", nargs="*")

    p = verb("attach", cmd_attach, "open a tmux child's window, or the fleet's tmux session")
    p.add_argument("agent", nargs="?", help="a child in tmux (default: the whole fleet session)")

    p = verb("wait", cmd_wait, "wait until a child settles")
    p.add_argument("agents", nargs="*")
    p.add_argument("--all", action="store_true", help="wait for every named child")
    p.add_argument("--timeout", type=float)

    for name, func, help_text in (
        ("steer", cmd_steer, "redirect a working child"),
        ("resume", cmd_resume, "give an idle or paused child a new prompt"),
        ("ask", cmd_ask, "ask a child a side question"),
    ):
        p = verb(name, func, help_text)
        p.add_argument("agent")
        p.add_argument("text", nargs="+")

    p = verb("pause", cmd_pause, "clear a child's queue and abort its turn")
    p.add_argument("agent")

    p = verb("answer", cmd_answer, "answer a child's question")
    p.add_argument("question", help="q<N>, or an agent with one open question")
    p.add_argument("text", nargs="+")

    p = verb("stop", cmd_stop, "stop children (final) and print their handoffs")
    p.add_argument("agents", nargs="*")
    p.add_argument("--all", action="store_true")
    p.add_argument(
        "--hold",
        action="store_true",
        help="keep a worker's change for review instead of applying it (fleet apply lands it)",
    )

    p = verb("discard", cmd_discard, "forget a child and its unresolved state")
    p.add_argument("agent")

    p = verb("report", cmd_report, "a child's full report or transcript, a page at a time")
    p.add_argument("agent")
    p.add_argument("--transcript", action="store_true", help="its transcript, not its report")
    p.add_argument("--offset", type=int, default=0, help="first character of the page")

    p = verb("logs", cmd_logs, "a child's diagnostics log")
    p.add_argument("agent")
    p.add_argument("--tail", type=int, default=8192)

    p = verb("events", cmd_events, "the session journal: every fact, oldest first")
    p.add_argument("--since", type=int, default=0, help="only records after this seq")
    p.add_argument("--follow", action="store_true", help="keep printing new records")

    p = verb("revive", cmd_revive, "start lost children again with their context")
    p.add_argument("agents", nargs="+")

    p = verb("agents", cmd_agents, "list agent definitions")
    p.add_argument("--scope", choices=["default", "project", "both"])

    p = verb("mode", cmd_mode, "show or set the workflow mode")
    p.add_argument("name", nargs="?")

    p = verb("discuss", cmd_discuss, "the discussion paper: terse questions and answers")
    paper = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    q = paper.add_parser("ask", parents=[common], help="post a question (to one agent or all)")
    q.add_argument("--to", help="the agent it is for (default: everyone)")
    q.add_argument("text", nargs="+")
    q = paper.add_parser("answer", parents=[common], help="answer a question on the paper")
    q.add_argument("question", help="the question's id, dN")
    q.add_argument("text", nargs="+")
    q = paper.add_parser("list", parents=[common], help="new entries by others, newest first")
    q.add_argument("--since", help="reread every entry after dN (d0: the whole paper)")
    q.add_argument("--question", help="read one thread whole: dN")

    p = verb("vote", cmd_vote, "a democracy round on a persistent, super-complex decision")
    p.add_argument("--options", help="JSON file with the round request (docs/coordination.md)")
    p.add_argument("--agents", help="comma-separated idle or paused scouts to seat as voters")
    p.add_argument("--voters", type=int, help="seats (default 4; 2 at a cap of 2)")
    p.add_argument("--deadline", type=float, help="seconds before unfinished voters are cancelled")
    p.add_argument("--model", help="model for fresh voters (default: the session's)")
    p.add_argument("--abort", action="store_true", help="invalidate the running round")

    verb("brief", cmd_brief, "what the fleet is doing and how to moderate it")

    p = verb("diff", cmd_diff, "review children's changes: copied back, or still in a worktree")
    p.add_argument("targets", nargs="*", help="agents or paths (default: everything)")
    p.add_argument("--context", type=int, default=3, help="lines of context")

    p = verb("accept", cmd_accept, "keep copied-back changes and forget their pre-images")
    p.add_argument("targets", nargs="*", help="agents or paths (default: everything)")

    p = verb("revert", cmd_revert, "restore the pre-images of copied-back changes")
    p.add_argument("targets", nargs="*", help="agents or paths (default: everything)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    p = verb("apply", cmd_apply, "land a worker's kept change; held files only when named")
    p.add_argument("agent")
    p.add_argument("paths", nargs="*", help="exactly these files (the only way a held file lands)")

    p = verb("serve", cmd_serve, "run the session's supervisor")
    p.add_argument("--foreground", action="store_true")
    p.add_argument("--stop", action="store_true", help="stop the running supervisor")

    p = verb("web", cmd_web, "a live view of the fleet in your browser (prints a login URL)")
    p.add_argument("--foreground", action="store_true", help="serve here until Ctrl-C")
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stop", action="store_true", help="stop the session's web view")

    add_parent_verbs(verb)
    add_map_verb(verb)
    add_land_verbs(verb)
    verb("doctor", cmd_doctor, "check what fleet needs on this machine")
    p = verb("bench", cmd_bench, "time this machine's figures, each beside its floor")
    p.add_argument("--runs", type=int, default=10, help="warm-verb runs (default 10)")
    p.add_argument("--spawns", type=int, default=3, help="children of each kind (1-4, default 3)")
    p = verb("demo", cmd_demo, "three scouts on a sample repository")
    p.add_argument(
        "--ray", action="store_true", help="run them on a local Ray cluster (the [ray] extra)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The full command line (``fleet`` itself is :func:`orchestrator.cli._fast.main`)."""
    exit_with(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:
        raise
    except FleetError as exc:
        code = error_code(exc, args.verb, json_output=args.json)
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        code = internal_error_code(exc, args.verb, json_output=args.json, debug=args.debug)
    return code
