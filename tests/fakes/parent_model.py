"""A parent model for the scripted model server: it delegates real work through fleet's tools.

``srv.play(child, ParentModel(...))`` makes the model server play a parent agent's model. On
each request it reads the tools the parent CLI offers, finds fleet's by name (whatever prefix
the CLI gives an MCP server's or an extension's tools: ``mcp__fleet__spawn``, ``fleet_spawn``,
Codex's ``mcp__fleet/spawn``), reads the results the CLI sent back, and
emits the next call of its plan:

1. spawn two scouts, two ``spawn`` calls in one turn (they map the code in parallel);
2. wait until both settled;
3. spawn a worker that fixes the bug and runs the tests in its sandbox;
4. wait until it settled; stop it with ``hold`` (its change is kept, not landed);
5. read the held diff (``review`` diff); ``apply`` it; stop the scouts; answer.

``shape="full"`` fills every field the schema offers that the plan can use; ``"minimal"`` sends
the fewest arguments that do the job; ``"both"`` alternates, verb by verb (the first scout's
spawn full, the second's minimal, the worker's full; the one review minimal, the one apply
full), so one run of a real parent carries both shapes. How today's tools are named and
called lives in :data:`VERBS` and :data:`CALLS` only: when fleet's tool schemas change, this
table changes.
A request that offers none of fleet's tools (a CLI's title or routing side request) gets a
short text.
"""

from __future__ import annotations

import json
import re
import threading
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from tests.fakes.model_server import Request

#: The plan's verbs → the name fleet's tool has for it today (the last part of the tool name).
VERBS: dict[str, str] = {
    "spawn": "spawn",
    "wait": "wait",
    "stop": "stop",
    "review": "review",
    "apply": "apply",
}


#: The parent CLI's own tool that waits for its MCP servers to connect (Claude Code).
WAIT_FOR_SERVERS = "WaitForMcpServers"

_BUDGET = {"hard_tokens": 1_000_000, "hard_usd": 9}


def _spawn(full: bool, task: dict[str, Any]) -> dict[str, Any]:
    """One child a call: two scouts are two calls in one turn."""
    if full:
        return {**task, "backend": "builtin", "budget": _BUDGET}
    keep = ("task", "model", "agent") if task.get("agent") == "worker" else ("task", "model")
    return {k: task[k] for k in keep}


def _wait(full: bool, keys: list[str]) -> dict[str, Any]:
    return {"agents": keys, "all": True, "timeout": 45} if full else {"agents": keys}


def _stop(full: bool, keys: list[str], hold: bool = False) -> dict[str, Any]:
    return {"agents": keys} | ({"hold": True} if hold else {})


def _review(full: bool, keys: list[str]) -> dict[str, Any]:
    return {"action": "diff", "targets": keys} | ({"context": 3} if full else {})


def _apply(full: bool, key: str) -> dict[str, Any]:
    return {"agent": key, "paths": []} if full else {"agent": key}


#: The verbs whose calls ``shape="both"`` starts minimal (the rest start full): the plan makes
#: one review and one apply, and each shape should reach a real parent once.
_MINIMAL_FIRST = frozenset({"review"})

#: The arguments of each call the plan makes, full or minimal (today's shapes).
CALLS: dict[str, Callable[..., dict[str, Any]]] = {
    "spawn": _spawn,
    "wait": _wait,
    "stop": _stop,
    "review": _review,
    "apply": _apply,
}


def fleet_tool(names: list[str], verb: str) -> str | None:
    """The offered tool that is fleet's *verb*, by name."""
    wanted = VERBS[verb]
    pattern = re.compile(rf"(?:.*(?:fleet|subagent)[_/.-]+)?{re.escape(wanted)}")
    found = [name for name in names if pattern.fullmatch(name)]
    return found[0] if found else None


def payload(text: str) -> Any:
    """A tool result's JSON, whatever the CLI wrapped around it (Codex's ``Output:``)."""
    if "Output:\n" in text and text.startswith("Wall time"):
        text = text.split("Output:\n", 1)[1]
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]
    except ValueError:
        return None


