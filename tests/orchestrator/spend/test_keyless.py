"""Which variables a sandboxed child gets blanked, which a placeholder, which it keeps."""

import pytest

from orchestrator.spend._keyless import PLACEHOLDER, carries_credentials, is_credential, keyless


@pytest.mark.parametrize(
    "name",
    [
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "GEMINI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "HF_TOKEN",
        "NPM_TOKEN",
        "TOKEN",
        "PGPASSWORD",
        "DB_PASSWD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SSH_PRIVATE_KEY",
        "azure_openai_api_key",
        "DJANGO_SECRET",
        "MY_APIKEY",
    ],
)
def test_credentials_are_recognised(name):
    assert is_credential(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "HOME",
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "TOKENIZERS_PARALLELISM",
        "KEYBOARD",
        "FLEET_EGRESS_SOCKET",
        "FLEET_MODEL_GATEWAY",
        "SSL_CERT_FILE",
        "LANG",
    ],
)
def test_ordinary_variables_are_not(name):
    assert not is_credential(name)


def test_a_child_keeps_what_is_granted_and_gets_a_placeholder_for_its_model_key():
    env = {
        "PATH": "/usr/bin",
        "OPENAI_API_KEY": "sk-real",
        "ANTHROPIC_API_KEY": "sk-ant-real",
        "AWS_SECRET_ACCESS_KEY": "aws-real",
        "GITHUB_TOKEN": "ghp-granted",
        "EMPTY_TOKEN": "",
    }
    out = keyless(env, granted=["GITHUB_TOKEN"], placeholder=["OPENAI_API_KEY", "MISSING_KEY"])
    assert out == {
        "PATH": "/usr/bin",
        "OPENAI_API_KEY": PLACEHOLDER,
        "ANTHROPIC_API_KEY": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "GITHUB_TOKEN": "ghp-granted",
        "EMPTY_TOKEN": "",
    }
    assert "MISSING_KEY" not in out  # no key to hold: none is invented
    assert carries_credentials(out)  # the granted one
    assert not carries_credentials(keyless(env, placeholder=["OPENAI_API_KEY"]))
