"""Which model role a spawn runs on, and its available candidates (the seed's rules).

A spawn names a role with ``role`` (``fleet spawn --model @worker``, a batch entry's ``role``)
or its definition does (``role: worker``, or ``model: "@worker[:effort]"``); otherwise the
child's mode picks the default role (scout → ``scout``, fork → ``reviewer``, worktree →
``worker``). A concrete model given with the spawn wins over every role. The candidates are the
role's primary and fallbacks that this backend can use now (:func:`~orchestrator.governance.
_roles.available`); none — an unassigned role, or nothing available — follows the current
model. Only a role the spawn names itself must exist: a typo there is one clear error.
"""

import os
from collections.abc import Mapping
from typing import Final

import attrs

from orchestrator._errors import UsageError
from orchestrator.spend._roles import (
    Candidate,
    RoleEntry,
    available,
    parse_spec,
    resolve,
)

#: The role each child mode runs on unless something names another (pi-jar's defaults).
MODE_ROLES: Final = {"scout": "scout", "fork": "reviewer", "worktree": "worker"}


@attrs.frozen
class RoleChoice:
    role: str
    #: The available candidates, in order; the first is the one the child starts on.
    candidates: tuple[Candidate, ...]


def role_name(text: str | None, where: str) -> tuple[str, str] | None:
    """``@role[:effort]`` as ``(role, effort)``; ``None`` when *text* is a concrete model."""
    if not text or not text.startswith("@"):
        return None
    spec = parse_spec(text, where)
    if not isinstance(spec, tuple):  # pragma: no cover - an "@" text parses as an alias
        return None
    return spec


def choose_role(
    *,
    request_model: str | None,
    request_role: str | None,
    definition_model: str | None,
    definition_role: str | None,
    mode: str,
    backend: str,
    roles: Mapping[str, RoleEntry],
    env: Mapping[str, str] | None = None,
) -> RoleChoice | None:
    """The role this spawn runs on and its available candidates; ``None``: no role applies
    (a concrete model was named, or the role is unassigned or has nothing available)."""
    env = os.environ if env is None else env
    asked = role_name(request_model, "spawn --model")
    if request_role and (asked or request_model):
        raise UsageError("spawn: give a model or a role, not both")
    if request_role:
        asked = (request_role, "")
    if asked is None and request_model:
        return None  # a concrete model given with the spawn wins
    explicit = asked is not None
    if asked is None:
        named = role_name(definition_model, "definition model")
        if named is None and definition_model:
            return None  # the definition's own concrete model
        asked = named or ((definition_role, "") if definition_role else None)
    if asked is None:
        default = MODE_ROLES.get(mode)
        asked = (default, "") if default else None
    if asked is None:
        return None
    name, effort = asked
    if explicit and name not in roles:
        known = ", ".join(sorted(roles)) or "none"
        raise UsageError(f"spawn: no model role {name!r} is configured (known: {known})")
    candidates = resolve(roles, name).candidates
    if effort:
        candidates = (attrs.evolve(candidates[0], effort=effort), *candidates[1:])
    usable = tuple(c for c in candidates if available(c, backend, env))
    return RoleChoice(role=name, candidates=usable) if usable else None
