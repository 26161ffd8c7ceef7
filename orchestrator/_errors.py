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
    """Root of every supervisor error; messages are one line."""

    kind: ClassVar[str] = "error"
    exit_code: ClassVar[int] = 1


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
