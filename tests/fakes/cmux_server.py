"""A loopback fake of cmux's JSON-line Unix-socket protocol, for testing the cmux launcher.

cmux is a macOS app; this fake speaks the part of its socket API the launcher uses —
``system.ping``, ``surface.split``, ``surface.send_text``, ``surface.read_text``,
``surface.close`` — one ``{"id", "method", "params"}`` line per connection, answered with
``{"id", "ok", "result"|"error"}``. A surface is a real ``/bin/sh`` reading the typed text from
its stdin; its merged output is the surface's screen. So a child typed into a fake surface really
runs, and closing the surface hangs its session up as closing a terminal would.

``mode`` picks a behaviour, one per failure class the launcher must tell apart::

    ok            serve everything
    denied        cmux's default-mode refusal: a plaintext "ERROR: Access denied …" line, close
    hangup        close every connection at once without a word (the broken-pipe variant)
    auth          answer every request with a password-mode ``auth_required`` error
    garbage       answer with something that is not cmux's protocol
    split-fails   ``surface.split`` answers an error
    split-silent  ``surface.split`` never answers
    no-start      typed text is swallowed: the child never starts

The fake runs its own trio loop in a background thread, so the supervisor daemon (another
process) and async tests can both use it::

    with CmuxFake(tmp_path / "cmux.sock") as cmux:
        ...
        assert cmux.methods() == ["system.ping", "surface.split", ...]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import threading
from typing import TYPE_CHECKING, Any, Literal, Self

import attrs
import trio

if TYPE_CHECKING:
    import types
    from pathlib import Path

Mode = Literal[
    "ok", "denied", "hangup", "auth", "garbage", "split-fails", "split-silent", "no-start"
]
DENIED = "ERROR: Access denied — only processes started inside cmux can connect"
_SCREEN_CAP = 65536


@attrs.define(eq=False)
class FakeSurface:
    id: str
    process: trio.Process
    screen: bytearray = attrs.Factory(bytearray)


@attrs.define(eq=False)
class CmuxFake:
    path: Path
    mode: Mode = "ok"
    requests: list[dict[str, Any]] = attrs.Factory(list)
    surfaces: dict[str, FakeSurface] = attrs.Factory(dict)
    closed: list[str] = attrs.Factory(list)
    _ids: itertools.count[int] = attrs.Factory(lambda: itertools.count(1))
    _thread: threading.Thread | None = None
    _token: trio.lowlevel.TrioToken | None = None
    _nursery: trio.Nursery | None = None
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def __enter__(self) -> Self:
        started = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main, started), daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the cmux fake did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        if self._token is not None and self._nursery is not None:
            # run_sync_soon works from any thread, a trio test's included.
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
        if self._thread is not None:
            self._thread.join(10)

    def methods(self) -> list[str]:
        with self._lock:
            return [r["method"] for r in self.requests]

    def typed(self) -> list[str]:
        """Every text sent to any surface."""
        with self._lock:
            return [
                r["params"]["text"] for r in self.requests if r["method"] == "surface.send_text"
            ]

    async def _main(self, started: threading.Event) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen(16)
        listener = trio.SocketListener(sock)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._token = trio.lowlevel.current_trio_token()
                nursery.start_soon(trio.serve_listeners, self._serve, [listener])
                started.set()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                for surface in list(self.surfaces.values()):
                    await self._close(surface)
                await listener.aclose()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self.mode == "denied":
                await stream.send_all(DENIED.encode() + b"\n")
                return
            if self.mode == "hangup":
                return
            line = await _read_line(stream)
            try:
                request = json.loads(line)
            except ValueError:
                return
            with self._lock:
                self.requests.append(request)
            reply = await self._answer(request)
            if reply is None:
                await trio.sleep_forever()
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(reply.encode() + b"\n")

    async def _answer(self, request: dict[str, Any]) -> str | None:
        rid = request.get("id")
        method = request.get("method")
        params = request.get("params") or {}
        if self.mode == "auth":
            return _error(rid, "auth_required", "send auth <password> first")
        if self.mode == "garbage":
            return "HTTP/1.1 400 Bad Request"
        if method == "system.ping":
            return _ok(rid, {"pong": True})
        if method == "surface.split":
            if self.mode == "split-fails":
                return _error(rid, "internal_error", "could not create a terminal surface")
            if self.mode == "split-silent":
                return None
            surface = await self._open()
            return _ok(rid, {"surface_id": surface.id, "surface_ref": "surface:2"})
        target = self.surfaces.get(str(params.get("surface_id")))
        if target is None:
            return _error(rid, "not_found", "surface not found")
        return await self._surface_op(rid, method, target, params)

    async def _surface_op(
        self, rid: Any, method: Any, surface: FakeSurface, params: dict[str, Any]
    ) -> str:
        if method == "surface.send_text":
            if self.mode != "no-start":
                assert surface.process.stdin is not None
                await surface.process.stdin.send_all(str(params["text"]).encode())
            return _ok(rid, {})
        if method == "surface.read_text":
            return _ok(rid, {"text": surface.screen.decode(errors="replace")})
        if method == "surface.close":
            await self._close(surface)
            return _ok(rid, {})
        return _error(rid, "method_not_found", f"unknown method {method}")

    async def _open(self) -> FakeSurface:
        process = await trio.lowlevel.open_process(
            ["/bin/sh"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        surface = FakeSurface(id=f"SURFACE-{next(self._ids)}", process=process)
        self.surfaces[surface.id] = surface
        assert self._nursery is not None
        self._nursery.start_soon(self._pump, surface)
        return surface

    async def _pump(self, surface: FakeSurface) -> None:
        assert surface.process.stdout is not None
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            async for chunk in surface.process.stdout:
                surface.screen += chunk
                del surface.screen[:-_SCREEN_CAP]

    async def _close(self, surface: FakeSurface) -> None:
        """Close like a terminal does: hang up the session, then make sure it is gone. Shielded:
        a close asked for just before the fake stops is still seen through (the surface is no
        longer listed, so the fake's own end would not reap its shell)."""
        self.surfaces.pop(surface.id, None)
        with self._lock:
            self.closed.append(surface.id)
        with trio.CancelScope(shield=True):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(surface.process.pid, signal.SIGHUP)
            with trio.move_on_after(2):
                await surface.process.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(surface.process.pid, signal.SIGKILL)
            await surface.process.wait()


async def _read_line(stream: trio.SocketStream) -> bytes:
    buffer = bytearray()
    while b"\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
    return bytes(buffer.split(b"\n", 1)[0])


def _ok(rid: Any, result: dict[str, Any]) -> str:
    return json.dumps({"id": rid, "ok": True, "result": result})


def _error(rid: Any, code: str, message: str) -> str:
    return json.dumps({"id": rid, "ok": False, "error": {"code": code, "message": message}})
