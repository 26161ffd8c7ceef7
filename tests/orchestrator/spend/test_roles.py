"""Model role resolution: the seed's rules as a table of cases, against real files."""

import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator._errors import UsageError
from orchestrator.definitions import EFFORTS as AGENT_EFFORTS
from orchestrator.spend import _roles
from orchestrator.spend._roles import Candidate, first_available, load_roles, resolve

OAI = "openai"
A = "anthropic"


def _write(path: Path, roles: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"roles": roles}), encoding="utf-8")


def _setup(tmp_path: Path, global_roles: object, project_roles: object | None) -> tuple[Path, Path]:
    home = tmp_path / "home"
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _write(home / "roles.yaml", global_roles)
    if project_roles is not None:
        _write(repo / ".fleet" / "roles.yaml", project_roles)
    return home, repo / "sub"


def _c(provider: str, model: str, effort: str = "") -> Candidate:
    return Candidate(provider=provider, model=model, effort=effort)


CASES = [
    # (id, global, project, role, expected candidates)
    ("plain", {"w": "openai/gpt-5"}, None, "w", [_c(OAI, "gpt-5")]),
    ("effort", {"w": "openai/gpt-5:high"}, None, "w", [_c(OAI, "gpt-5", "high")]),
    ("unassigned", {"w": "openai/gpt-5"}, None, "scout", []),
    (
        "fallbacks in order",
        {"w": {"model": "anthropic/opus", "fallbacks": ["openai/gpt-5:low", "openai/mini"]}},
        None,
        "w",
        [_c(A, "opus"), _c(OAI, "gpt-5", "low"), _c(OAI, "mini")],
    ),
    (
        "alias effort wins over target",
        {"s": "@w:low", "w": "openai/gpt-5:high"},
        None,
        "s",
        [_c(OAI, "gpt-5", "low")],
    ),
    (
        "first alias effort wins",
        {"a": "@b:minimal", "b": "@c:high", "c": "openai/m"},
        None,
        "a",
        [_c(OAI, "m", "minimal")],
    ),
    (
        "alias without effort keeps the target's",
        {"a": "@b", "b": "openai/m:medium"},
        None,
        "a",
        [_c(OAI, "m", "medium")],
    ),
    (
        "five hops resolve",
        {"r0": "@r1", "r1": "@r2", "r2": "@r3", "r3": "@r4", "r4": "@r5", "r5": "openai/m"},
        None,
        "r0",
        [_c(OAI, "m")],
    ),
    (
        "alias inherits target fallbacks",
        {"s": "@w", "w": {"model": "openai/a", "fallbacks": ["openai/b"]}},
        None,
        "s",
        [_c(OAI, "a"), _c(OAI, "b")],
    ),
    (
        "alias with own fallbacks keeps them",
        {
            "s": {"model": "@w", "fallbacks": []},
            "w": {"model": "openai/a", "fallbacks": ["openai/b"]},
        },
        None,
        "s",
        [_c(OAI, "a")],
    ),
    (
        "fallback alias resolves to its primary",
        {"w": {"model": "openai/a", "fallbacks": ["@cheap:low"]}, "cheap": "openai/mini:high"},
        None,
        "w",
        [_c(OAI, "a"), _c(OAI, "mini", "low")],
    ),
    (
        "project wins per role",
        {"w": "openai/a", "s": "openai/s"},
        {"w": "anthropic/b"},
        "w",
        [_c(A, "b")],
    ),
    (
        "project leaves other roles",
        {"w": "openai/a", "s": "openai/s"},
        {"w": "anthropic/b"},
        "s",
        [_c(OAI, "s")],
    ),
    (
        "project without fallbacks inherits the global list",
        {"w": {"model": "openai/a", "fallbacks": ["openai/b"]}},
        {"w": "anthropic/c"},
        "w",
        [_c(A, "c"), _c(OAI, "b")],
    ),
    (
        "explicit empty project list disables the inherited one",
        {"w": {"model": "openai/a", "fallbacks": ["openai/b"]}},
        {"w": {"model": "anthropic/c", "fallbacks": []}},
        "w",
        [_c(A, "c")],
    ),
    (
        "base url kept",
        {"w": "openai/m@http://127.0.0.1:9/v1:low"},
        None,
        "w",
        [Candidate(provider=OAI, model="m", effort="low", base_url="http://127.0.0.1:9/v1")],
    ),
]


