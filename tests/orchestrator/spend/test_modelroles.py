"""Spawn-time model roles: which role a spawn runs on and the candidates its loadout carries."""

from pathlib import Path
from typing import Any

import pytest

from orchestrator._config import load_config
from orchestrator._errors import UsageError
from orchestrator._records import SpawnRequest
from orchestrator.core._plan import plan_spawn
from orchestrator.definitions import AgentDefinitionError, parse_agent
from orchestrator.spend._roles import _entries

URL = "http://127.0.0.1:9/v1"
ROLES = _entries(
    {
        "roles": {
            "worker": {
                "model": f"openai/big@{URL}:high",
                "fallbacks": ["openai/gpt-5:low", f"openai/small@{URL}"],
            },
            "scout": "@worker:minimal",
            "reviewer": "anthropic/opus",
            "cheap": f"openai/small@{URL}",
        }
    },
    "test",
)


def definition(front: str):
    text = f"---\nname: d\ndescription: x\n{front}\n---\nPrompt.\n"
    return parse_agent(text, path=Path("/defs/d.md"), source="user")


def plan(tmp_path: Path, *, front: str = "", backend: str = "builtin", **request: Any):
    config = load_config(cwd=tmp_path, home=tmp_path / "home")
    return plan_spawn(
        SpawnRequest(task="t", agent="d", backend=backend, **request),
        definitions={"d": definition(front)},
        config=config,
        workflow_mode="build",
        roles=ROLES,
    )


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FLEET_MODEL"):
        monkeypatch.delenv(key, raising=False)


def specs(p) -> list[str]:
    return [m.spec for m in p.loadout_fields["models"]]


def test_a_definition_role_picks_the_first_available_candidate(tmp_path, monkeypatch):
    p = plan(tmp_path, front="role: worker")
    # No OPENAI_API_KEY: the vendor endpoint is unavailable, the local ones need no key.
    assert p.role == "worker"
    assert specs(p) == [f"openai/big@{URL}:high", f"openai/small@{URL}"]
    assert p.loadout_fields["model"].name == "big"
    assert p.loadout_fields["model"].base_url == URL
    assert p.loadout_fields["effort"] == "high"
    assert p.model_label == f"openai/big@{URL}:high"
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert specs(plan(tmp_path, front="role: worker"))[1] == "openai/gpt-5:low"


def test_model_at_role_in_a_definition_and_its_effort(tmp_path):
    p = plan(tmp_path, front='model: "@worker:low"')
    assert p.role == "worker"
    assert p.loadout_fields["effort"] == "low"
    assert p.loadout_fields["models"][1].effort == ""


def test_the_definition_effort_fills_candidates_without_one(tmp_path):
    p = plan(tmp_path, front="role: cheap\neffort: medium")
    assert p.loadout_fields["effort"] == "medium"


def test_the_mode_picks_the_default_role(tmp_path):
    p = plan(tmp_path, front="mode: scout")
    assert p.role == "scout"
    assert p.loadout_fields["effort"] == "minimal"  # the alias's effort wins over the target's
    assert specs(p)[0] == f"openai/big@{URL}:minimal"


def test_a_spawn_role_or_model_overrides_the_definition(tmp_path):
    assert plan(tmp_path, front="role: worker", role="cheap").role == "cheap"
    assert plan(tmp_path, front="role: worker", model="@cheap").role == "cheap"
    concrete = plan(tmp_path, front="role: worker", model=f"openai:other@{URL}")
    assert concrete.role == ""
    assert concrete.loadout_fields["models"] == []
    assert concrete.loadout_fields["model"].name == "other"
    assert concrete.model_label == f"openai:other@{URL}"


def test_nothing_available_follows_the_current_model(tmp_path, monkeypatch):
    # The reviewer role is Anthropic: the builtin agent cannot drive it; FLEET_MODEL is used.
    (tmp_path / "s.yaml").write_text("turns: []\n")
    monkeypatch.setenv("FLEET_MODEL", "scripted:s.yaml")
    p = plan(tmp_path, front="mode: fork")
    assert p.role == ""
    assert p.loadout_fields["model"].kind == "scripted"
    # The claude backend can, once the key is there.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    claude = plan(tmp_path, front="mode: fork", backend="claude")
    assert claude.role == "reviewer"
    assert claude.loadout_fields["model"].kind == "native"
    assert claude.loadout_fields["model"].name == "opus"


def test_egress_covers_every_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    p = plan(tmp_path, front="role: worker", backend="codex")
    assert "127.0.0.1:9" in p.loadout_fields["egress"]
    assert "api.openai.com:443" in p.loadout_fields["egress"]


def test_bad_role_requests_are_one_clear_line(tmp_path):
    with pytest.raises(UsageError, match="no model role 'nope' is configured"):
        plan(tmp_path, role="nope")
    with pytest.raises(UsageError, match="a model or a role, not both"):
        plan(tmp_path, role="cheap", model="@worker")
    with pytest.raises(AgentDefinitionError, match="role: is given with model"):
        definition("role: worker\nmodel: openai:x")
    with pytest.raises(AgentDefinitionError, match="is not a role name"):
        definition("role: 'no spaces'")


def test_a_batch_entry_may_name_a_role():
    assert SpawnRequest.from_mapping({"task": "t", "role": "worker"}).role == "worker"
    with pytest.raises(UsageError, match="role must be a string"):
        SpawnRequest.from_mapping({"task": "t", "role": 3})
