"""``orchestrator.connect()``: a Python program's handle on the session's running supervisor.

The program attaches exactly as a ``fleet`` verb does: to the supervisor of the repository's
session (``FLEET_SESSION``, ``--session``-like *session*), started on demand when none runs
(:func:`~orchestrator.control._daemon_client.ensure_daemon`), so the same program works whether
or not ``fleet serve`` is up, beside a shell or an agent parent driving the same fleet. Each
method is one control request; the results are the ``--json`` shapes of ``docs/cli.md``, and a
refusal raises the :class:`~orchestrator.FleetError` the CLI would exit with::

    async with connect() as fleet:
        [child] = await fleet.spawn([SpawnRequest(task="find the config loader")])
        for note in await fleet.wait([child["key"]]):
            print(note["report"])
        await fleet.stop([child["key"]])
"""

import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs
import trio

from orchestrator._config import Config, load_config
from orchestrator._errors import TimedOut
from orchestrator._records import SpawnRequest
from orchestrator.control._client import (
    WAIT_SLICE,
    NotConnected,
    call_async,
    op_timeout,
    read_token,
)
from orchestrator.control._daemon_client import ensure_daemon

__all__ = ["FleetClient", "connect"]


def _request(request: SpawnRequest | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(request, Mapping):
        return dict(request)
    fields = attrs.asdict(request, recurse=False)
    fields["command"] = list(fields["command"])
    return {k: v for k, v in fields.items() if v not in (None, [])}


@attrs.define(eq=False)
class FleetClient:
    """The session's supervisor, over its control socket (started again if it ended)."""

    config: Config

    async def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """One control request *op* (any verb of ``docs/cli.md``)."""
        paths = self.config.paths
        try:
            token = read_token(paths.control_token)
            return await call_async(paths.control_socket, token, op, args, timeout=op_timeout(op))
        except NotConnected:
            # It ended (its idle rule) before the request reached it: start the next one.
            await trio.to_thread.run_sync(ensure_daemon, self.config)
            token = read_token(paths.control_token)
            return await call_async(paths.control_socket, token, op, args, timeout=op_timeout(op))

    async def spawn(
        self, requests: Sequence[SpawnRequest | Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Start children (a batch: all or none); their rows (``key``, ``state``, ...)."""
        data = await self.call("spawn", {"requests": [_request(r) for r in requests]})
        return list(data["agents"])

    async def wait(
        self,
        keys: Sequence[str] = (),
        *,
        every: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - fleet wait --timeout
    ) -> list[dict[str, Any]]:
        """Settle notes as ``fleet wait`` returns them; :class:`TimedOut` past *timeout*."""
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        while True:
            left = min(WAIT_SLICE, max(0.0, deadline - trio.current_time()))
            args = {"agents": list(keys), "all": every, "timeout": left, "progress": True}
            data = await self.call("wait", args)
            if not data.get("timed_out"):
                return list(data["settled"])
            if trio.current_time() >= deadline:
                raise TimedOut(f"wait: nothing settled within {timeout:g} s")

    async def peek(self, keys: Sequence[str] = ()) -> dict[str, Any]:
        return await self.call("peek", {"agents": list(keys)})

    async def stop(self, keys: Sequence[str] = (), *, every: bool = False) -> list[dict[str, Any]]:
        """Stop children for good; their handoffs."""
        data = await self.call("stop", {"agents": list(keys), "all": every})
        return list(data["handoffs"])

    async def report(self, key: str, part: str = "report", offset: int = 0) -> dict[str, Any]:
        """One page of a child's full report or transcript."""
        return await self.call("report", {"agent": key, "part": part, "offset": offset})


@contextlib.asynccontextmanager
async def connect(
    config: Config | None = None, *, session: str | None = None
) -> AsyncIterator[FleetClient]:
    """Attach to the session's supervisor, starting one if none runs (as every verb does).

    The supervisor outlives the program: its children stay the session's until stopped.
    """
    config = config or load_config(session=session)
    await trio.to_thread.run_sync(ensure_daemon, config)
    yield FleetClient(config)
