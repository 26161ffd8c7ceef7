"""The warm verbs' own path (``cli._fast``, ``cli._locate``) against the full command line.

The fast path may only differ from the full one in what it costs: the same bytes on stdout and
stderr, the same exit code, and for anything it does not handle exactly so, the full path. The
configuration it computes from the environment is compared with ``load_config``, its git
discovery with ``git rev-parse``, and its output with the full path's against a real daemon.
"""

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from orchestrator._config import Config, default_home, load_config, repo_root, resolve_session
from orchestrator._digests import START_SETTINGS, start_digests
from orchestrator._errors import UsageError
from orchestrator.cli import _locate
from orchestrator.cli._fast import parse

# -- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["peek", "--json"], ("peek", True, None, [], False, None)),
        (["--json", "peek", "a1", "a2"], ("peek", True, None, ["a1", "a2"], False, None)),
        (["peek", "--session", "s1", "--locks"], ("peek", False, "s1", [], False, None)),
        (["--session=s2", "peek", "a1", "--json"], ("peek", True, "s2", ["a1"], False, None)),
        (["wait", "--timeout", "0", "--json"], ("wait", True, None, [], False, 0.0)),
        (
            ["wait", "a1", "a2", "--all", "--timeout=2.5"],
            ("wait", False, None, ["a1", "a2"], True, 2.5),
        ),
        (["wait", "--debug", "a1"], ("wait", False, None, ["a1"], False, None)),
    ],
)
def test_the_warm_verbs_are_read_as_argparse_reads_them(argv, expected):
    warm = parse(argv)
    assert warm is not None
    assert (warm.verb, warm.json, warm.session, warm.agents, warm.all, warm.timeout) == expected


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--json"],
        ["spawn", "task"],
        ["peek", "--help"],
        ["-h", "peek"],
        ["peek", "--watch"],
        ["peek", "--js"],  # an abbreviation: argparse's to expand
        ["peek", "--json=1"],
        ["peek", "a1", "--json", "a2"],  # argparse refuses positionals split by an option
        ["peek", "--", "a1"],
        ["peek", "--session"],
        ["peek", "--session", "--json"],
        ["peek", "--all"],
        ["peek", "--max-subagents", "8"],
        ["peek", "--lane", "2"],
        ["peek", "--agent-dirs", "claude"],
        ["peek", "--default-model", "m"],
        ["peek", "--allow-unsandboxed"],
        ["--timeout", "0", "wait"],
        ["wait", "--timeout", "soon"],
        ["wait", "--timeout", "-1"],
        ["wait", "--timeout", "nan"],
        ["wait", "--timeout", "inf"],
        ["wait", "--timeout"],
        ["wait", "--locks"],
        ["wait", "-x"],
    ],
)
def test_anything_else_goes_to_the_full_command_line(argv):
    assert parse(argv) is None


# -- the configuration ----------------------------------------------------------------------


def test_the_start_defaults_are_the_config_defaults():
    defaults = {f.name: f.default for f in attrs.fields(Config)}
    assert {name: defaults[name] for name in START_SETTINGS} == _locate.START_DEFAULTS
    checked = {name: defaults[name] for name in ("max_subagents", "lane")}
    assert checked == _locate.CHECKED_DEFAULTS


