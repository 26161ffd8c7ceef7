from pathlib import Path

import pytest
import trio

import ipc  # noqa: TC001 - the events list holds ipc.Event at runtime
from child.backends.builtin._model import ModelError, SteerInbox, StepContext
from child.backends.builtin._scripted import ScriptedModel, load_script


def _ctx(messages=None, *, task="the task", side=False, turn=1, steers=None, events=None):
    sink = events if events is not None else []
    return StepContext(
        messages=messages or [],
        tools=[],
        turn=turn,
        side=side,
        task=task,
        steers=steers or SteerInbox(),
        emit=sink.append,
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n", "top level must be a mapping"),
        ("turns: {}\n", "turns must be a list"),
        ("turns:\n  - {}\n", "turns[0] must be a mapping with steps"),
        ("turns:\n  - steps: [{reply: x}, {jump: 1}]\n", "turns[0].steps[1]: unknown key 'jump'"),
        ("turns:\n  - steps: [{branch: {steered: 3}}]\n", "turns[0].steps[0].branch.steered"),
        ("bogus: 1\n", "unknown key 'bogus'"),
        ("turns: [\n", "invalid YAML"),
    ],
)
def test_a_malformed_script_is_refused_naming_the_place(tmp_path, text, message):
    with pytest.raises(ModelError, match=None) as info:
        load_script(_write(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value).strip() or "invalid YAML" in message


async def test_turns_advance_across_prompts_and_templates_render(tmp_path):
    model = ScriptedModel.from_file(
        _write(
            tmp_path,
            "turns:\n"
            "  - steps:\n"
            "      - {tool: read, args: {path: '{{task}}'}}\n"
            "      - {reply: 'saw {{tool:read}} in {{turn}}'}\n"
            "  - steps: [{reply: 'second {{task}}'}]\n",
        )
    )
    ctx = _ctx(task="README.md")
    step = await model.step(ctx)
    assert [(c.name, c.args) for c in step.tool_calls] == [("read", {"path": "README.md"})]
    ctx.messages.extend(
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": step.tool_calls[0].id, "function": {"name": "read"}}],
            },
            {"role": "tool", "tool_call_id": step.tool_calls[0].id, "content": "hello"},
        ]
    )
    assert (await model.step(ctx)).text == "saw hello in 1"
    assert (await model.step(_ctx(task="go", turn=2))).text == "second go"
    exhausted = await model.step(_ctx(turn=3))
    assert "no more turns" in exhausted.text


async def test_wait_until_steer_ends_early_and_branch_takes_the_steered_arm(
    tmp_path, autojump_clock
):
    model = ScriptedModel.from_file(
        _write(
            tmp_path,
            "turns:\n  - steps:\n"
            "      - {wait: 30, until: steer}\n"
            "      - branch: {steered: [{reply: 'to {{steer}}'}], default: [{reply: 'no'}]}\n",
        )
    )
    steers = SteerInbox()

    async def steer_later() -> None:
        await trio.sleep(4)
        steers.put("the east")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(steer_later)
        step = await model.step(_ctx(steers=steers))
    assert step.text == "to the east"
    assert trio.current_time() == 4


async def test_without_a_steer_the_default_arm_runs_after_the_full_wait(tmp_path, autojump_clock):
    model = ScriptedModel.from_file(
        _write(
            tmp_path,
            "turns:\n  - steps:\n      - {wait: 7, until: steer}\n"
            "      - branch: {steered: [{reply: 'yes'}], default: [{reply: 'no'}]}\n",
        )
    )
    assert (await model.step(_ctx())).text == "no"
    assert trio.current_time() == 7


async def test_a_steer_that_joined_just_before_the_step_ends_the_wait_at_once(
    tmp_path, autojump_clock
):
    # The steer came while the previous step's tools ran; the loop drained it into the
    # conversation before this step. Waiting for another would wait the whole 30 s.
    model = ScriptedModel.from_file(
        _write(
            tmp_path,
            "turns:\n  - steps:\n      - {wait: 30, until: steer}\n      - reply: 'to {{steer}}'\n",
        )
    )
    steers = SteerInbox()
    steers.put("the east")
    assert steers.drain() == ["the east"]
    step = await model.step(_ctx(steers=steers))
    assert step.text == "to the east"
    assert trio.current_time() == 0
    steers.drain()  # the next step: nothing new joined
    assert steers.fresh == []


async def test_side_questions_use_the_side_script_in_order(tmp_path):
    model = ScriptedModel.from_file(
        _write(tmp_path, "side:\n  - steps: [{reply: first}]\n  - steps: [{reply: second}]\n")
    )
    assert (await model.step(_ctx(side=True, turn=1))).text == "first"
    assert (await model.step(_ctx(side=True, turn=2))).text == "second"
    assert "No scripted answer" in (await model.step(_ctx(side=True, turn=3))).text


async def test_events_and_say_emit_activity(tmp_path):
    model = ScriptedModel.from_file(
        _write(tmp_path, "turns:\n  - steps: [{say: hi}, {events: 3}, {reply: done}]\n")
    )
    events: list[ipc.Event] = []
    assert (await model.step(_ctx(events=events))).text == "done"
    assert [e.text for e in events] == ["hi", "event 1", "event 2", "event 3"]


async def test_nonce_is_taken_from_the_ballot_format_line_of_the_prompt(tmp_path):
    model = ScriptedModel.from_file(
        _write(
            tmp_path,
            "turns:\n  - steps: [{reply: 'BALLOT {{nonce}} A because'}]\n"
            "  - steps: [{reply: '[{{nonce}}]'}]\n",
        )
    )
    task = (
        "Mentions BALLOT 0000 in prose first.\n## Your ballot\n"
        "BALLOT 9f2c0a41b7d3e856 <option-id> <rationale>\n\n- <option-id> is one of: A, B\n"
    )
    assert (await model.step(_ctx(task=task))).text == "BALLOT 9f2c0a41b7d3e856 A because"
    # A prompt that is not a voter's has no nonce: the template renders empty, never a guess.
    assert (await model.step(_ctx(task="BALLOT abc A why", turn=2))).text == "[]"
