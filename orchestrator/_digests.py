"""What a supervisor started with, as keyed digests a verb compares with its own.

A supervisor reads some settings once, when it starts, and hands them to every child it
spawns; a verb run with other ones says so in one line (``_daemon_client.warn_if_drifted``).
This module imports nothing of attrs or the config file reader: the warm-verb client
(``orchestrator.cli._fast``) computes the same digests from the environment alone.
"""

from __future__ import annotations

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, Final


def _sha256_without_openssl() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before): loading OpenSSL for
    :mod:`hashlib` costs a warm verb a tenth of an interpreter's start. hashlib's where the
    build has neither."""
    for name in ("_sha2", "_sha256"):
        try:
            constructor: Callable[[bytes], Any] = __import__(name).sha256
        except ImportError:
            continue
        return constructor
    import hashlib  # noqa: PLC0415

    return hashlib.sha256


#: SHA-256, as ``hashlib.sha256``.
sha256: Final = _sha256_without_openssl()
_INNER: Final = bytes(x ^ 0x36 for x in range(256))
_OUTER: Final = bytes(x ^ 0x5C for x in range(256))


def keyed_digest(secret: bytes, message: bytes) -> str:
    """HMAC-SHA256 of *message* under *secret* in hex (RFC 2104), as
    ``hmac.new(secret, message, hashlib.sha256).hexdigest()`` without :mod:`hashlib`."""
    if len(secret) > 64:
        secret = sha256(secret).digest()
    secret = secret.ljust(64, b"\0")
    inner = sha256(secret.translate(_INNER) + message).digest()
    return str(sha256(secret.translate(_OUTER) + inner).hexdigest())


#: The environment variables a supervisor's children read. Each name is what the user sets.
START_ENVIRONMENT: Final = (
    "FLEET_PI_BIN",
    "FLEET_CLAUDE_BIN",
    "FLEET_CODEX_BIN",
    "FLEET_STALL_TIMEOUT",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
)
#: The :class:`~orchestrator._config.Config` fields no verb can change in a running supervisor
#: (``configure`` changes the cap, the lane and the agent directories), each with the name the
#: user sets it by.
START_SETTINGS: Final = {
    "sandbox": "FLEET_SANDBOX",
    "allow_unsandboxed": "--allow-unsandboxed",
    "model": "--default-model/FLEET_MODEL",
    "surface": "FLEET_SURFACE",
    "idle_timeout_ms": "FLEET_IDLE_TIMEOUT_MS",
    "max_total_ms": "FLEET_MAX_TOTAL_MS",
    "fork_server": "FLEET_FORK_SERVER",
    "reject_log": "FLEET_REJECT_LOG",
    "egress": "subagents.egress",
    "idle_exit_s": "FLEET_IDLE_EXIT_S",
}


def start_digests(config: Any, environ: Mapping[str, str], key: str) -> dict[str, str]:
    """The settings a supervisor started with (*config*'s :data:`START_SETTINGS` attributes and
    *environ*'s :data:`START_ENVIRONMENT`), as keyed hashes (a key's value never leaves the
    process, not even as a plain hash): the caller's and the supervisor's compare equal
    exactly when the values do. An unset *model* is no opinion, not a difference."""
    values = {name: environ.get(name, "") for name in START_ENVIRONMENT}
    values |= {name: repr(getattr(config, field)) for field, name in START_SETTINGS.items()}
    if not config.model:
        del values[START_SETTINGS["model"]]
    secret = key.encode()
    return {
        name: keyed_digest(secret, f"{name}={value}".encode())[:24]
        for name, value in values.items()
    }


def drifted(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The settings of *mine* that *theirs* has otherwise (nothing when *theirs* is empty: a
    supervisor that does not report them)."""
    if not theirs:
        return []
    return [name for name, digest in mine.items() if theirs.get(name) != digest]


def drift_warning(names: list[str], pid: object) -> str:
    """The one line a verb prints when the running supervisor (*pid*) started with other
    settings (*names*) than the verb's own."""
    return (
        f"fleet: warning: the running supervisor (pid {pid}) started with another "
        f"{', '.join(names)} than this command's and keeps its own for every child it spawns "
        "(restart it: fleet serve --stop stops it and its children; the next command starts "
        "one with yours)"
    )
