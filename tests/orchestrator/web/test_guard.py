"""The web view's guard on a real Hypercorn server: login, session cookie, Host, Origin, CSRF.

The supervisor side is a recording control client: every refusal is also checked to have
reached no control op (a refused stop must not stop anything).
"""

import contextlib
import http.client as http_client
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import httpx
import pytest
import trio

from orchestrator._errors import NotFound
from orchestrator.web._app import WebApp, _safe_next
from orchestrator.web._guard import LOGIN_TTL, Guard, mint_login
from orchestrator.web._ops import Client
from orchestrator.web._server import serve_app

DASH = "\N{EN DASH}"
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)><b>bold</b>"
AGENT = {
    "key": "a1",
    "name": "scout-1",
    "agent": "scout",
    "mode": "scout",
    "state": "idle",
    "queued": False,
    "progress": {"done": 0, "total": 0, "current": None, "next": []},
    "activity": "idle",
    "last_event_age_s": 1.0,
    "sandboxed": True,
    "unsandboxed_reason": "",
    "usage": {"tokens": 10, "cost_usd": None},
    "question": None,
    "models": [],
}
PEEK = {
    "session": "t",
    "mode": "build",
    "cap": 4,
    "lane": {"capacity": 3, "working": 0, "queued": 0},
    "agents": [AGENT],
    "questions": [],
}
EVENTS = {
    "events": [
        {"seq": 1, "at": time.time(), "kind": "spawn", "key": "a1", "task": HOSTILE},
        {
            "seq": 2,
            "at": time.time(),
            "kind": "settled",
            "key": "a1",
            "state": "idle",
            "turn": 1,
            "report": HOSTILE,
            "error": "",
        },
    ],
    "seq": 2,
}


FILES = [
    {
        "path": "/repo/src/app.py",
        "owner": "a1",
        "status": "modified",
        "diff": "--- a/src/app.py\n+++ b/src/app.py\n-    return 42\n+    return 43\n",
        "pending": True,
        "held": "",
    },
    {
        "path": "/repo/.mcp.json",
        "owner": "a1",
        "status": "added",
        "diff": "--- /dev/null\n+++ b/.mcp.json\n+{}\n",
        "pending": True,
        "held": "agent and MCP config: instructs an agent",
    },
    {"path": "/repo/NOTES.md", "owner": "a1", "status": "added", "diff": "+x\n", "pending": False},
]
ROUND = {
    "round": "r1",
    "status": "winner",
    "invited": ["a1", "a2", "a3"],
    "counts": {"sqlite": 2, "postgres": 1},
    "ballots": [
        {"voter": "a1", "status": "valid", "option": "sqlite", "rationale": HOSTILE, "reason": ""},
        {"voter": "a2", "status": "valid", "option": "sqlite", "rationale": "small", "reason": ""},
        {"voter": "a3", "status": "valid", "option": "postgres", "rationale": "", "reason": ""},
    ],
    "winner": "sqlite",
}
USAGE = {
    "session": {"tokens": 30, "cost_usd": None, "children": 2, "budget": {}},
    "agents": [{"key": "a1", "agent": HOSTILE, "tokens": 20}, {"key": "a2", "tokens": 10}],
    "definitions": {"scout": {"tokens": 30}},
}


#: The control ops a page reads with (everything else acts).
READS = frozenset({"peek", "events", "diff", "logs", "report", "vote", "discuss", "usage", "brief"})


@attrs.define(eq=False)
class RecordingClient(Client):
    calls: list[tuple[str, dict[str, Any]]] = attrs.Factory(list)
    state: str = "idle"

    async def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append((op, dict(args)))
        if op == "peek":
            return {**PEEK, "agents": [{**AGENT, "state": self.state}]}
        if op == "events":
            return EVENTS if args.get("since", 0) < 2 else {"events": [], "seq": 2}
        if op == "stop":
            return {"handoffs": [{"key": "a1", "state": "stopped", "applied": []}]}
        if op == "diff":
            return {"files": FILES}
        if op == "apply":
            return {"handoffs": [{"key": "a1", "state": "stopped", "applied": args["paths"]}]}
        if op == "logs":
            return {"tail": HOSTILE}
        if op == "vote":
            if args["round"] != "r1":
                raise NotFound(f"vote: no round {args['round']!r}")
            return ROUND
        if op == "discuss":
            return {"entries": [{"id": "d1", "author": "a1", "to": None, "text": HOSTILE}]}
        if op == "usage":
            return USAGE
        if op == "report":
            text = HOSTILE * 3 if args["part"] == "report" else "line\n" * 100
            offset = args["offset"]
            end = min(len(text), offset + 120)
            return {
                "key": "a1",
                "part": args["part"],
                "offset": offset,
                "text": text[offset:end],
                "next_offset": end if end < len(text) else None,
                "total": len(text),
            }
        return {}

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls if op not in READS]