ENVIRONMENTS = [
    {},
    {"FLEET_SANDBOX": "off", "FLEET_ALLOW_UNSANDBOXED": "yes", "FLEET_MODEL": "openai:m"},
    {"FLEET_SURFACE": "tmux", "FLEET_IDLE_TIMEOUT_MS": "5000", "FLEET_MAX_TOTAL_MS": "soon"},
    {"FLEET_FORK_SERVER": "No", "FLEET_REJECT_LOG": "1", "FLEET_IDLE_EXIT_S": "0"},
    {"FLEET_IDLE_EXIT_S": "12", "FLEET_MAX_SUBAGENTS": "16", "FLEET_LANE": "64"},
    {"FLEET_ALLOW_UNSANDBOXED": "", "FLEET_FORK_SERVER": "1", "FLEET_MODEL": ""},
]


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_the_start_settings_are_load_configs(tmp_path, monkeypatch, env):
    for name in list(os.environ):
        if name.startswith("FLEET_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load_config(cwd=tmp_path, home=tmp_path / "home")
    fast = _locate.start_settings(os.environ, {})
    for field in START_SETTINGS:
        assert repr(getattr(fast, field)) == repr(getattr(config, field)), field
    assert start_digests(fast, os.environ, "k") == start_digests(config, os.environ, "k")


@pytest.mark.parametrize(
    "env",
    [
        {"FLEET_IDLE_EXIT_S": "-1"},
        {"FLEET_IDLE_EXIT_S": "nan"},
        {"FLEET_IDLE_EXIT_S": "soon"},
        {"FLEET_MAX_SUBAGENTS": "5"},
        {"FLEET_MAX_SUBAGENTS": "many"},
        {"FLEET_LANE": "0"},
    ],
)
def test_what_load_config_refuses_is_left_to_it(tmp_path, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError):
        load_config(cwd=tmp_path, home=tmp_path / "home")
    with pytest.raises(_locate.Unsure):
        _locate.start_settings(os.environ, {})


CONFIG_FILES = [
    "",
    "other: 1\n",
    "subagents: [1]\n",
    "subagents:\n  sandbox: off\n  model: openai:m\n  max_subagents: 8\n  lane: 5\n",
    "subagents:\n  egress: gw:443, proxy:8080\n  idle_exit_s: 60\n  fork_server: false\n",
    "subagents:\n  egress: [gw:443]\n  allow_unsandboxed: yes\n  surface: tmux\n",
    "subagents:\n  idle_timeout_ms: 5000\n  max_total_ms: soon\n  reject_log: 1\n",
    "subagents:\n  notify: null\n  ray_address: auto\n  unknown: 3\n",
]


@pytest.mark.parametrize("text", CONFIG_FILES)
@pytest.mark.parametrize("env", [{}, {"FLEET_SANDBOX": "auto", "FLEET_IDLE_EXIT_S": "7"}])
def test_a_config_file_is_read_as_load_config_reads_it(tmp_path, monkeypatch, text, env):
    for name in list(os.environ):
        if name.startswith("FLEET_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "config.yaml").write_text(text)
    config = load_config(cwd=tmp_path, home=tmp_path)
    fast = _locate.start_settings(os.environ, _locate.file_settings(str(tmp_path)))
    for field in START_SETTINGS:
        assert repr(getattr(fast, field)) == repr(getattr(config, field)), field


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]\n",
        "a: [\n",
        "subagents:\n  max_subagents: 5\n",
        "subagents:\n  max_subagents: '4'\n",
        "subagents:\n  lane: many\n",
        "subagents:\n  lane: 0\n",
        "subagents:\n  idle_exit_s: true\n",
        "subagents:\n  idle_exit_s: -1\n",
        "subagents:\n  egress: 3\n",
        "subagents:\n  egress: [1]\n",
    ],
)
def test_a_config_file_load_config_refuses_is_left_to_it(tmp_path, monkeypatch, text):
    for name in list(os.environ):
        if name.startswith("FLEET_"):
            monkeypatch.delenv(name)
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises((UsageError, TypeError)):
        load_config(cwd=tmp_path, home=tmp_path)
    with pytest.raises(_locate.Unsure):
        _locate.start_settings({}, _locate.file_settings(str(tmp_path)))


def test_notify_agent_dirs_and_unreadable_files_are_left_to_load_config(tmp_path):
    assert _locate.file_settings(str(tmp_path)) == {}  # no file
    for text in ("subagents:\n  notify: {desktop: true}\n", "subagents:\n  agent_dirs: pi\n"):
        (tmp_path / "config.yaml").write_text(text)
        with pytest.raises(_locate.Unsure):
            _locate.file_settings(str(tmp_path))
    (tmp_path / "config.yaml").write_bytes(b"subagents: \xff\n")
    with pytest.raises(_locate.Unsure):
        _locate.file_settings(str(tmp_path))
    with pytest.raises(_locate.Unsure):
        _locate.file_settings(str(tmp_path / "config.yaml"))  # a home that is a file


def test_an_unusual_home_is_left_to_load_config():
    assert _locate.home({"FLEET_HOME": "/a/b"}) == "/a/b"
    for home in ("rel/home", "/a/b/", "/a/./b", "/a//b", "/a/../b"):
        with pytest.raises(_locate.Unsure):
            _locate.home({"FLEET_HOME": home})


