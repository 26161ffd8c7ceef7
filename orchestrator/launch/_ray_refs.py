"""A Ray call awaited from trio without a worker thread.

``ray.get`` blocks, so each call to a child's actor or node host once ran in a trio worker
thread: the thread's hand-off, its wait in Ray's ``get`` and the GIL passed back and forth cost
the supervisor about 0.4 ms a call (0.89 against 0.52 ms of its CPU, 400 calls at once to one
actor, ``/tmp`` microbenchmark in the session-17 note), and an exit watch held its thread for
the child's whole life. :func:`resolved` instead asks Ray for the ref's
``concurrent.futures.Future``, whose callback (on a Ray thread) wakes this trio task; the value
or the error is the one ``ray.get`` would give (a task's error as an instance of its cause).

A call is *submitted* on the trio thread (``.remote()`` only serialises its arguments and
queues it) unless its arguments are large (:func:`called`): a workspace bundle of many MB is
copied into the object store, which is not work for the event loop.
"""

import contextlib
from collections.abc import Callable
from typing import Any

import trio

from orchestrator.launch._ray_node import ray_module

__all__ = ["called", "resolved"]

#: Arguments larger than this (bytes, summed over the call's ``bytes`` values) are submitted
#: from a worker thread.
HEAVY_BYTES = 256 * 1024


async def resolved(ref: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - ray.get's
    """What ``ray.get(ref, timeout=timeout)`` returns or raises, awaited without a thread.
    Cancelled, it gives up waiting (the call itself goes on, as an abandoned thread's did)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: Any) -> None:  # on a Ray thread
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future = ref.future()
    future.add_done_callback(wake)
    if timeout is None:
        await done.wait()
    else:
        with trio.move_on_after(timeout):
            await done.wait()
        if not done.is_set():
            raise ray_module().exceptions.GetTimeoutError(
                f"no answer from the node in {timeout:g} s"
            )
    return future.result()


def size_of(value: Any) -> int:
    """The bytes carried in *value* (``bytes`` inside tuples, lists and dict values)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, tuple | list):
        return sum(size_of(item) for item in value)
    if isinstance(value, dict):
        return sum(size_of(item) for item in value.values())
    return 0


async def called(
    submit: Callable[[], Any],
    payload: Any = None,
    timeout: float | None = None,  # noqa: ASYNC109 - ray.get's
) -> Any:
    """What the call ``submit()`` (a ``.remote(...)``) returns, :func:`resolved`. It is
    submitted on this thread, or from a worker thread when *payload* (its arguments) is
    larger than :data:`HEAVY_BYTES`."""
    if size_of(payload) > HEAVY_BYTES:
        ref = await trio.to_thread.run_sync(submit)
    else:
        ref = submit()
    return await resolved(ref, timeout)
