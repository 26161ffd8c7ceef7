"""place(): the environment tells a CLI backend whether fleet really wrapped it, and no extra
path it shows may bring back what the sandbox hides."""

import tempfile
from pathlib import Path

import attrs
import pytest

import ipc
import sandbox
from orchestrator._config import Config
from orchestrator._errors import PolicyError
from orchestrator._runtime import ensure_session_runtime, register_home
from orchestrator.launch._sandboxing import (
    SANDBOXED_ENV,
    checked_visible,
    child_spec,
    hidden_paths,
    outermost,
    place,
)


def loadout(tmp_path) -> ipc.Loadout:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return ipc.Loadout(
        session="t",
        owner="a1",
        name="scout-1",
        agent="scout",
        token="x" * 64,
        socket="",
        workspace=str(workspace),
        sandbox="read_only",
    )


def test_an_unwrapped_child_is_told_so_whatever_the_supervisor_inherited(tmp_path, monkeypatch):
    monkeypatch.setenv(SANDBOXED_ENV, "1")  # a stray value in the user's own shell
    config = Config(
        home=tmp_path / "h", session="t", workspace=tmp_path, sandbox="off", allow_unsandboxed=True
    )
    placement = place(("true",), config=config, loadout=loadout(tmp_path), scratch=tmp_path)
    assert not placement.sandboxed
    assert placement.env[SANDBOXED_ENV] == "0"


def test_a_wrapped_child_is_told_it_is_inside(tmp_path):
    if not sandbox.probe().available:
        raise AssertionError(f"no sandbox here: {sandbox.probe().reason} (install bubblewrap)")
    (tmp_path / "h").mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = Config(home=tmp_path / "h", session="t", workspace=tmp_path)
    placement = place(("true",), config=config, loadout=loadout(tmp_path), scratch=scratch)
    assert placement.sandboxed
    assert placement.env[SANDBOXED_ENV] == "1"


def _scripted(tmp_path, script: Path) -> ipc.Loadout:
    return attrs.evolve(loadout(tmp_path), model=ipc.ModelSpec(kind="scripted", script=str(script)))