def test_without_fleet_home_the_home_is_default_homes(monkeypatch):
    monkeypatch.delenv("FLEET_HOME", raising=False)
    assert _locate.home({"FLEET_HOME": ""}) == str(default_home())
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    assert _locate.home({}) == str(default_home())


@pytest.mark.parametrize(
    ("explicit", "env"),
    [
        (None, {}),
        ("s-1", {}),
        ("", {"FLEET_SESSION": "from_env"}),
        (None, {"FLEET_SESSION": "A" * 40}),
    ],
)
def test_the_session_is_resolve_sessions(explicit, env, monkeypatch):
    monkeypatch.delenv("FLEET_SESSION", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for workspace in ("/", "/srv/my repo.v2", "/x/" + "é" * 30, "/a/--b--"):
        expected = resolve_session(explicit, Path(workspace))
        assert _locate.session_of(explicit, workspace, os.environ) == expected


@pytest.mark.parametrize("session", ["-a", "a b", "é", "A" * 41, "a\n", "_x"])
def test_an_invalid_session_is_left_to_resolve_session(session):
    with pytest.raises(UsageError):
        resolve_session(session, Path("/w"))
    with pytest.raises(_locate.Unsure):
        _locate.session_of(session, "/w", {})


def _git(cwd: Path, *args: str) -> None:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "sub" / "deeper").mkdir(parents=True)
    _git(root, "init", "-q")
    (root / "f").write_text("f\n")
    _git(root, "add", "f")
    _git(root, "commit", "-qm", "f")
    return root


def test_the_repository_root_is_git_s(repo, tmp_path):
    _git(repo, "worktree", "add", "-q", str(tmp_path / "wt"))
    (tmp_path / "link").symlink_to(repo / "sub")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    for cwd in (repo, repo / "sub" / "deeper", tmp_path / "wt", tmp_path / "link"):
        assert _locate.repo_root(os.path.realpath(cwd), env) == str(repo_root(cwd)), cwd


def test_git_s_own_directories_and_variables_are_left_to_git(repo):
    with pytest.raises(_locate.Unsure):
        _locate.repo_root(str(repo / ".git"), {})
    with pytest.raises(_locate.Unsure):
        _locate.repo_root(str(repo / ".git" / "refs"), {})
    with pytest.raises(_locate.Unsure):
        _locate.repo_root(str(repo), {"GIT_DIR": str(repo / ".git")})
    (repo / "sub" / ".git").write_text("gitdir: /nonexistent\n")  # a broken gitfile
    with pytest.raises(_locate.Unsure):
        _locate.repo_root(str(repo / "sub"), {})
    os.mkfifo(repo / "sub" / "deeper" / ".git")  # never opened: reading it would block
    with pytest.raises(_locate.Unsure):
        _locate.repo_root(str(repo / "sub" / "deeper"), {})


# -- against a real daemon ------------------------------------------------------------------

SCRIPT = "turns:\n  - steps:\n      - reply: done\n"
FULL = "from orchestrator.cli._main import main; main()"
#: Run the fast path, then print the modules it loaded on stderr's last line.
TRACED = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
    "from orchestrator.cli._fast import main\n"
    "main()\n"
)


class Daemon:
    def __init__(self, root: Path) -> None:
        self.repo = root / "repo"
        self.repo.mkdir()
        _git(self.repo, "init", "-q")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "GIT_"))}
        # No FLEET_SESSION: both paths find the session from the repository.
        self.env = env | {
            "FLEET_HOME": str(root / "home"),
            "FLEET_SANDBOX": "off",
            "FLEET_ALLOW_UNSANDBOXED": "1",
        }
        self.script = root / "done.yaml"
        self.script.write_text(SCRIPT)

    def run(self, *argv: str, full: bool = False, **env: str) -> subprocess.CompletedProcess[bytes]:
        code = FULL if full else TRACED
        return subprocess.run(
            [sys.executable, "-c", code, *argv],
            cwd=self.repo / "sub" if (self.repo / "sub").exists() else self.repo,
            env=self.env | env,
            capture_output=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("fast", numbered=True))
    (daemon.repo / "sub").mkdir()
    assert daemon.run("serve", full=True).returncode == 0
    try:
        spawn = daemon.run(
            "spawn", "--model", f"scripted:{daemon.script}", "--json", "hello", full=True
        )
        assert spawn.returncode == 0, spawn.stderr
        key = json.loads(spawn.stdout)["agents"][0]["key"]
        settled = daemon.run("wait", key, "--timeout", "60", "--json", full=True)
        assert settled.returncode == 0, settled.stderr
        yield daemon
    finally:
        daemon.run("serve", "--stop", full=True)


