"""The supervisor's side of a node host's context fetches (``NodeHost.contexts``): one call a batch.

At each turn end the supervisor keeps a copy of a remote child's resume context
(``core._context``). A fetch that is a Ray call of its own cost a call a child a turn on both
ends, and a fleet's turns end together. Here the fetches of one host's children share its
calls: while one call is out, the fetches asked meanwhile wait, and the next call takes them
all (no fetch waits for a timer, and one alone is one call, as before). The host answers each
with its files, the one line why they are not sent (over the cap), or why it could not read
them (the child's state is gone); a host that does not answer fails every fetch of its call.
A call's answer is bounded (:data:`BATCH_BYTES` in all on the host's side): what did not fit
is asked again in the next call.
"""

from collections.abc import Callable, Sequence
from typing import Any, Final

import trio

from orchestrator.launch._ray_refs import resolved

__all__ = ["AGAIN", "BATCH_BYTES", "FILES", "GONE", "REFUSED", "Asked", "HostContexts", "answer"]

#: The most bytes of files one call's answer carries (a context alone may be this large).
BATCH_BYTES: Final = 64 * 1024 * 1024
#: How long one call may take before the host counts as gone.
CALL_TIMEOUT_S: Final = 60.0

#: The kinds of one fetch's answer: its files; the line why they are not sent; the line why
#: they could not be read; not read in this call (its answer was full).
FILES, REFUSED, GONE, AGAIN = "files", "refused", "gone", "again"

#: One fetch: the child's state name in its host, its backend and its resume id.
Asked = tuple[str, str, str]
#: One fetch's answer: its files, or the one line why they are not sent.
Got = dict[str, bytes] | str


class _Fetch:
    """One awaited fetch: set once, with its answer or the reason there is none."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.got: Got = ""
        self.error: BaseException | None = None


class HostContexts:
    """The context fetches asked of one node host, and the task that sends them."""

    def __init__(self, host: Any, nursery: trio.Nursery) -> None:
        self.host = host
        self._nursery = nursery
        self._waiting: dict[Asked, _Fetch] = {}
        self._sending = False

    async def fetch(self, ident: str, backend: str, resume: str) -> Got:
        """The context of the child whose state in the host is *ident*: its files, or the one
        line why they are not sent. Raises when the host did not answer or could not read
        them. The same fetch asked again while it waits is joined, not asked twice."""
        fetch = self._waiting.setdefault((ident, backend, resume), _Fetch())
        if not self._sending:
            self._sending = True
            self._nursery.start_soon(self._send)
        await fetch.done.wait()
        if fetch.error is not None:
            raise fetch.error
        return fetch.got

    async def _send(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                await self._one_call(batch)
        finally:
            self._sending = False

    async def _one_call(self, batch: dict[Asked, _Fetch]) -> None:
        """Ask *batch* of the host in one call and hand each fetch its answer."""
        asked = list(batch)
        try:
            answers: list[tuple[str, Any]] = await resolved(
                self.host.contexts.remote(asked), timeout=CALL_TIMEOUT_S
            )
        except Exception as exc:  # the host (or its node) is gone, or it did not answer in time
            for fetch in batch.values():
                _fail(fetch, exc)
            return
        missing: tuple[str, Any] = (GONE, "its node host did not answer for it")
        for i, (one, fetch) in enumerate(batch.items()):
            kind, value = answers[i] if i < len(answers) else missing
            if kind == AGAIN:
                self._waiting.setdefault(one, fetch)  # the next call asks again
                continue
            if kind == FILES:
                fetch.got = {str(name): bytes(data) for name, data in dict(value).items()}
            elif kind == REFUSED:
                fetch.got = str(value)
            else:
                fetch.error = RuntimeError(str(value))
            fetch.done.set()


def _fail(fetch: _Fetch, error: BaseException) -> None:
    fetch.error = error
    fetch.done.set()


def answer(
    asked: Sequence[Asked],
    context: Callable[[str, str, str], dict[str, bytes]],
    refused: type[Exception],
    cap: int = BATCH_BYTES,
) -> list[tuple[str, Any]]:
    """The host's answers to *asked*, in order: ``context(ident, backend, resume)`` for each
    (its files; *refused*: the one line why not), until *cap* bytes of files are in the
    answer (the rest: :data:`AGAIN`; the first is answered whatever its size). Runs on the
    node."""
    answers: list[tuple[str, Any]] = []
    total = 0
    for ident, backend, resume in asked:
        if total >= cap:
            answers.append((AGAIN, ""))
            continue
        try:
            files = context(ident, backend, resume)
        except refused as exc:
            answers.append((REFUSED, str(exc)))
            continue
        except Exception as exc:  # its state is gone (it ended), or its scratch is
            answers.append((GONE, f"{type(exc).__name__}: {exc}"))
            continue
        size = sum(len(data) for data in files.values())
        if total and total + size > cap:
            answers.append((AGAIN, ""))  # first in the next call's answer
            total = cap
            continue
        total += size
        answers.append((FILES, files))
    return answers
