"""Hibernation's settings and journal records (the processes are tests/faults/test_hibernate.py)."""

import orjson
import pytest

from orchestrator._config import load_config
from orchestrator._errors import UsageError
from orchestrator.durability import fold, parse_journal


def test_hibernation_settings_are_read_from_the_config_file_and_checked(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = load_config(session="s", cwd=tmp_path, home=home)
    assert (config.hibernate_after_s, config.max_retained) == (None, 64)
    (home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n  max_retained: 100\n")
    config = load_config(session="s", cwd=tmp_path, home=home)
    assert (config.hibernate_after_s, config.max_retained) == (0, 100)
    (home / "config.yaml").write_text("subagents:\n  hibernate_after_s: soon\n")
    with pytest.raises(UsageError, match="hibernate_after_s 'soon' must be a number of seconds"):
        load_config(session="s", cwd=tmp_path, home=home)
    (home / "config.yaml").write_text("subagents:\n  max_retained: 0\n")
    with pytest.raises(UsageError, match=r"max_retained 0 must be a whole number in 1\.\.4096"):
        load_config(session="s", cwd=tmp_path, home=home)


def _line(**obj: object) -> bytes:
    return orjson.dumps({"v": 1, "at": 1.5, "key": "a1", **obj}) + b"\n"


def test_a_hibernated_child_is_not_ended_so_a_new_supervisor_can_revive_it() -> None:
    data = b"".join(
        [
            _line(seq=1, kind="spawn", agent="scout", backend="pi"),
            _line(seq=2, kind="settled", state="idle", report="first"),
            _line(seq=3, kind="hibernate", state="hibernated"),
        ]
    )
    [a1] = fold(parse_journal(data).records).values()
    assert a1.state == "hibernated"
    assert not a1.ended
    assert a1.keep
    woke = data + _line(seq=4, kind="wake", state="starting")
    assert fold(parse_journal(woke).records)["a1"].state == "starting"