@attrs.define
class Served:
    port: int
    guard: Guard
    client: RecordingClient

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def http(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, follow_redirects=False, timeout=10, **kw)

    @contextlib.asynccontextmanager
    async def logged_in(self) -> AsyncIterator[httpx.AsyncClient]:
        async with self.http() as http:
            login = await http.get("/login", params={"token": mint_login(self.guard.key)})
            assert login.status_code == 303
            yield http

    async def csrf(self, http: httpx.AsyncClient) -> str:
        page = await http.get("/")
        assert page.status_code == 200, page.text
        found = re.search(r'name="csrf" value="([^"]+)"', page.text) or re.search(
            r'name="csrf" value="([^"]+)"', (await http.get("/child/a1")).text
        )
        assert found is not None
        return found.group(1)


@pytest.fixture
async def served(nursery, tmp_path):
    client = RecordingClient(socket=tmp_path / "none.sock", token_path=tmp_path / "none.token")
    guard = Guard(key=b"k" * 32, port=0)
    app = WebApp(guard=guard, client=client, session_name="t")
    stopped = trio.Event()
    port = await nursery.start(serve_app, app, stopped)
    yield Served(port=port, guard=guard, client=client)
    stopped.set()


async def test_no_login_is_401_and_reaches_no_op(served):
    async with served.http() as http:
        for path in ("/", "/child/a1", "/questions", "/usage", "/live/fleet", "/static/app.js"):
            assert (await http.get(path)).status_code == 401, path
        stop = await http.post("/act/stop", data={"agent": "a1"}, headers={"Origin": served.base})
        assert stop.status_code == 401
    assert served.client.calls == []


async def test_a_login_token_works_once_and_sets_a_strict_httponly_cookie(served):
    token = mint_login(served.guard.key)
    async with served.http() as http:
        login = await http.get("/login", params={"token": token})
        assert login.status_code == 303
        assert login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(f"fleet_web_{served.port}=")
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert (await http.get("/")).status_code == 200
    async with served.http() as again:
        assert (await again.get("/login", params={"token": token})).status_code == 401
        assert (await again.get("/")).status_code == 401


async def test_forged_and_expired_tokens_are_refused(served):
    key = served.guard.key
    expired = mint_login(key, now=time.time() - LOGIN_TTL - 5)
    forged = mint_login(b"x" * 32)
    nonce, expiry, mac = mint_login(key).split(".")
    stretched = f"{nonce}.{int(expiry) + 3600}.{mac}"
    async with served.http() as http:
        for token in (expired, forged, stretched, "", "a.b.c", "...."):
            assert (await http.get("/login", params={"token": token})).status_code == 401
        assert (await http.get("/")).status_code == 401


async def test_a_foreign_host_is_refused_even_with_a_session(served):
    async with served.logged_in() as http:
        csrf = await served.csrf(http)
        for host in (f"evil.example:{served.port}", "127.0.0.1", f"127.0.0.1:{served.port + 1}"):
            page = await http.get("/", headers={"Host": host})
            assert page.status_code == 403, host
            stop = await http.post(
                "/act/stop",
                data={"agent": "a1", "csrf": csrf},
                headers={"Host": host, "Origin": f"http://{host}"},
            )
            assert stop.status_code == 403
        assert (
            await http.get("/", headers={"Host": f"localhost:{served.port}"})
        ).status_code == 200
    assert served.client.ops() == []


async def test_a_cross_site_post_is_refused(served):
    async with served.logged_in() as http:
        csrf = await served.csrf(http)
        # What a hostile page's auto-submitting form sends (were the cookie sent at all).
        forged = await http.post(
            "/act/stop", data={"agent": "a1"}, headers={"Origin": "http://evil.example"}
        )
        assert forged.status_code == 403
        # Even knowing the CSRF token, a wrong Origin is refused; so is none.
        wrong = await http.post(
            "/act/stop", data={"agent": "a1", "csrf": csrf}, headers={"Origin": "null"}
        )
        assert wrong.status_code == 403
        missing = await http.post("/act/stop", data={"agent": "a1", "csrf": csrf})
        assert missing.status_code == 403
        # The right Origin without the CSRF token (or with another's) is refused too.
        for token in ("", "x" * 43):
            bad = await http.post(
                "/act/stop", data={"agent": "a1", "csrf": token}, headers={"Origin": served.base}
            )
            assert bad.status_code == 403
        assert served.client.ops() == []
        ok = await http.post(
            "/act/stop", data={"agent": "a1", "csrf": csrf}, headers={"Origin": served.base}
        )
        assert ok.status_code == 303
    assert served.client.ops() == ["stop"]
    assert ("stop", {"agents": ["a1"]}) in served.client.calls


async def test_a_csrf_token_in_the_header_is_accepted(served):
    async with served.logged_in() as http:
        csrf = await served.csrf(http)
        ok = await http.post(
            "/act/pause",
            data={"agent": "a1"},
            headers={"Origin": served.base, "X-CSRF-Token": csrf},
        )
        assert ok.status_code == 303
    assert served.client.ops() == ["pause"]


async def test_a_childs_words_are_escaped_and_scripts_are_forbidden(served):
    async with served.logged_in() as http:
        for path in ("/child/a1",):
            page = await http.get(path)
            assert page.status_code == 200
            assert "<script>document" not in page.text
            assert "<img src=x" not in page.text
            assert "&lt;script&gt;document.title=" in page.text
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp
            assert "unsafe-inline" not in csp