@attrs.define(eq=False)
class ParentModel:
    """The played parent (see the module docstring); its record is what the test asserts."""

    scouts: list[dict[str, Any]]  # two spawn requests: task, agent, name, model
    worker: dict[str, Any]  # one: task, agent, name, model
    shape: Literal["full", "minimal", "both"]
    answer: str = "done: the bug is fixed and its test passes"
    results: list[tuple[str, Any]] = attrs.field(factory=list)  # (verb, parsed result)
    calls: list[tuple[str, dict[str, Any]]] = attrs.field(factory=list)
    answered: bool = False
    _step: str = "spawn_scouts"
    _scout_keys: list[str] = attrs.field(factory=list)
    _worker_key: str = ""
    _settled: set[str] = attrs.field(factory=set)
    _pending: list[str] = attrs.field(factory=list)  # the verbs whose results come next
    _seen: int = 0  # tool results already read
    _schemas: dict[str, Any] = attrs.field(factory=dict)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: Calls made so far, by verb (``"both"`` alternates on it).
    _made: dict[str, int] = attrs.field(factory=dict)

    def __call__(self, request: Request) -> Mapping[str, Any]:
        with self._lock:
            names = request.tool_names()
            if fleet_tool(names, "spawn") is None:
                # Claude Code offers WaitForMcpServers while a server is still connecting.
                if WAIT_FOR_SERVERS in names and self._step == "spawn_scouts":
                    return {"tool_calls": [{"name": WAIT_FOR_SERVERS, "arguments": {}}]}
                return {"text": "fleet parent"}
            results = request.tool_results()
            fresh = results[self._seen :] if len(results) > self._seen else []
            if fresh and self._pending:
                for verb, raw in zip(self._pending, fresh[-len(self._pending) :], strict=False):
                    self._read(verb, payload(raw), raw)
            self._seen = len(results)
            self._schemas = request.tool_schemas()
            return self._next(names)

    def _read(self, verb: str, data: Any, raw: str) -> None:
        self.results.append((verb, data if data is not None else raw))
        if not isinstance(data, dict):
            return
        if verb == "spawn":
            keys = [a["key"] for a in data.get("agents", [])]
            if self._step == "wait_scouts":
                self._scout_keys += keys
            else:
                self._worker_key = keys[0] if keys else ""
        if verb == "wait":
            self._settled |= {s["key"] for s in data.get("settled", [])}

    def _full(self, verb: str) -> bool:
        """Whether the next call of *verb* is full (and counted)."""
        n = self._made.get(verb, 0)
        self._made[verb] = n + 1
        return self.shape == "full" or (self.shape == "both" and n % 2 == (verb in _MINIMAL_FIRST))

    def _args(self, verb: str, *args: Any, **kwargs: Any) -> tuple[str, dict[str, Any], bool]:
        full = self._full(verb)
        return verb, CALLS[verb](full, *args, **kwargs), full

    def _call(self, names: list[str], *calls: tuple[str, dict[str, Any], bool]) -> dict[str, Any]:
        """One turn of one or more calls (*calls*: verb, arguments, full)."""
        made = []
        for verb, wanted, full in calls:
            name = fleet_tool(names, verb)
            if name is None:
                raise AssertionError(f"parent model: no fleet tool for {verb} in {names}")
            # The full call fills what the offered schema has: a field this parent's tool does
            # not declare is left out, never sent to be refused.
            declared = (self._schemas.get(name) or {}).get("properties")
            arguments = wanted
            if full and isinstance(declared, dict):
                arguments = {k: v for k, v in wanted.items() if k in declared}
            self.calls.append((name, arguments))
            made.append({"name": name, "arguments": arguments})
        self._pending = [verb for verb, _, _ in calls]
        return {"tool_calls": made}

    def _next(self, names: list[str]) -> dict[str, Any]:
        step = self._step
        if step == "spawn_scouts":
            self._step = "wait_scouts"
            return self._call(names, *(self._args("spawn", s) for s in self.scouts))
        if step == "wait_scouts":
            if len(self._scout_keys) != len(self.scouts):
                raise AssertionError(f"parent model: the scouts' spawn failed: {self.results}")
            if not set(self._scout_keys) <= self._settled:
                return self._call(names, self._args("wait", self._scout_keys))
            self._step = "wait_worker"
            return self._call(names, self._args("spawn", self.worker))
        if step == "wait_worker":
            if not self._worker_key:
                raise AssertionError(f"parent model: the worker's spawn failed: {self.results}")
            if self._worker_key not in self._settled:
                return self._call(names, self._args("wait", [self._worker_key]))
            self._step = "review"
            return self._call(names, self._args("stop", [self._worker_key], hold=True))
        if step == "review":
            self._step = "apply"
            return self._call(names, self._args("review", [self._worker_key]))
        if step == "apply":
            self._step = "stop_scouts"
            return self._call(names, self._args("apply", self._worker_key))
        if step == "stop_scouts":
            self._step = "answer"
            return self._call(names, self._args("stop", self._scout_keys))
        self._pending = []
        self.answered = True
        return {"text": self.answer}

    def result(self, verb: str) -> list[Any]:
        """Every parsed result of *verb*'s calls, in order."""
        return [data for name, data in self.results if name == verb]
