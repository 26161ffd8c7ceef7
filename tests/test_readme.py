"""The README's code blocks, run as written: the shell section top to bottom (scripted models),
its ``openai:`` line against the loopback model server, and the Python program as pasted."""

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli._main import build_parser
from tests._needs import REPO
from tests.fakes.model_server import ModelServer

#: a real session: supervisor, sandboxed children, the CLI
needs_session = pytest.mark.needs("git", "sandbox")

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```$", README, re.MULTILINE | re.DOTALL)
[SHELL] = [text for lang, text in BLOCKS if lang == "sh" and "source .venv" in text]
[OPENAI] = [text for lang, text in BLOCKS if lang == "sh" and text.startswith("fleet spawn")]
[PYTHON] = [text for lang, text in BLOCKS if lang == "python"]
LOCAL_URL = "http://127.0.0.1:11434/v1"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small repository with the README's example scripts and its own `.venv` (this one's)."""
    path = tmp_path / "repo"
    (path / "src" / "cli").mkdir(parents=True)
    (path / "src" / "cli" / "main.py").write_text("def main():\n    pass\n")
    (path / "pricing.py").write_text("def round_price(x):\n    return round(x, 2)\n")
    shutil.copytree(REPO / "examples", path / "examples")
    (path / ".venv").symlink_to(REPO / ".venv")
    (path / ".gitignore").write_text(".venv\n")
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *command]
        subprocess.run(git, cwd=path, check=True)
    return path


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    # A short FLEET_HOME: the session's socket path must fit in sun_path.
    home = Path(tempfile.mkdtemp(prefix="flr-", dir="/tmp"))
    (tmp_path / "user").mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "VIRTUAL_ENV"))}
    yield keep | {"FLEET_HOME": str(home), "HOME": str(tmp_path / "user")}
    # The session is the repository's: stop it from there (from tmp_path, `serve --stop`
    # names another session and the README's supervisor would be left running).
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "fleet"), "serve", "--stop"],
        env=keep | {"FLEET_HOME": str(home)},
        cwd=tmp_path / "repo" if (tmp_path / "repo").is_dir() else tmp_path,
        capture_output=True,
        check=False,
        timeout=60,
    )
    shutil.rmtree(home, ignore_errors=True)


def bash(script: str, repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.slow
@needs_session
def test_the_shell_section_runs_top_to_bottom(repo, env):
    done = bash(SHELL, repo, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "Steered to: Only look under src/" in out  # steer reached a working a2
    assert "Looked for Python files for the task: Find where prices are rounded" in out
    assert "I globbed **/*.py and reported the Python files I found." in out  # ask a1
    [stopped] = [line for line in out.splitlines() if line.startswith('{"handoffs"')]
    assert [h["key"] for h in json.loads(stopped)["handoffs"]] == ["a1", "a2"]
    assert out.rstrip().splitlines()[-1] == "supervisor stopped"


@pytest.mark.slow
@needs_session
def test_the_openai_line_reaches_an_openai_compatible_server(repo, env):
    with ModelServer() as srv:
        srv.default_script([{"text": "## Summary\nthe entry point is src/cli/main.py"}])
        line = OPENAI.replace(LOCAL_URL, srv.base_url("readme") + "/v1")
        assert line != OPENAI
        done = bash(f"source .venv/bin/activate\n{line}fleet wait a1", repo, env)
        [request] = [r for r in srv.requests("readme") if r.api]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the entry point is src/cli/main.py" in done.stdout
    assert request.body["model"] == "qwen2.5-coder"


@pytest.mark.slow
@needs_session
def test_the_python_program_runs_as_pasted(repo, env, tmp_path):
    program = tmp_path / "program.py"
    program.write_text(PYTHON)
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), str(program)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Looked for Python files for the task: find the config loader" in done.stdout
    assert "pricing.py" in done.stdout


def test_docs_cli_lists_every_model_form_the_parser_takes_and_the_help_says_so():
    forms = ["scripted:PATH", "openai:MODEL", "openai:MODEL@URL", "anthropic:MODEL"]
    forms += ["anthropic:MODEL@URL", "a bare name"]
    cli_doc = (REPO / "docs" / "cli.md").read_text()
    for form in forms:
        assert f"| `{form}`" in cli_doc or f"| {form}" in cli_doc, form
    [verbs] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    spawn = verbs.choices["spawn"]
    [model] = [a for a in spawn._actions if "--model" in a.option_strings]
    for form in ("scripted:FILE", "openai:MODEL[@URL]", "anthropic:MODEL[@URL]", "bare name"):
        assert form in (model.help or ""), form
