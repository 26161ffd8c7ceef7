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
from orchestrator.launch._sandboxing import SANDBOXED_ENV, place


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
