"""place(): the environment tells a CLI backend whether fleet really wrapped it."""

import ipc
import sandbox
from orchestrator._config import Config
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
