"""Supervisor configuration and the session's state directory layout.

Settings come from (later wins): defaults, ``$FLEET_HOME/config.yaml``, environment variables
(``FLEET_MAX_SUBAGENTS``, ``FLEET_LANE``, ``FLEET_IDLE_TIMEOUT_MS``, ``FLEET_MAX_TOTAL_MS``,
``FLEET_MODEL``, ``FLEET_ALLOW_UNSANDBOXED``, ``FLEET_REJECT_LOG``, ``FLEET_IDLE_EXIT_S``), then
explicit arguments.
Watchdog budgets are global only: never a spawn parameter.
"""

import functools
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError
from orchestrator._runtime import session_runtime
from orchestrator._yamlfile import read_yaml_file

CAPS: Final = (2, 4, 6, 8, 16)
DEFAULT_CAP: Final = 4
DEFAULT_LANE: Final = 3
DEFAULT_IDLE_EXIT_S: Final = 1800.0
_SESSION_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")


def _check_cap(_: object, __: object, value: int) -> None:
    if value not in CAPS:
        raise UsageError(f"max_subagents {value} is not one of {', '.join(map(str, CAPS))}")


def _check_lane(_: object, __: object, value: int) -> None:
    if not 1 <= value <= 64:
        raise UsageError(f"lane capacity {value} is outside 1..64")


def _check_placement(_: object, __: object, value: str) -> None:
    if value not in ("spread", "pack"):
        raise UsageError(f"ray_placement {value!r} is not spread or pack")


