"""What the backend tests share: a recording Host and a loadout for the scripted model server."""

from pathlib import Path

import ipc


class Host:
    """The runtime's side of the Host protocol, recording what the backend did."""

    def __init__(self, answers=()):
        self.events: list[ipc.Event] = []
        self.questions: list[str] = []
        self._answers = list(answers)

    def emit(self, event):
        self.events.append(event)

    async def ask_parent(self, question):
        self.questions.append(question)
        return self._answers.pop(0) if self._answers else "no answer"

    async def spawn(self, agent, task, name=""):
        return f"spawned {agent}: {task}"

    async def ownership(self, paths):
        return None

    async def discuss(self, op, **fields):
        return f"discuss {op}: {fields.get('text', '')}"

    async def check_tool(self, start):
        self.events.append(start)

    def activities(self, kind):
        return [e for e in self.events if e.activity == kind]


def make_loadout(tmp_path: Path, **fields) -> ipc.Loadout:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    notes = workspace / "notes.txt"
    if not notes.exists():  # inside a sandbox the workspace is read-only: made before it
        notes.write_text("the secret is 4217\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    values = {
        "session": "t",
        "owner": "a1",
        "name": "scout-1",
        "agent": "scout",
        "token": "x" * 64,
        "socket": str(tmp_path / "ipc.sock"),
        "tools": ["read", "grep", "find", "ls", "ask_parent"],
        "system_prompt": "You are a scout.",
        "workspace": str(workspace),
        "scratch": str(scratch),
    }
    return ipc.Loadout(**(values | fields))