@pytest.mark.parametrize(
    ("global_roles", "project", "role", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_resolution(
    tmp_path: Path, global_roles: object, project: object, role: str, expected: list[Candidate]
) -> None:
    home, cwd = _setup(tmp_path, global_roles, project)
    resolution = resolve(load_roles(home, cwd), role)
    assert list(resolution.candidates) == expected
    assert resolution.assigned is bool(expected)


BAD = [
    ("cycle", {"a": "@b", "b": "@a"}, "a", "role 'a': alias cycle a -> b -> a"),
    ("self cycle", {"a": "@a"}, "a", "alias cycle a -> a"),
    (
        "six hops",
        {f"r{i}": f"@r{i + 1}" for i in range(6)} | {"r6": "openai/m"},
        "r0",
        "more than 5 alias hops",
    ),
    ("dangling alias", {"a": "@nope"}, "a", "alias @nope names no configured role"),
    (
        "dangling fallback",
        {"a": {"model": "openai/m", "fallbacks": ["@nope"]}},
        "a",
        "fallback @nope",
    ),
]


@pytest.mark.parametrize(
    ("roles", "role", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_chains_are_one_clear_line(
    tmp_path: Path, roles: object, role: str, message: str
) -> None:
    home, cwd = _setup(tmp_path, roles, None)
    with pytest.raises(UsageError) as info:
        resolve(load_roles(home, cwd), role)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


SPECS = [
    ("no provider", {"w": "gpt-5"}, "must be provider/model[:effort] or @role"),
    ("bad effort", {"w": "openai/gpt-5:huge"}, "effort 'huge' is not one of off, minimal"),
    ("empty", {"w": ""}, "must be provider/model"),
    ("not a string", {"w": {"model": 5}}, "spec 5 must be"),
    (
        "fallbacks not a list",
        {"w": {"model": "openai/a", "fallbacks": "openai/b"}},
        "fallbacks must be a list",
    ),
    ("bad fallback", {"w": {"model": "openai/a", "fallbacks": ["nope"]}}, "fallback: spec 'nope'"),
    ("unknown key", {"w": {"model": "openai/a", "fallback": []}}, "must be a spec or a mapping"),
    ("bad role name", {"9w": "openai/a"}, "role name '9w' is invalid"),
    ("bad alias", {"w": "@"}, "alias '@' names no valid role"),
    ("bad url", {"w": "openai/m@ftp://x"}, "base URL"),
]


@pytest.mark.parametrize(("roles", "message"), [s[1:] for s in SPECS], ids=[s[0] for s in SPECS])
def test_bad_specs_are_one_clear_line(tmp_path: Path, roles: object, message: str) -> None:
    home, cwd = _setup(tmp_path, {}, roles)
    with pytest.raises(UsageError) as info:
        load_roles(home, cwd)
    text = str(info.value)
    assert message in text, text
    assert str(cwd.parent / ".fleet" / "roles.yaml") in text
    assert "\n" not in text


def test_bad_yaml_and_top_level(tmp_path: Path) -> None:
    home, cwd = _setup(tmp_path, {}, None)
    (home / "roles.yaml").write_text("roles: [unclosed\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"roles .*roles.yaml: .*\(fix or remove the file\)"):
        load_roles(home, cwd)
    (home / "roles.yaml").write_text("models: {}\n", encoding="utf-8")
    with pytest.raises(UsageError, match="one key, roles"):
        load_roles(home, cwd)


def test_no_files_means_no_roles(tmp_path: Path) -> None:
    assert load_roles(tmp_path / "nohome", tmp_path) == {}


def test_first_available_needs_backend_and_key() -> None:
    cands = [_c(A, "opus"), _c(OAI, "gpt-5", "low")]
    assert first_available(cands, "builtin", {"OPENAI_API_KEY": "k"}) == cands[1]
    assert first_available(cands, "builtin", {"ANTHROPIC_API_KEY": "k"}) is None
    assert first_available(cands, "pi", {"ANTHROPIC_API_KEY": "k"}) == cands[0]
    local = Candidate(provider=OAI, model="m", base_url="http://h/v1")
    assert first_available([local], "codex", {}) == local
    assert first_available(cands, "claude", {"OPENAI_API_KEY": "k"}) is None
    assert first_available(cands, "codex", {"OPENAI_API_KEY": ""}) is None
    assert first_available(cands, "codex", {"OPENAI_API_KEY": "k"}) == cands[1]


def test_model_text_per_backend() -> None:
    c = Candidate(provider=OAI, model="m", base_url="http://127.0.0.1:9/v1")
    assert c.model_text("builtin") == "openai:m@http://127.0.0.1:9/v1"
    assert c.model_text("pi") == "openai:m@http://127.0.0.1:9/v1"
    assert c.model_text("codex") == "openai:m@http://127.0.0.1:9/v1"
    vendor = Candidate(provider=OAI, model="m")
    assert vendor.model_text("pi") == "openai/m"
    assert vendor.model_text("codex") == "m"


def test_efforts_match_agent_definitions() -> None:
    assert _roles.EFFORTS == AGENT_EFFORTS
