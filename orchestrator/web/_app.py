"""The pages: Starlette routes rendering Jinja2 templates (autoescaped) from control replies.

Reads are control ops (``peek``, ``events``, ``diff``, ``usage``, ``logs``, ``discuss``);
every action is ``POST /act/<name>`` with a form, checked for its CSRF token here (its
``Origin`` and session were checked by the guard) and sent as the control op of
:data:`orchestrator.web._ops.ACTIONS`. Live parts of a page come as server-sent events: the
server re-renders the fragment every :data:`LIVE_INTERVAL` and sends it when it changed.
"""

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, Final

import attrs
import jinja2
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator._errors import FleetError, NotFound, UsageError
from orchestrator._records import shown_state
from orchestrator.web import _render
from orchestrator.web._guard import CSRF_FIELD, CSRF_HEADER, Guard, GuardMiddleware, Session
from orchestrator.web._guard import request_session as session_of
from orchestrator.web._ops import Client
from orchestrator.web._timeline import Timelines

log = logging.getLogger(__name__)

#: How often a live fragment is re-rendered (seconds): a new child shows within a second.
LIVE_INTERVAL: Final = 0.4
#: How long one ``peek`` answers every page that asks (seconds): streams share it.
FRESH: Final = 0.25
#: A comment line this often keeps an idle stream open through any proxy (seconds).
KEEPALIVE: Final = 15.0
#: Every response: no inline script, nothing from elsewhere, no framing by another page.
SECURITY_HEADERS: Final = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # no-referrer would make Origin "null"
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}
#: The most democracy rounds the paper page shows.
MAX_ROUNDS: Final = 50
STATIC: Final = {"app.js": "text/javascript", "style.css": "text/css"}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.web", "templates"),
        autoescape=True,  # every template: a child's words are text, whatever they contain
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["age"] = _render.age
    env.filters["since"] = _render.since
    env.filters["budget"] = _render.budget_of
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    return env


