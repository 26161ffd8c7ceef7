"""The protocol's vocabulary: every message class, the tag map, and the envelope.

Messages are frozen attrs classes; :data:`MESSAGE_TYPES` maps an envelope's ``type`` to its
body's class. Reading and writing them is :mod:`ipc._messages`' job alone.
"""

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

PROTOCOL_VERSION: Final = 1

Kind = Literal["request", "response", "event"]

# -- parent -> child ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Prompt:
    """Start a turn with *text* (a fresh task, or a resume of a retained child)."""

    text: str
    turn: int
    #: Which of the loadout's ``models`` runs this turn (a role's fallback after a quota error).
    model: int = 0


@attrs.frozen(kw_only=True)
class Steer:
    """Redirect the working turn with *text*."""

    text: str


@attrs.frozen(kw_only=True)
class Abort:
    """Stop the working turn; the child settles it as aborted."""


@attrs.frozen(kw_only=True)
class Ask:
    """A side ("by the way") question answered in its own short turn."""

    text: str
    turn: int


@attrs.frozen(kw_only=True)
class Answer:
    """The parent's reply to a child's :class:`Question` (the response body of that request)."""

    question: str
    text: str


@attrs.frozen(kw_only=True)
class Shutdown:
    """Close the backend and exit."""


# -- child -> parent ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Renew:
    """A remote child renews its lease; the reply's ``data`` carries ``lease_s``. A child that
    has had no reply for a whole lease stops every write and exits (``child._lease``). With a
    ``csr`` (PEM) it renews its certificate too: the reply's ``data.certificate`` is the new
    leaf, signed for this child's owner only."""

    csr: str = ""


@attrs.frozen(kw_only=True)
class Hello:
    """The first frame of every connection; its envelope carries the token."""

    pid: int
    role: Literal["child", "control"] = "child"
    backend: str = ""


@attrs.frozen(kw_only=True)
class Progress:
    """The child's checklist, as ``peek`` shows it."""

    done: int
    total: int
    current: str | None = None
    next: list[str] = attrs.Factory(list)


@attrs.frozen(kw_only=True)
class Usage:
    """Model usage so far in this child's life (cumulative; each report replaces the last).

    ``tokens`` is the total; ``input_tokens`` counts uncached input only, cache reads and
    writes are their own. ``cost_usd`` is the backend's own cumulative cost, when it reports
    one; ``model`` the model that answered, when the backend says.
    """

    tokens: int = 0
    cost_usd: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    model: str = ""


@attrs.frozen(kw_only=True)
class Event:
    """Throttled activity: what the child is doing now.

    ``activity`` is one of ``tool_start``, ``tool_update``, ``tool_end``, ``message``,
    ``todo``, ``usage``, ``status``, ``wake`` (a background shell's watch matched while no turn
    ran: the supervisor prompts an idle child). ``text`` is a short human line (never a
    transcript).
    ``tool_start`` carries ``input_digest`` and ``tool_end`` ``output_digest`` and ``failed``:
    16 hex digits of the SHA-256 of the input's (output's) canonical JSON, for the loop gate.
    """

    activity: str
    text: str = ""
    tool: str = ""
    progress: Progress | None = None
    usage: Usage | None = None
    #: The backend's resumable session id, reported once it exists (Codex: its thread id).
    resume_id: str = ""
    input_digest: str = ""
    output_digest: str = ""
    failed: bool = False


@attrs.frozen(kw_only=True)
class Settled:
    """A turn ended. ``text`` is the final report; only it reaches the parent agent."""

    turn: int
    text: str
    ok: bool = True
    aborted: bool = False
    error: str = ""
    side: bool = False
    #: What the child's backend resumes from, as its scratch holds it after this turn (a
    #: name below the scratch → its text): sent by a child whose loadout asks
    #: (``context_inline``) when it fits the frame; the supervisor checks it as it checks a
    #: copy fetched from the node (each value must be a string). Empty: not sent.
    context: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class Question:
    """The child asks its parent; the response is an :class:`Answer` (no deadline)."""

    text: str


@attrs.frozen(kw_only=True)
class Spawn:
    """A nested spawn request (no deadline); the response carries the grandchild's report."""

    agent: str
    task: str
    name: str = ""


@attrs.frozen(kw_only=True)
class Ownership:
    """Ask to own *paths* (paths or globs) before writing them."""

    paths: list[str]


@attrs.frozen(kw_only=True)
class Discuss:
    """A discussion-paper operation: ``ask``, ``answer`` or ``list``."""

    op: Literal["ask", "answer", "list"]
    text: str = ""
    to: str | None = None
    question: str | None = None
    since: str | None = None


@attrs.frozen(kw_only=True)
class Proxy:
    """A call of a parent-provided tool (for example a browser probe)."""

    tool: str
    args: dict[str, Any] = attrs.Factory(dict)


# -- either direction -----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Reply:
    """The generic response body: ``ok`` with ``data``, or an ``error`` line."""

    ok: bool
    data: dict[str, Any] = attrs.Factory(dict)
    error: str = ""


@attrs.frozen(kw_only=True)
class Control:
    """A command on the supervisor's control socket (``fleet`` CLI, Python hosts)."""

    op: str
    args: dict[str, Any] = attrs.Factory(dict)


Message = (
    Prompt
    | Steer
    | Abort
    | Ask
    | Answer
    | Shutdown
    | Hello
    | Event
    | Settled
    | Question
    | Spawn
    | Ownership
    | Discuss
    | Proxy
    | Reply
    | Control
    | Renew
)

MESSAGE_TYPES: Final[Mapping[str, type[Any]]] = {
    "prompt": Prompt,
    "steer": Steer,
    "abort": Abort,
    "ask": Ask,
    "answer": Answer,
    "shutdown": Shutdown,
    "hello": Hello,
    "event": Event,
    "settled": Settled,
    "question": Question,
    "spawn": Spawn,
    "ownership": Ownership,
    "discuss": Discuss,
    "proxy": Proxy,
    "reply": Reply,
    "control": Control,
    "renew": Renew,
}
TYPE_NAMES: Final[Mapping[type[Any], str]] = {cls: name for name, cls in MESSAGE_TYPES.items()}

NO_DEADLINE_TYPES: Final = frozenset({"question", "spawn"})
"""Request types that may wait for their response without a deadline."""


@attrs.frozen(kw_only=True)
class Envelope:
    """One decoded frame."""

    v: int
    token: str
    owner: str
    corr: str
    kind: Kind
    type: str
    body: Message