async def test_after_an_action_the_page_returns_only_to_a_local_path(served):
    assert _safe_next("/child/a1") == "/child/a1"
    for hostile in ("//evil.example/", "https://evil.example/", "/\\evil.example", "x", None):
        assert _safe_next(hostile) == "/"
    async with served.logged_in() as http:
        csrf = await served.csrf(http)
        reply = await http.post(
            "/act/pause",
            data={"agent": "a1", "csrf": csrf, "next": "//evil.example/"},
            headers={"Origin": served.base},
        )
        assert reply.headers["location"] == "/"


async def test_an_unknown_action_reaches_no_op(served):
    async with served.logged_in() as http:
        csrf = await served.csrf(http)
        reply = await http.post(
            "/act/shutdown", data={"csrf": csrf}, headers={"Origin": served.base}
        )
        assert reply.status_code == 303
        page = await http.get("/")
        assert "no such action: shutdown" in page.text
    assert served.client.ops() == []


async def test_the_paper_rounds_and_usage_are_read_through_their_ops_and_escaped(served):
    async with served.logged_in() as http:
        paper = await http.get("/paper")
        assert paper.status_code == 200
        assert 'data-round="r1"' in paper.text
        assert "r1 · winner" in paper.text
        assert paper.text.count('<td class="text">sqlite</td>') == 3  # the tally, two ballots
        usage = await http.get("/usage")
        assert usage.status_code == 200
        assert usage.text.count("<rect") == 3  # two children, one definition
        for page in (paper, usage):
            assert "<script>document" not in page.text
            assert "&lt;script&gt;" in page.text
    rounds = [args["round"] for op, args in served.client.calls if op == "vote"]
    assert rounds == ["r1", "r2"]  # read until the first round that is not there
    assert all(args["action"] == "wait" for op, args in served.client.calls if op == "vote")


async def test_a_kept_change_is_applied_one_named_file_at_a_time(served):
    async with served.logged_in() as http:
        live = await http.get("/child/a1")
        assert 'action="/act/apply"' not in live.text  # a live child's change cannot land
        assert 'value="hold"' not in live.text  # a scout has no change to hold
        served.client.state = "stopped"
        page = (await http.get("/child/a1")).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        forms = re.findall(r'<form method="post" action="/act/apply".*?</form>', page, re.DOTALL)
        assert len(forms) == 2  # one per pending file, none for "everything"
        assert all('name="path" value="/repo/' in form for form in forms)
        assert "held: agent and MCP config: instructs an agent" in page
        assert "Apply this held file" in page
        assert page.count("Accept this file") == 1  # the applied file: accept or revert
        reply = await http.post(
            "/act/apply",
            data={"agent": "a1", "path": "/repo/.mcp.json", "csrf": csrf},
            headers={"Origin": served.base},
        )
        assert reply.status_code == 303
        missing = await http.post(
            "/act/apply", data={"agent": "a1", "csrf": csrf}, headers={"Origin": served.base}
        )
        assert missing.status_code == 303
        assert "apply: path is empty" in (await http.get("/child/a1")).text
    applied = [args for op, args in served.client.calls if op == "apply"]
    assert applied == [{"agent": "a1", "paths": ["/repo/.mcp.json"]}]


async def test_the_whole_report_and_transcript_are_paged_as_text(served):
    async with served.logged_in() as http:
        page = (await http.get("/child/a1")).text
        assert "Whole report" in page
        assert f"characters 0{DASH}120 of {len(HOSTILE) * 3}" in page
        assert '<a href="?report=120">next page</a>' in page
        assert "<script>document" not in page
        second = (await http.get("/child/a1", params={"transcript": "120"})).text
        assert f"characters 120{DASH}240 of 500" in second
        assert '<a href="?transcript=0">first page</a>' in second
        assert (await http.get("/child/a1", params={"transcript": "-5"})).status_code == 200
    reads = [args for op, args in served.client.calls if op == "report"]
    assert {"agent": "a1", "part": "transcript", "offset": 120} in reads
    assert {"agent": "a1", "part": "transcript", "offset": 0} in reads  # "-5" reads the start


async def test_the_live_fleet_is_a_stream_of_server_sent_fragments(served):
    async with served.logged_in() as http:
        cookie = "; ".join(f"{name}={value}" for name, value in http.cookies.items())

    def first_event() -> tuple[str, list[str]]:
        # The stdlib client in a thread: it reads a never-ending body line by line and closes.
        connection = http_client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        try:
            connection.request("GET", "/live/fleet", headers={"Cookie": cookie})
            response = connection.getresponse()
            lines: list[str] = []
            while line := response.readline().decode().rstrip("\n"):
                lines.append(line)
            return response.getheader("content-type") or "", lines
        finally:
            connection.close()

    kind, lines = await trio.to_thread.run_sync(first_event)
    assert kind.startswith("text/event-stream")
    assert lines[0] == "event: fleet"
    assert all(line.startswith("data: ") for line in lines[1:])
    assert any('data-key="a1"' in line for line in lines)
