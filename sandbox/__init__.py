"""Turning an argv into a sandboxed argv for a policy, and probing the launchers.

Layering: ``sandbox`` uses the standard library (plus attrs) only and imports nothing of ours.

:func:`wrap` builds a bubblewrap (Linux) or Seatbelt (macOS) command line from a
:class:`SandboxSpec`; :func:`probe` runs the real launcher once to learn whether it works here.
No working launcher is not an error: :class:`Wrapped` says ``wrapped=False`` and why, and the
caller fails closed. :class:`SandboxError` is raised only for a spec or command that can never
be sandboxed safely. See ``docs/sandbox.md``.
"""

from sandbox._bwrap import HIDDEN_ROOTS
from sandbox._errors import SandboxError
from sandbox._paths import is_within
from sandbox._probe import ProbeResult, probe
from sandbox._spec import Policy, SandboxSpec, Wrapped
from sandbox._wrap import exec_argv, wrap, wrap_fork_server

__all__ = [
    "HIDDEN_ROOTS",
    "Policy",
    "ProbeResult",
    "SandboxError",
    "SandboxSpec",
    "Wrapped",
    "exec_argv",
    "is_within",
    "probe",
    "wrap",
    "wrap_fork_server",
]
