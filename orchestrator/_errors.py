"""The ``orchestrator`` exception tree.

::

    FleetError                  root; ``kind`` is the --json error kind, ``exit_code`` the CLI's
    ├── UsageError              the request itself is malformed (exit 2)
    ├── NotFound                no such child, question or file (exit 2)
    ├── Refused                 policy, capacity, lock conflict, sandbox unavailable (exit 4)
    │   ├── CapacityError
    │   └── PolicyError
    ├── OperationFailed         it ran and failed: a child failed, a conflict (exit 1)
    ├── TimedOut                a wait ran out (exit 3)
    └── Unreachable             the supervisor is not running or crashed (exit 5)
"""

from __future__ import annotations

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar


class FleetError(Exception):
    """Root of every supervisor error; messages are one line.

    A *hint* is the way past a refusal that only a person or the parent may take (a mode, a
    setting, a flag): the message shows it, in parentheses, to them; a child is told
    :attr:`for_child`, the message without it, so no refusal teaches a child how it would
    have been allowed.
    """

    kind: ClassVar[str] = "error"
    exit_code: ClassVar[int] = 1

    def __init__(self, *args: object, hint: str = "") -> None:
        super().__init__(*args)
        self.hint = hint

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} ({self.hint})" if self.hint else text

    @property
    def for_child(self) -> str:
        """The message as a child may read it: without the hint."""
        return super().__str__()


class UsageError(FleetError):
    kind = "usage"
    exit_code = 2


class NotFound(FleetError):
    kind = "not-found"
    exit_code = 2


class Refused(FleetError):
    kind = "refused"
    exit_code = 4


class CapacityError(Refused):
    kind = "capacity"


class PolicyError(Refused):
    kind = "policy"


class OperationFailed(FleetError):
    kind = "failed"
    exit_code = 1


class TimedOut(FleetError):
    kind = "timeout"
    exit_code = 3


class Unreachable(FleetError):
    kind = "unreachable"
    exit_code = 5


ERROR_KINDS: dict[str, type[FleetError]] = {
    cls.kind: cls
    for cls in (
        FleetError,
        UsageError,
        NotFound,
        Refused,
        CapacityError,
        PolicyError,
        OperationFailed,
        TimedOut,
        Unreachable,
    )
}
