"""Where a running supervisor is, from the environment alone: the warm verbs' configuration.

:func:`orchestrator._config.load_config` (attrs, a ``git rev-parse``) costs more than an
interpreter's start. A warm verb needs only the session's directory and the start settings it
compares with the supervisor's (:mod:`orchestrator._digests`), so this module computes them
from ``os.environ``, ``config.yaml`` and the file system the same way ``load_config`` does, and
raises :class:`Unsure` for anything it does not handle exactly so: a value the full
configuration would refuse, the ``notify`` and ``agent_dirs`` settings, git discovery it cannot
mirror. The caller then takes the full path, which reports what is wrong
(``tests/orchestrator/cli/test_fast.py`` compares the two).
"""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

from orchestrator._digests import sha256

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final


class Unsure(Exception):
    """This module cannot say what ``load_config`` would: take the full path."""


#: ``Config``'s defaults for the start settings (a test compares them with the attrs class).
START_DEFAULTS: Final = {
    "sandbox": "auto",
    "allow_unsandboxed": False,
    "model": "",
    "surface": "process",
    "idle_timeout_ms": 600_000,
    "max_total_ms": 1_200_000,
    "fork_server": True,
    "reject_log": False,
    "egress": (),
    "idle_exit_s": 1800.0,
}
#: And for the two settings ``load_config`` checks that are no start settings.
CHECKED_DEFAULTS: Final = {"max_subagents": 4, "lane": 3}
_CAPS: Final = (2, 4, 6, 8, 16)
_TRUE: Final = {"1", "true", "yes"}
_FALSE: Final = {"0", "false", "no"}
_WORD: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
#: Git variables that change how it finds a repository: with any of them set, ask git.
_GIT_DISCOVERY: Final = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_COMMON_DIR",
)


def _int_or_text(value: str) -> object:
    try:
        return int(value)
    except ValueError:
        return value


def home(env: Mapping[str, str]) -> str:
    """``default_home``: ``$FLEET_HOME``, else the platform's user state directory; either
    only when it is an absolute, normal path (what ``Path`` would print)."""
    value = env.get("FLEET_HOME")
    if not value:
        # Where the platform keeps state is platformdirs' to say (root, sudo, XDG); it costs
        # about half an interpreter's start, so a verb in a loop does better with FLEET_HOME.
        import platformdirs  # noqa: PLC0415

        value = platformdirs.user_state_dir("fleet")
    if not os.path.isabs(value) or os.path.normpath(value) != value:
        raise Unsure  # a relative or unusual FLEET_HOME is the full path's to interpret
    return value


def file_settings(fleet_home: str) -> dict[str, object]:
    """The ``subagents`` settings of ``$FLEET_HOME/config.yaml`` that ``load_config`` reads
    (nothing when there is no file); :class:`Unsure` for a file the full path must judge
    (unreadable, not YAML, not a mapping) and for the settings whose checks it owns
    (``notify``, ``agent_dirs``)."""
    path = os.path.join(fleet_home, "config.yaml")
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raise Unsure from None  # the full path names the error
    import yaml  # noqa: PLC0415 - only a settings file pays for it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise Unsure from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Unsure
    sub = data.get("subagents", {})
    if not isinstance(sub, dict):
        return {}
    if sub.get("notify") is not None or "agent_dirs" in sub:
        raise Unsure
    return {key: sub[key] for key in _FILE_KEYS if key in sub}


_FILE_KEYS: Final = (
    "max_subagents",
    "lane",
    "idle_timeout_ms",
    "max_total_ms",
    "model",
    "surface",
    "ray_address",
    "allow_unsandboxed",
    "sandbox",
    "reject_log",
    "fork_server",
    "egress",
    "idle_exit_s",
)


def start_settings(env: Mapping[str, str], from_file: Mapping[str, object]) -> SimpleNamespace:
    """The start settings ``load_config`` makes of *from_file* (:func:`file_settings`) and
    *env* (no overrides); :class:`Unsure` for what its checks would refuse."""
    settings: dict[str, object] = {**START_DEFAULTS, **CHECKED_DEFAULTS}
    settings.update(from_file)
    for name, field, convert in (
        ("FLEET_MAX_SUBAGENTS", "max_subagents", int),
        ("FLEET_LANE", "lane", int),
        ("FLEET_IDLE_TIMEOUT_MS", "idle_timeout_ms", _int_or_text),
        ("FLEET_MAX_TOTAL_MS", "max_total_ms", _int_or_text),
        ("FLEET_MODEL", "model", str),
        ("FLEET_SURFACE", "surface", str),
        ("FLEET_SANDBOX", "sandbox", str),
        ("FLEET_IDLE_EXIT_S", "idle_exit_s", float),
    ):
        if env.get(name):
            try:
                settings[field] = convert(env[name])
            except ValueError:
                raise Unsure from None  # the full path's one-line error
    if env.get("FLEET_ALLOW_UNSANDBOXED", "").lower() in _TRUE:
        settings["allow_unsandboxed"] = True
    if env.get("FLEET_REJECT_LOG", "").lower() in _TRUE:
        settings["reject_log"] = True
    if env.get("FLEET_FORK_SERVER", "").lower() in _FALSE:
        settings["fork_server"] = False
    _check(settings)
    settings["egress"] = _endpoints(settings["egress"])
    del settings["max_subagents"], settings["lane"]
    return SimpleNamespace(**settings)


