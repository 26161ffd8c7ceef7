"""Who may use the web view: the person who ran ``fleet web``, from this machine's browser.

A login URL carries a one-time token: ``<nonce>.<expiry>.<mac>``, an HMAC-SHA256 under the
server's key (kept in its 0600 state file, readable only where the control token is), so
``fleet web`` mints one without talking to the server. The server accepts each nonce once,
before its expiry, and answers with a random session cookie: ``HttpOnly`` (no script reads it),
``SameSite=Strict`` (no other site's page sends it), named for the port (cookies are not
isolated by port, and another session's server may run on the same host).

:class:`GuardMiddleware` refuses, before any route runs:

- a ``Host`` that is not ``127.0.0.1:<port>`` or ``localhost:<port>`` (DNS rebinding: a
  hostile name resolved to 127.0.0.1 carries its own name in ``Host``) — 403;
- a request without a valid session cookie (but the login itself) — 401;
- a state-changing request (anything but GET and HEAD) whose ``Origin`` is not this server
  — 403. Its CSRF token (a per-session secret, in a form field or the ``X-CSRF-Token``
  header) is checked by :meth:`Guard.check_csrf` where the form is read.
"""

import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any, Final

import attrs

#: How long a login URL is good for (seconds).
LOGIN_TTL: Final = 300
CSRF_HEADER: Final = "x-csrf-token"
CSRF_FIELD: Final = "csrf"
SAFE_METHODS: Final = frozenset({"GET", "HEAD"})
#: The only path served without a session (it makes one).
LOGIN_PATH: Final = "/login"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _mac(key: bytes, nonce: str, expiry: int) -> str:
    return hmac.new(key, f"{nonce}.{expiry}".encode(), hashlib.sha256).hexdigest()


def mint_login(key: bytes, *, now: float | None = None) -> str:
    """A one-time login token for the server holding *key*, good for :data:`LOGIN_TTL` s."""
    nonce = secrets.token_urlsafe(18)
    expiry = int((time.time() if now is None else now) + LOGIN_TTL)
    return f"{nonce}.{expiry}.{_mac(key, nonce, expiry)}"


@attrs.define(eq=False)
class Session:
    """One logged-in browser: its CSRF secret and the notes to show on its next page."""

    csrf: str = attrs.Factory(lambda: secrets.token_urlsafe(32))
    flash: list[tuple[str, str]] = attrs.Factory(list)


@attrs.define(eq=False)
class Guard:
    """The login, session and request checks of one server on *port*."""

    key: bytes
    port: int
    _used: dict[str, int] = attrs.Factory(dict)  # nonce -> expiry, until it passes
    _sessions: dict[str, Session] = attrs.Factory(dict)

    @property
    def cookie_name(self) -> str:
        return f"fleet_web_{self.port}"

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset({f"127.0.0.1:{self.port}", f"localhost:{self.port}"})

    @property
    def origins(self) -> frozenset[str]:
        return frozenset(f"http://{host}" for host in self.hosts)

    def login(self, token: str, *, now: float | None = None) -> tuple[str, Session] | None:
        """A new session for a valid, unused, unexpired *token* (which is then spent)."""
        now = time.time() if now is None else now
        for nonce, expiry in list(self._used.items()):
            if expiry < now:
                del self._used[nonce]
        nonce, _, rest = token.partition(".")
        expiry_text, _, mac = rest.partition(".")
        if not (nonce and expiry_text.isdigit() and mac):
            return None
        expiry = int(expiry_text)
        if not hmac.compare_digest(mac, _mac(self.key, nonce, expiry)):
            return None
        if expiry < now or nonce in self._used:
            return None
        self._used[nonce] = expiry
        cookie = secrets.token_urlsafe(32)
        session = self._sessions[cookie] = Session()
        return cookie, session

    def session(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        # A dict lookup by a 256-bit random key: no timing left to compare in constant time.
        return self._sessions.get(cookie)

    def set_cookie_header(self, cookie: str) -> str:
        return f"{self.cookie_name}={cookie}; HttpOnly; SameSite=Strict; Path=/"

    def check_csrf(self, session: Session, presented: object) -> bool:
        return isinstance(presented, str) and hmac.compare_digest(
            presented.encode(), session.csrf.encode()
        )


def _header(scope: Scope, name: bytes) -> str | None:
    values = [value for key, value in scope.get("headers", []) if key.lower() == name]
    if len(values) != 1:
        return None  # absent, or sent twice: neither is trusted
    return bytes(values[0]).decode("latin-1")


def request_session(scope: Scope, guard: Guard) -> Session | None:
    """The session whose cookie *scope* carries, if any."""
    raw = _header(scope, b"cookie")
    if raw is None:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:
        return None
    morsel = jar.get(guard.cookie_name)
    return guard.session(morsel.value if morsel is not None else None)


@attrs.define(eq=False)
class GuardMiddleware:
    """ASGI middleware: Host, session and Origin checks in front of *app*."""

    app: ASGIApp
    guard: Guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return  # no websockets here
        refusal = self.refusal(scope)
        if refusal is not None:
            status, text = refusal
            await _plain(send, status, text)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """Why *scope* is refused (status, one line), or ``None``."""
        guard = self.guard
        if _header(scope, b"host") not in guard.hosts:
            return 403, "refused: this server answers only 127.0.0.1 and localhost on its port"
        method = scope.get("method", "GET")
        if scope.get("path") == LOGIN_PATH and method in SAFE_METHODS:
            return None
        if request_session(scope, guard) is None:
            return 401, "not logged in: open the URL that `fleet web` prints"
        if method not in SAFE_METHODS and _header(scope, b"origin") not in guard.origins:
            return 403, "refused: a state-changing request must come from this page"
        return None


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
