"""The agent CLIs' environment: private dirs, secrets by name, no proxies, version probe, stall."""

import stat
from pathlib import Path

import pytest

from child.backends._cli_env import (
    CliError,
    PrivateDirs,
    Version,
    binary_for,
    cli_environment,
    probe_version,
    stall_seconds,
)


def test_private_dirs_live_under_scratch_and_are_removed(tmp_path):
    dirs = PrivateDirs.create(str(tmp_path), "codex")
    assert dirs.root.parent == tmp_path
    for path in (dirs.home, dirs.tmp, dirs.config):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert dirs.tmp not in dirs.config.parents  # codex breaks when its home is inside TMPDIR
    dirs.remove()
    assert not dirs.root.exists()


def test_the_environment_holds_only_listed_secrets_and_no_proxy(tmp_path):
    dirs = PrivateDirs.create(str(tmp_path), "pi")
    source = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "OPENAI_API_KEY": "sk-listed",
        "ANTHROPIC_API_KEY": "sk-not-listed",
        "HTTPS_PROXY": "http://proxy:3128",
        "http_proxy": "http://proxy:3128",
        "HOME": "/root",
    }
    env = cli_environment(
        dirs,
        secrets=["OPENAI_API_KEY", "HTTPS_PROXY", "MISSING"],
        extra={"PI_OFFLINE": "1"},
        source=source,
    )
    assert env["OPENAI_API_KEY"] == "sk-listed"
    assert "ANTHROPIC_API_KEY" not in env
    assert not {k for k in env if k.lower().endswith("_proxy")}
    assert "MISSING" not in env
    assert env["HOME"] == str(dirs.home)
    assert env["TMPDIR"] == str(dirs.tmp)
    assert (env["PATH"], env["PI_OFFLINE"], env["FLEET_CHILD"]) == ("/usr/bin", "1", "1")


def test_stall_seconds_and_binary_come_from_the_environment():
    assert stall_seconds({"FLEET_STALL_TIMEOUT": "2.5"}) == 2.5
    assert stall_seconds({"FLEET_STALL_TIMEOUT": "-1"}) == 180.0
    assert stall_seconds({"FLEET_STALL_TIMEOUT": "soon"}) == 180.0
    assert stall_seconds({}) == 180.0
    assert binary_for("codex", "codex", {"FLEET_CODEX_BIN": "/opt/codex"}) == "/opt/codex"
    assert binary_for("codex", "codex", {}) == "codex"


def _fake_cli(tmp_path: Path, output: str, code: int = 0) -> Path:
    path = tmp_path / "fake-cli"
    path.write_text(f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("output", "code", "message"),
    [
        ("2.1.197 (Claude Code)", 0, None),
        ("1.0.0", 0, "is version 1.0.0, older than 2.0.0"),
        ("oops", 0, "--version exited 0: oops"),
        ("1.0.0", 3, "--version exited 3: 1.0.0"),
    ],
)
async def test_probe_refuses_old_or_broken_clis_in_one_line(tmp_path, output, code, message):
    cli = _fake_cli(tmp_path, output, code)
    probe = probe_version(
        "claude", str(cli), minimum=Version(2, 0, 0), package="pkg", env={"PATH": "/usr/bin:/bin"}
    )
    if message is None:
        assert await probe == Version(2, 1, 197)
        return
    with pytest.raises(CliError) as caught:
        await probe
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"backend claude: {cli} ")
    assert text.endswith(
        "(install pkg@2.0.0 or newer, or point FLEET_CLAUDE_BIN at it and restart the "
        "supervisor: fleet serve --stop)"
    )
    assert "\n" not in text


async def test_probe_of_a_missing_binary_names_it():
    with pytest.raises(CliError, match=r"^backend codex: nope-codex is not on PATH \(install"):
        await probe_version("codex", "nope-codex", minimum=Version(1, 0, 0), package="p", env={})