def _check(settings: Mapping[str, object]) -> None:
    """``Config``'s validators: the cap, the lane and the idle exit."""
    cap, lane, idle_exit = settings["max_subagents"], settings["lane"], settings["idle_exit_s"]
    if cap not in _CAPS:
        raise Unsure
    try:
        if not 1 <= lane <= 64:  # type: ignore[operator]
            raise Unsure
    except TypeError:
        raise Unsure from None
    if (
        isinstance(idle_exit, bool)
        or not isinstance(idle_exit, int | float)
        or not 0 <= idle_exit < 1e9
    ):
        raise Unsure


def _endpoints(value: object) -> tuple[str, ...]:
    """``egress`` as ``Config`` converts it: a list or a comma-separated string."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise Unsure
    return tuple(item.strip() for item in items if item.strip())


def repo_root(cwd: str, env: Mapping[str, str]) -> str:
    """What ``git rev-parse --show-toplevel`` answers in *cwd* (a physical path), else *cwd*.

    It walks up looking for ``.git``, stopping (:class:`Unsure`) wherever git's own discovery
    could answer otherwise: git variables, a directory someone else owns (git refuses it), a
    ``.git`` that is neither a gitfile nor a repository, being inside a git directory, or a
    file-system boundary (git stops there).
    """
    if any(name in env for name in _GIT_DISCOVERY):
        raise Unsure
    uid = os.geteuid()
    here = cwd
    device = os.stat(here).st_dev
    while True:
        if os.path.basename(here) == ".git" or _is_git_dir(here):
            raise Unsure  # inside a repository's own directory (or a bare one)
        dot_git = os.path.join(here, ".git")
        try:
            found = os.stat(dot_git)
        except FileNotFoundError:
            found = None
        except OSError:
            raise Unsure from None
        if found is not None:
            if (
                found.st_uid != uid
                or os.stat(here).st_uid != uid
                or not _is_repo(dot_git, found.st_mode)
            ):
                raise Unsure
            return os.path.realpath(here)
        parent = os.path.dirname(here)
        if parent == here:
            return os.path.realpath(cwd)  # no repository above: git fails, and load_config
        if os.stat(parent).st_dev != device:
            raise Unsure
        here = parent


def _is_git_dir(path: str) -> bool:
    return all(os.path.exists(os.path.join(path, name)) for name in ("HEAD", "objects", "refs"))


def _is_repo(dot_git: str, mode: int) -> bool:
    """A ``.git`` directory with a repository's layout, or a gitfile naming a directory (not a
    FIFO or a device, which reading could block on)."""
    if stat.S_ISDIR(mode):
        return _is_git_dir(dot_git)
    if not stat.S_ISREG(mode):
        return False
    try:
        with open(dot_git, "rb") as file:
            line = file.readline(4096).rstrip(b"\r\n")
    except OSError:
        return False
    if not line.startswith(b"gitdir: "):
        return False
    target = os.fsdecode(line[len(b"gitdir: ") :])
    target = os.path.join(os.path.dirname(dot_git), target)  # relative to the .git file
    return os.path.isdir(target) and os.path.exists(os.path.join(target, "HEAD"))


def session_of(explicit: str | None, workspace: str, env: Mapping[str, str]) -> str:
    """``resolve_session``: ``--session``, else ``FLEET_SESSION``, else one id per repository
    root (an invalid id is the full path's usage error)."""
    chosen = explicit or env.get("FLEET_SESSION")
    if chosen:
        if not 1 <= len(chosen) <= 40 or not set(chosen) <= _WORD or chosen[0] in "_-":
            raise Unsure
        return chosen
    name = "".join(c if c in _WORD else "-" for c in os.path.basename(workspace))
    name = name[:24].strip("-") or "root"
    digest = sha256(os.fsencode(workspace)).hexdigest()[:8]
    return f"{name}-{digest}"
