"""Model roles with fallbacks: pi-jar's resolution rules, as pure functions.

Roles live in two YAML files beside fleet's two configurations: the global
``$FLEET_HOME/roles.yaml`` (beside ``config.yaml``) and the project ``.fleet/roles.yaml``
(beside ``.fleet/agents``, the nearest one at or above the working directory)::

    roles:
      worker:
        model: anthropic/claude-sonnet-4-5:high
        fallbacks: [openai/gpt-5:medium, "@cheap"]
      scout: "@worker:low"          # shorthand for {model: "@worker:low"}
      cheap: openai/gpt-5-mini

Resolution of a role name (the seed's rules):

1. Global and project roles merge; the project wins per role. A project role without a
   ``fallbacks`` key keeps the global role's list; an explicit empty project list disables it.
2. ``@other[:effort]`` follows ``other``, remembering the effort (the first one wins), at most
   five hops; a cycle or a sixth hop is one clear error.
3. ``provider/model[:effort]`` is a concrete candidate.
4. The candidates are the primary, then the role's fallbacks in order (each fallback may itself
   be an alias, resolved to its primary). An alias role without its own ``fallbacks`` inherits
   the fallbacks of the role it names.
5. An unassigned role resolves to no candidates: the caller follows the current model.

"Available" (:func:`first_available`) is concrete: the backend can drive the provider and the
provider's API key variable is present in the environment the child will get.
"""

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError
from orchestrator._yamlfile import read_yaml_file

ROLES_FILE: Final = "roles.yaml"
MAX_HOPS: Final = 5
#: The same words as ``orchestrator.definitions.EFFORTS`` (a test keeps them equal).
EFFORTS: Final = ("off", "minimal", "low", "medium", "high", "xhigh")
_ROLE_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
_PROVIDER_RE: Final = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
#: The key each provider needs, and the backends that can drive it.
PROVIDER_KEYS: Final = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
BACKEND_PROVIDERS: Final = {
    "builtin": ("openai",),
    "claude": ("anthropic",),
    "codex": ("openai",),
    "pi": ("openai", "anthropic"),
}


@attrs.frozen
class Candidate:
    """One concrete model a role may run on."""

    provider: str
    model: str
    effort: str = ""
    #: ``openai``/``anthropic`` endpoints other than the vendor's (``...@http://host/v1``).
    base_url: str = ""

    @property
    def spec(self) -> str:
        url = f"@{self.base_url}" if self.base_url else ""
        return f"{self.provider}/{self.model}{url}" + (f":{self.effort}" if self.effort else "")

    def model_text(self, backend: str) -> str:
        """The ``--model`` text fleet's spawn planner takes for *backend*."""
        if backend == "builtin" or self.base_url:
            url = f"@{self.base_url}" if self.base_url else ""
            return f"{self.provider}:{self.model}{url}"
        if backend == "pi":
            return f"{self.provider}/{self.model}"
        return self.model


@attrs.frozen
class RoleEntry:
    model: str
    #: ``None``: the key was absent (inherit); ``()``: explicitly none.
    fallbacks: tuple[str, ...] | None = None


@attrs.frozen
class Resolution:
    role: str
    candidates: tuple[Candidate, ...]

    @property
    def assigned(self) -> bool:
        return bool(self.candidates)


def _split_effort(text: str, where: str) -> tuple[str, str]:
    head, sep, tail = text.rpartition(":")
    if sep and "/" not in tail and "@" not in tail:
        if tail not in EFFORTS:
            raise UsageError(f"{where}: effort {tail!r} is not one of {', '.join(EFFORTS)}")
        return head, tail
    return text, ""


