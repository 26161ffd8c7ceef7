"""What every ``fleet`` verb shares: the session's config, one control call, output, words."""

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator._config import Config, load_config
from orchestrator._errors import UsageError
from orchestrator.control._client import NotConnected, op_timeout
from orchestrator.control._client import call as call_control
from orchestrator.control._daemon_client import ensure_daemon


def config_of(args: argparse.Namespace) -> Config:
    return load_config(
        session=args.session,
        max_subagents=args.max_subagents,
        lane=args.lane,
        model=args.model_default,
        allow_unsandboxed=True if args.allow_unsandboxed else None,
        agent_dirs=args.agent_dirs,
    )


def call(args: argparse.Namespace, op: str, payload: dict[str, Any]) -> dict[str, Any]:
    config = config_of(args)
    try:
        return _call(args, config, ensure_daemon(config), op, payload)
    except NotConnected:
        # The supervisor ended between its answer to our ping and this request (its idle
        # exit): the request never reached it, so a fresh supervisor gets it.
        return _call(args, config, ensure_daemon(config), op, payload)


def _call(
    args: argparse.Namespace, config: Config, token: str, op: str, payload: dict[str, Any]
) -> dict[str, Any]:
    paths = config.paths
    settings: dict[str, Any] = {"max_subagents": args.max_subagents, "lane": args.lane}
    if args.agent_dirs is not None:
        settings["agent_dirs"] = list(config.agent_dirs)  # made absolute here, where we are
    if any(value is not None for value in settings.values()):
        call_control(paths.control_socket, token, "configure", settings, timeout=10.0)
    return call_control(paths.control_socket, token, op, payload, timeout=op_timeout(op))


def out(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(data, indent=None if not sys.stdout.isatty() else 2))
    else:
        text = human(data)
        if text:
            print(text)


def joined(words: Sequence[str], what: str) -> str:
    text = " ".join(words).strip()
    if not text:
        raise UsageError(f"{what} is empty")
    return text


# -- verbs ----------------------------------------------------------------------------------
