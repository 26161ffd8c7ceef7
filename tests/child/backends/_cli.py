"""What the agent-CLI backend tests share: a real CLI's backend on the scripted model server,
and the turns every such test runs on it, each under a ceiling and closing the backend after.

The CLIs are the pinned ones in ``.npm-prefix/bin`` (``pi``, ``pi-next``, ``claude``, ``codex``);
each talks only to a :class:`~tests.fakes.model_server.ModelServer`, whose script ``"a"`` the
backend plays.
"""

import contextlib

import trio

import ipc
from child.backends._claude import ClaudeBackend
from child.backends._codex import CodexBackend
from child.backends._pi import PiBackend
from tests.child.backends._backends import Host, make_loadout
from tests.fakes._agent_clis import NPM_BIN
from tests.fakes.model_server import ModelServer

#: The variable a Claude Code loadout names for its API key (the Claude tests set it).
ANTHROPIC_KEY_ENV = "FLEET_TEST_ANTHROPIC_KEY"


#: Tool names (in any CLI's spelling) no fleet child may be offered.
ESCAPES = {
    "multi_agent_v1",
    "spawn_agent",
    "send_input",
    "wait_agent",
    "close_agent",
    "web_search",
    "request_user_input",
    "update_plan",
    "get_goal",
    "create_goal",
    "update_goal",
    "Task",
    "Agent",
    "WebFetch",
    "WebSearch",
    "TodoWrite",
    "AskUserQuestion",
}


def offered(request):
    """The tool names of one model request (chat ``function.name``, else ``name``/``type``)."""
    names = []
    for tool in request.body.get("tools") or []:
        function = tool.get("function")
        names.append(function["name"] if isinstance(function, dict) else tool.get("name"))
    return names


def _openai_loadout(tmp_path, backend, base_url, fields):
    model = ipc.ModelSpec(kind="openai", name="fake-model", base_url=f"{base_url}/v1")
    return make_loadout(tmp_path, **({"backend": backend, "model": model} | fields))


def pi_loadout(tmp_path, base_url, **fields):
    return _openai_loadout(tmp_path, "pi", base_url, fields)


def codex_loadout(tmp_path, base_url, **fields):
    return _openai_loadout(tmp_path, "codex", base_url, fields)


def claude_loadout(tmp_path, base_url, **fields):
    model = ipc.ModelSpec(
        kind="anthropic", name="claude-fake", base_url=base_url, api_key_env=ANTHROPIC_KEY_ENV
    )
    return make_loadout(tmp_path, **({"backend": "claude", "model": model} | fields))


_BACKENDS = {
    "pi": (PiBackend, pi_loadout),
    "claude": (ClaudeBackend, claude_loadout),
    "codex": (CodexBackend, codex_loadout),
}


def make_backend(binary, tmp_path, srv, *, stall=30.0, answers=(), **fields):
    """The backend of the CLI *binary* (``pi-next`` is a Pi) playing *srv*'s script ``"a"``,
    and the host that records what it did; *fields* go into its loadout."""
    return make_backend_at(
        binary,
        str(NPM_BIN / binary),
        tmp_path,
        srv.base_url("a"),
        stall=stall,
        answers=answers,
        **fields,
    )


def make_backend_at(kind, binary, tmp_path, base_url, *, stall=30.0, answers=(), **fields):
    """:func:`make_backend` for the CLI at the path *binary*, its model at *base_url*."""
    backend_class, loadout = _BACKENDS["pi" if kind.startswith("pi") else kind]
    host = Host(answers)
    backend = backend_class(
        loadout=loadout(tmp_path, base_url, **fields), host=host, binary=binary, stall=stall
    )
    return backend, host


async def wait_for_requests(srv: ModelServer, child: str, count: int = 1) -> None:
    """Until the server has seen *count* requests from *child* (it runs in another thread)."""
    while len(srv.requests(child)) < count:  # noqa: ASYNC110 - no event crosses the thread
        await trio.sleep(0.05)


@contextlib.asynccontextmanager
async def closing(backend, seconds=60):
    """Run the block within *seconds*, then close *backend*, whatever happened."""
    try:
        with trio.fail_after(seconds):
            yield
    finally:
        await backend.aclose()


async def turns(backend, *texts, seconds=60):
    """The results of *texts* run as turns one after another; *backend* is closed after."""
    async with closing(backend, seconds):
        return [await backend.run_turn(text) for text in texts]


async def turn_while(backend, text, meanwhile):
    """The result of a turn on *text* while ``meanwhile()`` runs beside it (a steer, a pause)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(meanwhile)
        return await backend.run_turn(text)


async def failed_then_recovered(srv, backend):
    """A turn whose model request gets an HTTP 500, then one that gets an answer."""
    srv.script("a", [{"status": 500, "body": "upstream exploded"}, {"text": "recovered"}])
    return await turns(backend, "go", "try again", seconds=30)


async def stalled_then_resumed(srv, backend):
    """A turn whose model stream stalls after a few words, the seconds from its model request
    to its end, then a turn whose stream flows (*backend* should have a short ``stall``).

    Timed from the request, not the turn's start: a CLI's own start-up (seconds on a loaded
    machine) is not the watchdog's. The request is seen by polling, up to 0.05 s late."""
    srv.script("a", [{"stall": True, "text": "partial words"}, {"text": "fine again"}])
    asked: list[float] = []

    async def note_the_request() -> None:
        while not any(r.api for r in srv.requests("a")):  # noqa: ASYNC110 - another thread
            await trio.sleep(0.01)
        asked.append(trio.current_time())

    async with closing(backend, 60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(note_the_request)
            stalled = await backend.run_turn("go")
            nursery.cancel_scope.cancel()
        elapsed = trio.current_time() - asked[0] if asked else float("inf")
        resumed = await backend.run_turn("again")
    return stalled, elapsed, resumed


async def paused_then_resumed(srv, backend, *, requests=1):
    """A turn paused (``abort``) once the server has seen *requests* requests, then the next
    turn, which continues the same conversation."""
    srv.script("a", [{"delay": 30, "text": "too late"}, {"text": "resumed"}])

    async def pause():
        await wait_for_requests(srv, "a", requests)
        await backend.abort()

    async with closing(backend):
        paused = await turn_while(backend, "first task", pause)
        resumed = await backend.run_turn("second task")
    return paused, resumed


async def steered(srv, backend, *, requests=1, ready=lambda: True):
    """The result of a turn on "go west" steered with "go east instead" once the server has
    seen *requests* requests and ``ready()`` holds; held turns (``"hold": True``) answer once
    the steer is in."""

    async def steer():
        await wait_for_requests(srv, "a", requests)
        while not ready():  # noqa: ASYNC110 - polling the backend
            await trio.sleep(0.05)
        await backend.steer("go east instead")
        srv.release()

    async with closing(backend):
        return await turn_while(backend, "go west", steer)