HEAVY = {"trio", "cattrs", "yaml", "rich", "argparse", "ipc", "platformdirs", "psutil"}
HEAVY |= {"orchestrator._config", "orchestrator.cli._main", "orchestrator.cli._common"}
#: The human table names states through the record types (attrs); --json needs none of it.
RECORDS = {"attrs", "attr", "orchestrator._records"}


def _masked(out: bytes) -> bytes:
    # How long ago the child's last event was differs between two calls, nothing else does.
    out = re.sub(rb'"last_event_age_s": [0-9.e-]+', b'"last_event_age_s": 0', out)
    return re.sub(rb"  \d+s  ", b"  0s  ", out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["peek", "--json"],
        ["peek"],
        ["--json", "peek", "a1"],
        ["peek", "a9", "--json"],
        ["peek", "a9"],
        ["wait", "--timeout", "0", "--json"],
        ["wait", "--timeout", "0"],
        ["wait", "a9", "--timeout=0", "--json"],
        ["wait", "a1", "--all", "--timeout", "0.2", "--json"],
    ],
)
def test_a_warm_verb_prints_the_full_paths_bytes_without_the_heavy_imports(daemon, argv):
    fast, full = daemon.run(*argv), daemon.run(*argv, full=True)
    *lines, modules = fast.stderr.decode().splitlines()
    assert fast.returncode == full.returncode
    assert _masked(fast.stdout) == _masked(full.stdout)
    assert "\n".join(lines).encode() == full.stderr.rstrip(b"\n")
    heavy = HEAVY | RECORDS if "--json" in argv else HEAVY
    loaded = set(json.loads(modules))
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)


@pytest.mark.slow
def test_a_supervisor_started_otherwise_is_the_same_warning_on_both_paths(daemon):
    drift = {"FLEET_MODEL": "openai:other", "FLEET_IDLE_EXIT_S": "60"}
    fast = daemon.run("peek", "--json", **drift)
    full = daemon.run("peek", "--json", full=True, **drift)
    *lines, modules = fast.stderr.decode().splitlines()
    [warning] = lines
    assert warning.startswith("fleet: warning: the running supervisor (pid ")
    assert "--default-model/FLEET_MODEL, FLEET_IDLE_EXIT_S" in warning
    assert full.stderr.decode() == warning + "\n"
    assert (fast.returncode, _masked(fast.stdout)) == (full.returncode, _masked(full.stdout))
    assert "orchestrator.cli._main" not in json.loads(modules)


@pytest.mark.slow
def test_another_verb_or_a_stopped_daemon_takes_the_full_path(daemon, tmp_path):
    mode = daemon.run("mode", "--json")
    assert mode.returncode == 0
    assert "orchestrator.cli._main" in json.loads(mode.stderr.decode().splitlines()[-1])
    # A session without a supervisor: the full path starts one (here: refuses to, no home).
    elsewhere = Daemon(tmp_path)
    elsewhere.env["FLEET_HOME"] = str(tmp_path / "home-file")
    (tmp_path / "home-file").write_text("not a directory\n")
    fast, full = elsewhere.run("peek", "--json"), elsewhere.run("peek", "--json", full=True)
    assert fast.returncode == full.returncode != 0
    assert fast.stdout == full.stdout
    assert "orchestrator.cli._main" in json.loads(fast.stderr.decode().splitlines()[-1])


@pytest.mark.slow
def test_a_config_file_keeps_the_warm_path(daemon):
    config = Path(daemon.env["FLEET_HOME"]) / "config.yaml"
    config.write_text("subagents:\n  lane: 3\n  egress: []\n  sandbox: off\n")
    try:
        fast, full = daemon.run("peek", "--json"), daemon.run("peek", "--json", full=True)
    finally:
        config.unlink()
    *lines, modules = fast.stderr.decode().splitlines()
    assert (fast.returncode, lines, full.stderr) == (0, [], b"")
    assert _masked(fast.stdout) == _masked(full.stdout)
    loaded = set(json.loads(modules))
    assert "orchestrator.cli._main" not in loaded
    assert "yaml" in loaded
