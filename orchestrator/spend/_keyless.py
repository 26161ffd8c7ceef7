"""Keyless children: what a sandboxed child gets in place of the user's credentials.

A sandboxed child's model traffic passes the model gateway (:mod:`._gateway`), which holds the
real key and sets it on each request on the way out. So the child needs no key at all, and it
gets none:

- every variable of the supervisor's environment that looks like a credential
  (:func:`is_credential`: ``*_API_KEY``, ``*_TOKEN``, ``*SECRET*``, ``*PASSWORD*``, … — the
  model's key and a user's ``AWS_SECRET_ACCESS_KEY`` alike) is blanked in the child's
  environment, unless the child's definition grants it by name (``env:``);
- the model's own key variable, when the supervisor has it, is set to :data:`PLACEHOLDER`
  instead, so a CLI that refuses to start without a key starts, and what it sends is replaced;
- :data:`GATEWAY_ENV` names the model URL the gateway serves, so the child's runtime points
  its model client at a plain-HTTP port of its relay instead (``child/backends/_egress.py``);
  the gateway makes the upstream TLS connection.

Blanked rather than removed: a terminal's server passes its own environment on, and only a
value set for the window replaces it. A child that still needs the real key — one whose model
the gateway cannot serve — keeps today's environment, and says so in its run log.
"""

import re
from collections.abc import Collection, Mapping
from typing import Final

__all__ = ["GATEWAY_ENV", "PLACEHOLDER", "carries_credentials", "is_credential", "keyless"]

#: The value a child's model key variable holds: the gateway replaces what is sent with it.
PLACEHOLDER: Final = "fleet-gateway-placeholder"
#: The model URL the gateway serves for this child (``child.backends._egress`` reads it).
GATEWAY_ENV: Final = "FLEET_MODEL_GATEWAY"
_CREDENTIAL: Final = re.compile(
    r"API_?KEY|ACCESS_?KEY|AUTH_?TOKEN|OAUTH|(?:^|_)TOKEN(?:$|_)|SECRET|PASSWORD|PASSWD"
    r"|CREDENTIAL|PRIVATE_?KEY|(?:^|_)SESSION_?KEY",
    re.IGNORECASE,
)


def is_credential(name: str) -> bool:
    """Whether a variable named *name* looks like it holds a credential."""
    return _CREDENTIAL.search(name) is not None


def keyless(
    env: Mapping[str, str], *, granted: Collection[str] = (), placeholder: Collection[str] = ()
) -> dict[str, str]:
    """*env* with every credential blanked but those *granted* by name, and each variable of
    *placeholder* that is set (non-empty) holding :data:`PLACEHOLDER` instead."""
    out = dict(env)
    for name, value in env.items():
        if name in placeholder and value:
            out[name] = PLACEHOLDER
        elif value and is_credential(name) and name not in granted:
            out[name] = ""
    return out


def carries_credentials(env: Mapping[str, str]) -> bool:
    """Whether *env* holds a credential's value (not blank, not the placeholder)."""
    return any(v and v != PLACEHOLDER and is_credential(k) for k, v in env.items())
