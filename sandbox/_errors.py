"""The ``sandbox`` exception.

The package has one exception, :class:`SandboxError`: a spec or a command that can never be
sandboxed safely. A missing or broken *launcher* is not an error here — :func:`sandbox.wrap`
reports it as ``Wrapped(wrapped=False, reason=...)`` so the caller decides to fail closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class SandboxError(Exception):
    """A sandbox spec or command was refused; the one-line message says why and what to do.

    ``path`` is the offending path when there is one (a writable path that contains ``$HOME``,
    a visible path that does not exist, a command hidden by the sandbox), else ``None``.
    """

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path