def test_a_model_path_that_would_unhide_a_tree_is_refused_and_one_beside_the_repo_is_shown(
    tmp_path,
):
    home = tmp_path / "h"
    (home / "sessions").mkdir(parents=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = Config(home=home, session="t", workspace=tmp_path / "ws")
    # Its directory would be bound over the sandbox's own /tmp (every session's sockets there,
    # tmux's included), or bring back the state directory the sandbox hides.
    in_tmp = Path(tempfile.mkstemp(prefix="fleet-model-", suffix=".yaml", dir="/tmp")[1])
    in_home = home / "sessions" / "model.yaml"
    in_home.write_text("turns: []\n")
    try:
        for script, shown in ((in_tmp, "the host's '/tmp'"), (in_home, f"hidden {str(home)!r}")):
            with pytest.raises(PolicyError, match=f"sandbox refused: .* would show {shown}"):
                place(
                    ("true",), config=config, loadout=_scripted(tmp_path, script), scratch=scratch
                )
    finally:
        in_tmp.unlink()
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.yaml").write_text("turns: []\n")
    placement = place(
        ("true",), config=config, loadout=_scripted(tmp_path, models / "m.yaml"), scratch=scratch
    )
    assert placement.sandboxed
    assert str(models) in placement.argv  # bound read-only for the child


SEATBELT = sandbox.ProbeResult(available=True, launcher="sandbox-exec", reason="", version="14")


def _fenced_world(tmp_path, monkeypatch) -> tuple[Config, dict[str, Path]]:
    """A session, another fleet's home, a fleet home that holds the workspace, and a private
    runtime root holding this session's egress socket."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    other, holder = tmp_path / "other", tmp_path / "holder"
    workspace = holder / "repo"
    for path in (other, workspace, tmp_path / "h"):
        path.mkdir(parents=True)
    register_home(other)
    register_home(holder)
    config = Config(home=tmp_path / "h", session="t", workspace=workspace)
    ensure_session_runtime(config.paths.runtime)
    config.paths.egress.mkdir(mode=0o700)
    egress = config.paths.egress / "a1.sock"
    egress.write_text("")  # stands in for the socket: only its path matters here
    return config, {"xdg": xdg, "other": other, "holder": holder, "egress": egress}


def test_every_child_hides_its_home_the_runtime_root_and_every_other_fleets_home(
    tmp_path, monkeypatch
):
    config, world = _fenced_world(tmp_path, monkeypatch)
    hidden = hidden_paths(config)
    assert hidden[0] == tmp_path / "h"
    assert world["xdg"] in hidden  # the whole XDG runtime directory
    assert world["other"] in hidden
    # A fleet home holding this workspace: its state hidden, the repository still shown.
    assert world["holder"] / "sessions" in hidden
    assert world["holder"] not in hidden
    assert checked_visible([config.workspace], hidden) == [config.workspace]


def test_a_fleet_started_after_a_look_is_hidden_at_the_next(tmp_path, monkeypatch):
    """The fence is looked up at each launch: a child launched after another fleet registered
    its home (one queued since its spawn) hides that home too."""
    config, world = _fenced_world(tmp_path, monkeypatch)
    before = hidden_paths(config)
    later = tmp_path / "later-home"
    later.mkdir()
    register_home(later)
    assert later not in before
    assert later in hidden_paths(config)
    assert world["holder"] / "sessions" in hidden_paths(config)


def test_the_seatbelt_profile_denies_every_fleets_home_and_sockets_but_the_childs_egress(
    tmp_path, monkeypatch
):
    config, world = _fenced_world(tmp_path, monkeypatch)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spec = child_spec(
        policy=sandbox.Policy.READ_ONLY,
        workspace=config.workspace,
        scratch=scratch,
        visible=(),
        hidden=hidden_paths(config),
        egress=world["egress"],
    )
    wrapped = sandbox.wrap(["/bin/true"], spec, platform="darwin", probe_result=SEATBELT)
    assert wrapped.wrapped
    profile = wrapped.argv[2]
    params = dict(arg[2:].split("=", 1) for arg in wrapped.argv if arg.startswith("-D"))
    hidden = {value for name, value in params.items() if name.startswith("HIDDEN_")}
    for path in (tmp_path / "h", world["xdg"], world["other"]):
        assert str(path) in hidden, (path, hidden)
    names = [name for name, value in params.items() if value == str(world["xdg"])]
    for name in names:
        # Unreadable, unwritable and no socket below it reachable...
        assert f'(subpath (param "{name}"))' in profile.split("(deny file-read*")[1]
        assert f'(remote unix-socket (subpath (param "{name}")))' in profile
    # ...but the child's own egress socket, allowed back after the denial.
    shown = [name for name, value in params.items() if value == str(world["egress"])]
    assert any(name.startswith("SHOWN_") for name in shown)
    assert profile.index("(deny network-outbound") < profile.index("(allow network-outbound")


def test_outermost_keeps_the_first_of_each_tree_in_order() -> None:
    paths = [Path(p) for p in ("/a/b", "/c", "/a", "/ab", "/c/d/e", "/a", "/z/y")]
    assert outermost(paths) == (Path("/c"), Path("/a"), Path("/ab"), Path("/z/y"))
    # 200 homes (a registry on a busy box): one pass over each path's parents, not all pairs.
    many = [Path(f"/homes/h{i}/state") for i in range(200)] + [Path("/homes/h7")]
    assert outermost(many) == (*many[:7], *many[8:200], Path("/homes/h7"))


def test_a_remote_plan_looks_the_fence_up_only_for_a_sandbox(tmp_path, monkeypatch, another_fleet):
    """A node plan with the sandbox off has no view to hide anything from: the registry of
    fleet homes is not read for it. With a sandbox, another fleet's home is in its plan."""
    from orchestrator.launch import _nodeplan  # noqa: PLC0415 - the plan's own lookup

    _, other = another_fleet
    config = Config(home=tmp_path / "h", session="t", workspace=tmp_path)
    plan = _nodeplan.plan_for(config, loadout(tmp_path), argv_tail=(), loadout_file="/x")
    assert str(other) in plan.hidden

    def refused(_config: Config) -> list[Path]:
        raise AssertionError("the fence was looked up for an unsandboxed child")

    monkeypatch.setattr(_nodeplan, "hidden_paths", refused)
    off = attrs.evolve(config, sandbox="off", allow_unsandboxed=True)
    plan = _nodeplan.plan_for(off, loadout(tmp_path), argv_tail=(), loadout_file="/x")
    assert plan.hidden == ()
    assert plan.sandbox_off