def parse_spec(text: object, where: str = "role") -> Candidate | tuple[str, str]:
    """``provider/model[@base_url][:effort]`` as a :class:`Candidate`, or ``@other[:effort]``
    as ``(other, effort)``; anything else is one clear :class:`UsageError` line."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: spec {text!r} must be provider/model[:effort] or @role")
    text = text.strip()
    body, effort = _split_effort(text, where)
    if body.startswith("@"):
        name = body[1:]
        if not _ROLE_RE.fullmatch(name):
            raise UsageError(f"{where}: alias {text!r} names no valid role")
        return name, effort
    provider, slash, rest = body.partition("/")
    model, _, base_url = rest.partition("@")
    if not slash or not _PROVIDER_RE.fullmatch(provider) or not model or " " in model:
        raise UsageError(f"{where}: spec {text!r} must be provider/model[:effort] or @role")
    if base_url and not base_url.startswith(("http://", "https://")):
        raise UsageError(f"{where}: base URL in {text!r} must be http:// or https://")
    return Candidate(provider=provider, model=model, effort=effort, base_url=base_url)


def _entries(data: object, source: str) -> dict[str, RoleEntry]:
    if data is None:
        return {}
    if not isinstance(data, Mapping) or set(data) - {"roles"}:
        raise UsageError(f"{source}: top level must be a mapping with one key, roles")
    roles = data.get("roles") or {}
    if not isinstance(roles, Mapping):
        raise UsageError(f"{source}: roles must be a mapping of role name to spec")
    out: dict[str, RoleEntry] = {}
    for name, raw in roles.items():
        where = f"{source}: role {name!r}"
        if not isinstance(name, str) or not _ROLE_RE.fullmatch(name):
            raise UsageError(f"{source}: role name {name!r} is invalid (letters, digits, - _)")
        value = {"model": raw} if isinstance(raw, str) else raw
        if not isinstance(value, Mapping) or set(value) - {"model", "fallbacks"}:
            raise UsageError(f"{where} must be a spec or a mapping of model and fallbacks")
        model = value.get("model")
        parse_spec(model, where)
        fallbacks = value.get("fallbacks")
        if fallbacks is not None:
            if not isinstance(fallbacks, list | tuple):
                raise UsageError(f"{where}: fallbacks must be a list of specs")
            for item in fallbacks:
                parse_spec(item, f"{where} fallback")
            fallbacks = tuple(fallbacks)
        out[name] = RoleEntry(model=str(model).strip(), fallbacks=fallbacks)
    return out


def merge(
    global_roles: Mapping[str, RoleEntry], project: Mapping[str, RoleEntry]
) -> dict[str, RoleEntry]:
    """Project wins per role; a project role without ``fallbacks`` keeps the global list."""
    merged = dict(global_roles)
    for name, entry in project.items():
        inherited = global_roles.get(name)
        if entry.fallbacks is None and inherited is not None:
            merged[name] = RoleEntry(model=entry.model, fallbacks=inherited.fallbacks)
        else:
            merged[name] = entry
    return merged


def _primary(
    roles: Mapping[str, RoleEntry], role: str, effort: str, seen: list[str]
) -> tuple[Candidate, str]:
    """The concrete primary of *role* and the role whose fallbacks apply (the first role on
    the alias chain with a ``fallbacks`` key)."""
    owner = role
    spec = parse_spec(roles[role].model, f"role {role!r}")
    while isinstance(spec, tuple):
        target, hop_effort = spec
        effort = effort or hop_effort
        if target in seen:
            raise UsageError(f"role {seen[0]!r}: alias cycle {' -> '.join([*seen, target])}")
        if len(seen) > MAX_HOPS:
            raise UsageError(f"role {seen[0]!r}: more than {MAX_HOPS} alias hops")
        if target not in roles:
            raise UsageError(f"role {seen[-1]!r}: alias @{target} names no configured role")
        seen.append(target)
        if roles[owner].fallbacks is None:
            owner = target
        spec = parse_spec(roles[target].model, f"role {target!r}")
    return attrs.evolve(spec, effort=effort or spec.effort), owner


def resolve(roles: Mapping[str, RoleEntry], name: str) -> Resolution:
    """The ordered candidates for role *name* (none: unassigned, follow the current model)."""
    if name not in roles:
        return Resolution(role=name, candidates=())
    primary, owner = _primary(roles, name, "", [name])
    candidates = [primary]
    for item in roles[owner].fallbacks or ():
        spec = parse_spec(item, f"role {name!r} fallback")
        if isinstance(spec, tuple):
            target, effort = spec
            if target not in roles:
                raise UsageError(f"role {name!r}: fallback @{target} names no configured role")
            spec, _ = _primary(roles, target, effort, [name, target])
        if spec not in candidates:
            candidates.append(spec)
    return Resolution(role=name, candidates=tuple(candidates))


def _read(path: Path) -> dict[str, RoleEntry]:
    data = read_yaml_file(path, "roles")
    return _entries(data, f"roles {path}")


def project_roles_file(cwd: Path) -> Path | None:
    """The nearest ``.fleet/roles.yaml`` at or above *cwd*."""
    for directory in (cwd.resolve(), *cwd.resolve().parents):
        candidate = directory / ".fleet" / ROLES_FILE
        if candidate.is_file():
            return candidate
    return None


def load_roles(home: Path, cwd: Path) -> dict[str, RoleEntry]:
    """The merged roles of ``$FLEET_HOME/roles.yaml`` and the project's ``.fleet/roles.yaml``."""
    project = project_roles_file(cwd)
    return merge(_read(home / ROLES_FILE), _read(project) if project else {})


def available(candidate: Candidate, backend: str, env: Mapping[str, str]) -> bool:
    """The backend can drive the provider and the provider's key is set (non-empty); an
    endpoint of its own (``@base_url``, a local server) needs no key."""
    if candidate.provider not in BACKEND_PROVIDERS.get(backend, ()):
        return False
    key = PROVIDER_KEYS.get(candidate.provider)
    return bool(candidate.base_url) or bool(key and env.get(key))


def first_available(
    candidates: Sequence[Candidate], backend: str, env: Mapping[str, str]
) -> Candidate | None:
    return next((c for c in candidates if available(c, backend, env)), None)


def describe(resolution: Resolution) -> list[dict[str, Any]]:
    """The candidates as JSON-able rows (for ``peek`` and handoffs)."""
    return [attrs.asdict(c) | {"spec": c.spec} for c in resolution.candidates]