def _check_idle_exit(_: object, __: object, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise UsageError(f"idle_exit_s {value!r} must be a number of seconds >= 0 (0: never)")


def _check_hibernate(_: object, __: object, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise UsageError(
            f"hibernate_after_s {value!r} must be a number of seconds >= 0 (0: at once when "
            "idle), or null for never"
        )


def _check_retained(_: object, __: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise UsageError(f"max_retained {value!r} must be a whole number in 1..4096")


def _endpoints(value: object) -> tuple[str, ...]:
    """``egress`` as a list or a comma-separated string (each entry is checked at spawn)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise UsageError(f"egress {value!r} must be a list of host:port endpoints")
    return tuple(item.strip() for item in items if item.strip())


NOTIFY_EVENTS: Final = ("needs-input", "settled", "failed", "budget")


def _argv(value: object) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(i, str) and i for i in value):
        raise UsageError(f"subagents.notify command {value!r} must be a list of words (an argv)")
    return tuple(value)


def _events(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise UsageError(f"subagents.notify events {value!r} must be a list of event kinds")
    events = tuple(item.strip() for item in items if item.strip())
    unknown = sorted(set(events) - set(NOTIFY_EVENTS))
    if unknown:
        raise UsageError(
            f"notify events: unknown kind {unknown[0]!r} (one of {', '.join(NOTIFY_EVENTS)})"
        )
    return events


def _webhook(_: object, __: object, value: str) -> None:
    if value and not value.startswith(("http://", "https://")):
        raise UsageError(f"subagents.notify webhook {value!r} must be an http:// or https:// URL")


def _positive(_: object, attribute: "attrs.Attribute[Any]", value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise UsageError(f"subagents.notify {attribute.name} {value!r} must be a number >= 0")


@attrs.frozen(kw_only=True)
class NotifyConfig:
    """``subagents.notify``: where events for people go (see ``orchestrator.notify``)."""

    #: An argv run once per event, the event JSON on its stdin.
    command: tuple[str, ...] = attrs.field(default=(), converter=_argv)
    #: A URL each event is POSTed to as JSON (bounded retries, never blocking the fleet).
    webhook: str = attrs.field(default="", validator=_webhook)
    #: The desktop notifier (``notify-send``, or ``osascript`` on macOS) when one exists.
    desktop: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    events: tuple[str, ...] = attrs.field(default=NOTIFY_EVENTS, converter=_events)
    #: A child's question unanswered this long becomes a ``needs-input`` event.
    needs_input_after_s: float = attrs.field(default=60.0, validator=_positive)
    timeout_s: float = attrs.field(default=5.0, validator=_positive)
    retries: int = attrs.field(default=3, validator=_positive)

    @property
    def enabled(self) -> bool:
        return bool(self.command or self.webhook or self.desktop)


def _notify(value: object) -> NotifyConfig:
    if isinstance(value, NotifyConfig):
        return value
    if value is None:
        return NotifyConfig()
    if not isinstance(value, Mapping):
        raise UsageError(
            "subagents.notify must be a mapping (command, webhook, desktop, events, ...)"
        )
    known = {f.name for f in attrs.fields(NotifyConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise UsageError(
            f"subagents.notify: unknown setting {unknown[0]!r} (one of {', '.join(known)})"
        )
    try:
        return NotifyConfig(**value)
    except TypeError as exc:  # a wrong type (desktop: sometimes)
        raise UsageError(f"subagents.notify: {exc} (fix config.yaml)") from None


def hold_globs(value: object) -> tuple[str, ...]:
    """``copyback.hold``: path globs held at copy-back on top of the built-in list (which no
    setting shortens; ``orchestrator.workspace._quarantine``)."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(
        isinstance(item, str) and item.strip("/ ") for item in value
    ):
        raise UsageError(
            f"copyback.hold {value!r} must be a list of path globs (they add to the built-in "
            "list; fix config.yaml)"
        )
    return tuple(item.strip() for item in value)


def default_home() -> Path:
    """``$FLEET_HOME``, else the platform's user state directory."""
    env = os.environ.get("FLEET_HOME")
    if env:
        return Path(env)
    import platformdirs  # noqa: PLC0415 - a verb starts without it when FLEET_HOME is set

    return Path(platformdirs.user_state_dir("fleet"))


@attrs.frozen(kw_only=True)
class Config:
    """Everything a supervisor needs to know before it starts."""

    home: Path = attrs.Factory(default_home)
    session: str
    workspace: Path
    max_subagents: int = attrs.field(default=DEFAULT_CAP, validator=_check_cap)
    lane: int = attrs.field(default=DEFAULT_LANE, validator=_check_lane)
    idle_timeout_ms: object = 600_000
    max_total_ms: object = 1_200_000
    hello_timeout: float = 30.0
    request_timeout: float = 5.0
    pause_timeout: float = 15.0
    kill_grace: float = 3.0
    drain_timeout: float = 2.0
    model: str = ""
    surface: str = "process"
    #: Where the ``ray`` surface places children: ``ray.init(address=...)``; "" / "local"
    #: starts a local cluster, "auto" or ``host:port`` joins one (docs/scale-out.md).
    ray_address: str = ""
    #: The address the TLS door for remote children listens on (a port is picked per session).
    ray_listen: str = "127.0.0.1"
    #: Host a node's children in one long-lived Ray actor per node, each child a fork of the
    #: node's fork server (the default); off: an actor and a fresh interpreter per child.
    ray_node_host: bool = True
    #: With node hosts: ``spread`` children over nodes (least used first) or ``pack`` them.
    ray_placement: str = attrs.field(default="spread", validator=_check_placement)
    #: A remote child's lease: it stops writing and exits after this long unheard.
    lease_s: float = 30.0
    allow_unsandboxed: bool = False
    sandbox: str = "auto"
    agents_scope: str = "default"
    record_output: bool = False
    #: Opt-in JSONL log of refused requests (``logs/rejected.jsonl``).
    reject_log: bool = False
    python: str = sys.executable
    #: Start unsandboxed ``process`` children as forks of a preloaded server (much faster
    #: start-up); ``FLEET_FORK_SERVER=0`` or ``fork_server = false`` turns it off.
    fork_server: bool = True
    #: Claude Code / Pi agent directories to read (``claude``, ``pi`` or absolute paths).
    agent_dirs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: ``host:port`` pairs every model-using child may reach besides its model (a gateway).
    egress: tuple[str, ...] = attrs.field(default=(), converter=_endpoints)
    #: The ``fleet serve`` daemon exits after this many seconds with nothing to keep it (no
    #: live child, no unread note, no open question, no unresolved worktree, no request);
    #: 0: never.
    idle_exit_s: float = attrs.field(default=DEFAULT_IDLE_EXIT_S, validator=_check_idle_exit)
    #: ``subagents.hibernate_after_s``: an idle child whose backend can resume is stopped
    #: without finalizing after this many idle seconds (0: at once; ``None``: never).
    hibernate_after_s: float | None = attrs.field(default=None, validator=_check_hibernate)
    #: ``subagents.max_retained``: live and hibernated children together (docs/durability.md).
    max_retained: int = attrs.field(default=64, validator=_check_retained)
    #: ``subagents.notify``: events for people (a command, a webhook, the desktop).
    notify: NotifyConfig = attrs.field(factory=NotifyConfig, converter=_notify)
    #: ``subagents.budget`` and ``subagents.prices``: usage budgets and the price table, as
    #: given; the supervisor validates them as a whole (``spend._limits.parse_policy``).
    budget: object = None
    prices: object = None
    #: ``copyback.hold``: globs of paths a worker's copy-back holds for a person's say, added
    #: to the built-in list (docs/worktrees.md "Held files").
    copyback_hold: tuple[str, ...] = attrs.field(default=(), converter=hold_globs)
    #: ``integration.gate``: the shell command a held change must pass in a fresh sandboxed
    #: worktree before ``fleet land`` applies it ("" : ``land`` is refused).
    integration_gate: str = ""
    #: ``integration.auto``: the supervisor lands each change entering the queue on its own,
    #: in order (``fleet serve``'s supervisor; no ``fleet land`` needed).
    integration_auto: bool = False
    #: ``integration.timeout``: seconds a gate may run before it is stopped and the change held.
    integration_timeout: float = 1800.0
    #: ``subagents.pacing``: the model gateway's per-provider rate and cooldown patience, as
    #: given (``spend._pacing.parse_pacing`` validates it).
    pacing: object = None

    @functools.cached_property
    def paths(self) -> "SessionPaths":
        """Where this session keeps its state; made once (its runtime directory is a
        ``realpath`` and a digest away: a few dozen µs, asked many times a child)."""
        return SessionPaths(root=self.home / "sessions" / self.session)


def _runtime_of(paths: "SessionPaths") -> Path:
    return session_runtime(paths.root)


@attrs.frozen
class SessionPaths:
    """Where one session keeps its state (``$FLEET_HOME/sessions/<id>/``), and its sockets and
    secrets: in its directory under the per-user runtime root (:mod:`orchestrator._runtime`),
    never under ``$FLEET_HOME``, so no sandbox of any fleet can see them."""

    root: Path
    #: ``<runtime root>/<digest of root>``: the control socket and token, the IPC listener,
    #: the private tmux server's socket and the egress proxies' sockets.
    runtime: Path = attrs.field(
        default=attrs.Factory(_runtime_of, takes_self=True), eq=False, repr=False
    )

    @property
    def ipc_socket(self) -> Path:
        return self.runtime / "ipc.sock"

    @property
    def control_socket(self) -> Path:
        return self.runtime / "control.sock"

    @property
    def control_token(self) -> Path:
        return self.runtime / "control.token"

    @property
    def tmux_socket(self) -> Path:
        return self.runtime / "tmux.sock"

    @property
    def egress(self) -> Path:
        """Every child's egress proxy socket (``<key>.sock``); ``_runtime`` removes it."""
        return self.runtime / "egress"

    @property
    def lock(self) -> Path:
        return self.root / "supervisor.lock"

    @property
    def runtime_note(self) -> Path:
        """Where a running daemon says which runtime directory it serves from (a command run
        with another ``XDG_RUNTIME_DIR`` looks elsewhere, and is told so)."""
        return self.root / "runtime.path"

    @property
    def loadouts(self) -> Path:
        return self.root / "loadouts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def worktrees(self) -> Path:
        return self.root / "worktrees"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def review(self) -> Path:
        return self.root / "review"

    @property
    def paper(self) -> Path:
        return self.root / "paper.json"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def daemon_log(self) -> Path:
        return self.root / "supervisor.log"


def repo_root(cwd: Path) -> Path:
    """The git top level containing *cwd*, else *cwd* itself."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return cwd.resolve()
    top = out.stdout.strip()
    return Path(top).resolve() if out.returncode == 0 and top else cwd.resolve()


def resolve_session(explicit: str | None, workspace: Path) -> str:
    """``--session``, else ``FLEET_SESSION``, else one id per repository root."""
    chosen = explicit or os.environ.get("FLEET_SESSION")
    if chosen:
        if not _SESSION_RE.fullmatch(chosen):
            raise UsageError(
                f"session id {chosen!r} is invalid (letters, digits, - and _, at most 40)"
            )
        return chosen
    name = re.sub(r"[^A-Za-z0-9_-]", "-", workspace.name)[:24].strip("-") or "root"
    digest = hashlib.sha256(os.fsencode(workspace)).hexdigest()[:8]
    return f"{name}-{digest}"


def _file_settings(home: Path) -> Mapping[str, Any]:
    path = home / "config.yaml"
    data = read_yaml_file(path, "config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config {path}: top level must be a mapping")
    return data


def load_config(*, session: str | None = None, cwd: Path | None = None, **overrides: Any) -> Config:
    """Build a :class:`Config` from file, environment and *overrides*."""
    workspace = repo_root(cwd or Path.cwd())
    home = Path(overrides.pop("home", None) or default_home())
    settings: dict[str, Any] = {}
    data = _file_settings(home)
    sub = data.get("subagents", {}) if isinstance(data.get("subagents", {}), dict) else {}
    for key, target in (
        ("max_subagents", "max_subagents"),
        ("lane", "lane"),
        ("idle_timeout_ms", "idle_timeout_ms"),
        ("max_total_ms", "max_total_ms"),
        ("model", "model"),
        ("surface", "surface"),
        ("ray_address", "ray_address"),
        ("ray_listen", "ray_listen"),
        ("ray_node_host", "ray_node_host"),
        ("ray_placement", "ray_placement"),
        ("lease_s", "lease_s"),
        ("allow_unsandboxed", "allow_unsandboxed"),
        ("sandbox", "sandbox"),
        ("reject_log", "reject_log"),
        ("fork_server", "fork_server"),
        ("agent_dirs", "agent_dirs"),
        ("egress", "egress"),
        ("idle_exit_s", "idle_exit_s"),
        ("hibernate_after_s", "hibernate_after_s"),
        ("max_retained", "max_retained"),
        ("notify", "notify"),
        ("budget", "budget"),
        ("prices", "prices"),
        ("pacing", "pacing"),
    ):
        if key in sub:
            settings[target] = sub[key]
    copyback = data.get("copyback")
    if copyback is not None:
        if not isinstance(copyback, dict) or set(copyback) - {"hold"}:
            raise UsageError("config.yaml: copyback must be a mapping with one key, hold")
        settings["copyback_hold"] = copyback.get("hold")
    integration = data.get("integration")
    if integration is not None:
        settings.update(_integration(integration))
    env = os.environ
    for name, target, convert in (
        ("FLEET_MAX_SUBAGENTS", "max_subagents", int),
        ("FLEET_LANE", "lane", int),
        ("FLEET_IDLE_TIMEOUT_MS", "idle_timeout_ms", _int_or_text),
        ("FLEET_MAX_TOTAL_MS", "max_total_ms", _int_or_text),
        ("FLEET_MODEL", "model", str),
        ("FLEET_SURFACE", "surface", str),
        ("FLEET_RAY_ADDRESS", "ray_address", str),
        ("FLEET_RAY_LISTEN", "ray_listen", str),
        ("FLEET_RAY_PLACEMENT", "ray_placement", str),
        ("FLEET_LEASE_S", "lease_s", float),
        ("FLEET_SANDBOX", "sandbox", str),
        ("FLEET_AGENT_DIRS", "agent_dirs", str),
        ("FLEET_IDLE_EXIT_S", "idle_exit_s", float),
    ):
        if env.get(name):
            try:
                settings[target] = convert(env[name])
            except ValueError:
                raise UsageError(f"{name}={env[name]!r} is not a valid value") from None
    if env.get("FLEET_ALLOW_UNSANDBOXED", "").lower() in {"1", "true", "yes"}:
        settings["allow_unsandboxed"] = True
    if env.get("FLEET_REJECT_LOG", "").lower() in {"1", "true", "yes"}:
        settings["reject_log"] = True
    if env.get("FLEET_RAY_NODE_HOST", "").lower() in {"1", "true", "yes"}:
        settings["ray_node_host"] = True
    elif env.get("FLEET_RAY_NODE_HOST", "").lower() in {"0", "false", "no"}:
        settings["ray_node_host"] = False
    if env.get("FLEET_FORK_SERVER", "").lower() in {"0", "false", "no"}:
        settings["fork_server"] = False
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if "agent_dirs" in settings:
        settings["agent_dirs"] = agent_dir_entries(settings["agent_dirs"], cwd or Path.cwd())
    return Config(
        home=home, session=resolve_session(session, workspace), workspace=workspace, **settings
    )


def agent_dir_entries(value: object, cwd: Path) -> tuple[str, ...]:
    """``--agent-dirs`` as given (a comma-separated string or a list): the words ``claude``
    and ``pi`` kept, every other entry made an absolute path against *cwd* (the daemon that
    reads them runs elsewhere)."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        items = list(value)
    else:
        raise UsageError(f"agent_dirs {value!r} must be a list of directories or claude/pi")
    entries = []
    for item in (item.strip() for item in items):
        if item in {"claude", "pi"}:
            entries.append(item)
        elif item:
            entries.append(str((cwd / Path(item).expanduser()).absolute()))
    return tuple(entries)


def _int_or_text(value: str) -> object:
    try:
        return int(value)
    except ValueError:
        return value  # the watchdog policy check reports it and falls back


def _integration(integration: object) -> dict[str, Any]:
    """The ``integration`` mapping's settings, or a one-line error."""
    if not isinstance(integration, dict) or set(integration) - {"gate", "auto", "timeout"}:
        raise UsageError("config.yaml: integration must be a mapping of gate, auto and timeout")
    settings: dict[str, Any] = {}
    gate = integration.get("gate", "")
    if not isinstance(gate, str):
        raise UsageError("config.yaml: integration.gate must be a shell command (a string)")
    settings["integration_gate"] = gate
    auto = integration.get("auto", False)
    if not isinstance(auto, bool):
        raise UsageError("config.yaml: integration.auto must be true or false")
    settings["integration_auto"] = auto
    timeout = integration.get("timeout", 1800)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e7:
        raise UsageError("config.yaml: integration.timeout must be a number of seconds above 0")
    settings["integration_timeout"] = float(timeout)
    return settings