def _offset(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def _safe_next(value: object) -> str:
    """A same-origin path to return to after an action (never another host)."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    return "/" if any(c in value for c in "\\\r\n") else value


@attrs.define(eq=False)
class WebApp:
    """The web view of one session: its guard, control client and page state."""

    guard: Guard
    client: Client
    session_name: str
    timelines: Timelines = attrs.Factory(Timelines)
    env: jinja2.Environment = attrs.Factory(_environment)
    _reading: trio.Lock = attrs.Factory(trio.Lock)
    _peeked: tuple[float, dict[str, Any]] | None = None

    def asgi(self) -> GuardMiddleware:
        routes = [
            Route("/login", self.login),
            Route("/", self.fleet_page),
            Route("/child/{key}", self.child_page),
            Route("/questions", self.questions_page),
            Route("/paper", self.paper_page),
            Route("/usage", self.usage_page),
            Route("/live/{view}", self.live),
            Route("/live/child/{key}", self.live_child),
            Route("/act/{name}", self.act, methods=["POST"]),
            Route("/static/{name}", self.static),
        ]
        return GuardMiddleware(Starlette(routes=routes), self.guard)

    # -- helpers ----------------------------------------------------------------------------

    def _session(self, request: Request) -> Session:
        session = session_of(request.scope, self.guard)
        assert session is not None  # noqa: S101 - the guard let only sessions through
        return session

    def _page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        session = self._session(request)
        flash, session.flash[:] = list(session.flash), []
        html = self.env.get_template(template).render(
            csrf=session.csrf,
            flash=flash,
            path=request.url.path,
            session_name=self.session_name,
            **context,
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    async def _fleet(self) -> dict[str, Any]:
        """The fleet (``peek``) with the journal read up to now. Every open page's stream asks
        for it; one answer serves them all for :data:`FRESH` seconds."""
        async with self._reading:
            if self._peeked is not None and trio.current_time() - self._peeked[0] < FRESH:
                return self._peeked[1]
            peek = await self.client.call("peek", {})
            try:
                await self.timelines.refresh(self.client.call)
            except FleetError as exc:  # a supervisor without a journal still has a fleet
                log.debug("no journal: %s", exc)
            self._peeked = (trio.current_time(), peek)
            return peek

    def _fleet_context(self, peek: Mapping[str, Any]) -> dict[str, Any]:
        agents = _render.fleet_order(peek.get("agents", []))
        asked = {q["id"]: q["text"] for q in peek.get("questions", [])}
        rows = [
            {
                "agent": agent,
                "asks": asked.get(agent.get("question") or "", agent.get("question")),
                "shown": shown_state(str(agent.get("state")), str(agent.get("activity"))),
                "spawned": self.timelines.spawned.get(agent["key"], {}),
                "model": _render.model_of(agent, self.timelines.spawned.get(agent["key"])),
            }
            for agent in agents
        ]
        return {"peek": peek, "rows": rows, "questions": peek.get("questions", [])}

    # -- routes -----------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        made = self.guard.login(token)
        if made is None:
            return Response(
                "this login link is spent, expired or wrong: run `fleet web` for a new one\n",
                status_code=401,
                media_type="text/plain",
                headers=SECURITY_HEADERS,
            )
        cookie, _ = made
        response = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
        response.headers["set-cookie"] = self.guard.set_cookie_header(cookie)
        return response

    async def fleet_page(self, request: Request) -> Response:
        try:
            peek = await self._fleet()
        except FleetError as exc:
            return self._page(request, "error.html", 503, error=str(exc))
        return self._page(request, "fleet.html", **self._fleet_context(peek))

    async def _child(self, key: str) -> dict[str, Any]:
        peek = await self.client.call("peek", {"agents": [key], "recent": True})
        await self.timelines.refresh(self.client.call)
        agents: list[dict[str, Any]] = peek["agents"]
        asked = {q["id"]: q["text"] for q in peek.get("questions", [])}
        question = agents[0].get("question")
        recent = (peek.get("recent") or {}).get(agents[0]["key"], [])
        return {
            **agents[0],
            "asks": asked.get(question, question) if question else None,
            "recent": recent if isinstance(recent, list) else [],
        }

    async def child_page(self, request: Request) -> Response:
        key = request.path_params["key"]
        try:
            agent = await self._child(key)
        except NotFound as exc:
            return self._page(request, "error.html", 404, error=str(exc))
        except FleetError as exc:
            return self._page(request, "error.html", 503, error=str(exc))
        key = agent["key"]
        files, logs = [], ""
        try:
            diff = await self.client.call("diff", {"targets": [key]})
            files = [
                {**f, "html": _render.highlighted_diff(f.get("diff") or "")}
                for f in diff.get("files", [])
            ]
        except FleetError as exc:
            self._session(request).flash.append(("error", f"diff: {exc}"))
        try:
            logs = (await self.client.call("logs", {"agent": key, "tail": 6000})).get("tail", "")
        except FleetError as exc:
            logs = f"(no log: {exc})"
        offsets = {
            part: _offset(request.query_params.get(part)) for part in ("report", "transcript")
        }
        return self._page(
            request,
            "child.html",
            agent=agent,
            spawned=self.timelines.spawned.get(key, {}),
            model=_render.model_of(agent, self.timelines.spawned.get(key)),
            timeline=self.timelines.of(key, agent["recent"]),
            reports=self.timelines.reports(key),
            files=files,
            logs=logs,
            full={part: await self._part(key, part, offsets[part]) for part in offsets},
        )

    async def _part(self, key: str, part: str, offset: int) -> dict[str, Any] | None:
        """A page of the child's whole report or transcript (``fleet report``), or ``None``
        when there is none (or the supervisor has no such op)."""
        try:
            return await self.client.call("report", {"agent": key, "part": part, "offset": offset})
        except FleetError as exc:
            log.debug("no %s for %s: %s", part, key, exc)
            return None

    async def questions_page(self, request: Request) -> Response:
        try:
            peek = await self._fleet()
        except FleetError as exc:
            return self._page(request, "error.html", 503, error=str(exc))
        return self._page(request, "questions.html", **self._fleet_context(peek))

    async def paper_page(self, request: Request) -> Response:
        try:
            paper = await self.client.call("discuss", {"action": "list", "since": "d0"})
            brief = await self.client.call("brief", {})
        except FleetError as exc:
            return self._page(request, "error.html", 503, error=str(exc))
        rounds = await self._rounds()
        return self._page(
            request, "paper.html", paper=paper, brief=brief.get("text", ""), rounds=rounds
        )

    async def _rounds(self) -> list[dict[str, Any]]:
        """This session's democracy rounds (``r1``, ``r2``, …), newest first: each one's
        outcome, or ``running`` (``fleet vote``'s wait with no time to wait)."""
        rounds = []
        for number in range(1, MAX_ROUNDS + 1):
            try:
                rounds.append(
                    await self.client.call(
                        "vote", {"action": "wait", "round": f"r{number}", "timeout": 0}
                    )
                )
            except FleetError:
                break
        return rounds[::-1]

    async def usage_page(self, request: Request) -> Response:
        try:
            usage = await self.client.call("usage", {})
        except FleetError as exc:
            return self._page(request, "error.html", 503, error=str(exc))
        children = [(f"{a['key']} {a.get('agent', '')}", a) for a in usage.get("agents", [])]
        tokens = float(usage.get("session", {}).get("tokens") or 0)
        try:
            await self.timelines.refresh(self.client.call)
        except FleetError as exc:  # a supervisor without a journal still has a ledger
            log.debug("no journal: %s", exc)
        definitions = list(usage.get("definitions", {}).items())
        return self._page(
            request,
            "usage.html",
            usage=usage,
            by_child=_render.bar_chart(_render.usage_rows(children)),
            by_definition=_render.bar_chart(_render.usage_rows(definitions)),
            over_time=_render.line_chart([*self.timelines.spending(), (time.time(), tokens)]),
        )

    async def act(self, request: Request) -> Response:
        session = self._session(request)
        form = await request.form()
        presented = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if not self.guard.check_csrf(session, presented):
            return Response(
                "refused: missing or wrong CSRF token\n",
                status_code=403,
                media_type="text/plain",
                headers=SECURITY_HEADERS,
            )
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        name = request.path_params["name"]
        try:
            said = await self.client.act(name, fields)
        except UsageError as exc:
            session.flash.append(("error", f"{name}: {exc}"))
        except FleetError as exc:
            session.flash.append(("error", f"{name}: {exc}"))
        else:
            session.flash.append(("ok", said))
        self._peeked = None  # the next page shows what the action changed
        return RedirectResponse(
            _safe_next(fields.get("next")), status_code=303, headers=SECURITY_HEADERS
        )

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == "highlight.css":
            css = _render.highlight_css()
            return Response(css, media_type="text/css", headers=SECURITY_HEADERS)
        if name not in STATIC:
            return Response("no such file\n", status_code=404, media_type="text/plain")
        text = resources.files("orchestrator.web").joinpath("static", name).read_text()
        return Response(text, media_type=STATIC[name], headers=SECURITY_HEADERS)

    # -- live -------------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        view = request.path_params["view"]
        templates = {"fleet": "_fleet_rows.html", "questions": "_questions.html"}
        if view not in templates:
            return Response("no such view\n", status_code=404, media_type="text/plain")
        template = self.env.get_template(templates[view])

        async def render() -> str:
            peek = await self._fleet()
            return template.render(csrf=self._session(request).csrf, **self._fleet_context(peek))

        return self._stream(render, view)

    async def live_child(self, request: Request) -> Response:
        key = request.path_params["key"]
        template = self.env.get_template("_child_live.html")

        async def render() -> str:
            agent = await self._child(key)
            return template.render(
                agent=agent,
                model=_render.model_of(agent, self.timelines.spawned.get(agent["key"])),
                timeline=self.timelines.of(agent["key"], agent["recent"]),
                reports=self.timelines.reports(agent["key"]),
            )

        return self._stream(render, "child")

    def _stream(self, render: Callable[[], Awaitable[str]], event: str) -> Response:
        async def events() -> AsyncIterator[str]:
            last, quiet = "", 0.0
            while True:
                try:
                    html = await render()
                except FleetError as exc:
                    html = self.env.get_template("_gone.html").render(error=str(exc))
                if html != last:
                    last, quiet = html, 0.0
                    data = "\n".join(f"data: {line}" for line in html.splitlines() or [""])
                    yield f"event: {event}\n{data}\n\n"
                elif quiet >= KEEPALIVE:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
                await trio.sleep(LIVE_INTERVAL)
                quiet += LIVE_INTERVAL

        headers = {**SECURITY_HEADERS, "x-accel-buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
