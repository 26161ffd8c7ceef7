"""The todo checklist: operations, derived parent status, progress, and the tool over it."""

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from child.tools import Checklist, Progress, Task, TodoError, ToolContext, build_tools

PLAN = [
    {"text": "Explore", "children": [{"text": "Read code"}, {"text": "Find tests"}]},
    {"text": "Implement"},
    {"id": "docs", "text": "Document"},
]


def statuses(checklist):
    def flat(tasks):
        for task in tasks:
            yield task.id, task.status
            yield from flat(task.children)

    return dict(flat(checklist.tasks()))


def planned():
    checklist = Checklist()
    checklist.write(PLAN)
    return checklist


def test_write_assigns_hierarchical_ids_and_keeps_explicit_ones():
    checklist = planned()
    assert statuses(checklist) == {
        "1": "pending",
        "1.1": "pending",
        "1.2": "pending",
        "2": "pending",
        "docs": "pending",
    }
    assert checklist.render() == (
        "Todo (0/4 done):\n"
        "[ ] 1 Explore\n"
        "  [ ] 1.1 Read code\n"
        "  [ ] 1.2 Find tests\n"
        "[ ] 2 Implement\n"
        "[ ] docs Document"
    )


def test_automatic_ids_never_take_an_explicit_id_given_later():
    checklist = Checklist()
    checklist.write([{"text": "a"}, {"text": "b", "children": [{"id": "1", "text": "c"}]}])
    assert [task.id for task in checklist.tasks()] == ["2", "3"]


def test_write_replaces_the_whole_plan():
    checklist = planned()
    checklist.done("1")
    checklist.write([{"text": "New request"}])
    assert statuses(checklist) == {"1": "pending"}
    checklist.write([])
    assert checklist.tasks() == ()
    assert checklist.render() == "Todo: empty."


def test_start_parks_the_previous_leaf_and_a_parent_starts_its_first_open_leaf():
    checklist = planned()
    assert checklist.start("2") == Task(id="2", text="Implement", status="in_progress")
    started = checklist.start("1")
    assert started.id == "1.1"
    assert statuses(checklist)["2"] == "pending"
    checklist.done("1.1")
    assert checklist.start("1").id == "1.2"
    assert statuses(checklist)["1"] == "in_progress"


def test_parent_status_is_derived_from_children():
    checklist = planned()
    assert statuses(checklist)["1"] == "pending"
    checklist.done("1.1")
    assert statuses(checklist)["1"] == "in_progress"
    checklist.done("1.2")
    assert statuses(checklist)["1"] == "done"


def test_done_on_a_parent_finishes_all_its_leaves():
    checklist = planned()
    checklist.start("1.2")
    assert checklist.done("1").status == "done"
    assert statuses(checklist)["1.2"] == "done"
    assert checklist.progress().current is None


def test_update_preserves_omitted_fields_and_subtasks():
    checklist = planned()
    checklist.update("1", text="Explore the repo")
    task = checklist.tasks()[0]
    assert task.text == "Explore the repo"
    assert [child.id for child in task.children] == ["1.1", "1.2"]
    checklist.start("2")
    checklist.update("docs", status="in_progress")
    assert statuses(checklist)["2"] == "pending"
    assert statuses(checklist)["docs"] == "in_progress"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.update("1", status="done"), "derived from its subtasks"),
        (lambda c: c.update("2"), "nothing to change"),
        (lambda c: c.update("2", status="blocked"), "unknown status 'blocked'"),
        (lambda c: c.start("zz"), r"no task with id 'zz' \(ids: 1, 1.1, 1.2, 2, docs\)"),
        (
            lambda c: c.write([{"text": "a", "status": "in_progress"}] * 2),
            "2 tasks are in_progress",
        ),
        (lambda c: c.write([{"id": "x", "text": "a"}, {"id": "x", "text": "b"}]), "used twice"),
        (lambda c: c.write([{"text": " "}]), "non-empty text"),
        (lambda c: c.write([{"text": "a", "owner": "me"}]), r"unknown item field\(s\) \['owner'\]"),
        (lambda c: c.write([{"text": "a" * 301}]), "keep it under 300"),
        (lambda c: c.write([{"text": "t"}] * 101), "101 tasks is too many"),
        (
            lambda c: c.write(
                [
                    {
                        "text": "a",
                        "children": [
                            {"text": "b", "children": [{"text": "c", "children": [{"text": "d"}]}]}
                        ],
                    }
                ]
            ),
            "nest 4 deep",
        ),
        (lambda c: c.write([{"id": "has space", "text": "a"}]), "bad task id"),
        (lambda c: c.append([]), "items is empty"),
    ],
)
def test_invalid_operations_raise_and_change_nothing(call, message):
    checklist = planned()
    before = checklist.tasks()
    with pytest.raises(TodoError, match=message):
        call(checklist)
    assert checklist.tasks() == before


def test_start_on_a_finished_parent_is_refused():
    checklist = planned()
    checklist.done("1")
    with pytest.raises(TodoError, match="every subtask of 1 is done"):
        checklist.start("1")


def test_append_adds_to_an_active_list_and_replaces_a_finished_one():
    checklist = planned()
    checklist.start("2")
    checklist.append([{"text": "Steered extra"}])
    assert [task.id for task in checklist.tasks()] == ["1", "2", "docs", "4"]
    assert statuses(checklist)["2"] == "in_progress"
    checklist.append([{"text": "Urgent", "status": "in_progress"}])
    assert statuses(checklist)["2"] == "pending"
    assert statuses(checklist)["5"] == "in_progress"
    checklist.done("1")
    checklist.done("2")
    checklist.done("docs")
    checklist.done("4")
    checklist.done("5")
    checklist.append([{"text": "Next request"}])
    assert statuses(checklist) == {"1": "pending"}


def test_remove_deletes_a_tree_and_a_bare_parent_becomes_a_leaf():
    checklist = planned()
    checklist.remove("1.1")
    checklist.done("1.2")
    checklist.remove("1.2")
    assert checklist.tasks()[0] == Task(id="1", text="Explore", status="done")
    checklist.remove("2")
    assert [task.id for task in checklist.tasks()] == ["1", "docs"]


def test_progress_counts_leaves_and_lists_the_next_three_open_ones():
    checklist = Checklist()
    checklist.write([{"text": f"step {n}"} for n in range(1, 7)])
    checklist.done("1")
    checklist.start("3")
    assert checklist.progress() == Progress(
        done=1, total=6, current="step 3", next=("step 2", "step 4", "step 5")
    )
    assert Checklist().progress() == Progress(done=0, total=0, current=None, next=())


async def test_the_tool_renders_the_plan_and_start_done_return_one_task(tmp_path):
    seen: list[Progress] = []
    ctx = ToolContext(workspace=tmp_path, on_progress=seen.append)
    tool = build_tools(["todo"], ctx)["todo"]
    with trio.fail_after(5):
        written = await tool.run(ctx, {"op": "write", "items": PLAN})
        started = await tool.run(ctx, {"op": "start", "id": "1.1"})
        done = await tool.run(ctx, {"op": "done", "id": "1.1"})
        updated = await tool.run(ctx, {"op": "update", "id": "2", "text": "Build"})
        removed = await tool.run(ctx, {"op": "remove", "id": "docs"})
        refused = await tool.run(ctx, {"op": "start", "id": "nope"})
        unknown = await tool.run(ctx, {"op": "list"})
    assert written.text.startswith("Todo (0/4 done):\n[ ] 1 Explore")
    assert started.text == "[>] 1.1 Read code (0/4 done)"
    assert done.text == "[x] 1.1 Read code (1/4 done)"
    assert "[ ] 2 Build" in updated.text
    assert "docs" not in removed.text
    assert refused.is_error
    assert refused.text.startswith("todo: no task with id 'nope'")
    assert unknown.is_error
    assert unknown.text.startswith("todo: unknown op 'list'")
    assert [p.done for p in seen] == [0, 0, 1, 1, 1]
    assert seen[1].current == "Read code"
    assert seen[-1] == Progress(done=1, total=3, current=None, next=("Find tests", "Build"))


async def test_the_tool_rejects_items_that_are_not_a_list(tmp_path):
    ctx = ToolContext(workspace=tmp_path)
    tool = build_tools(["todo"], ctx)["todo"]
    with trio.fail_after(5):
        result = await tool.run(ctx, {"op": "write", "items": "do things"})
    assert result.is_error
    assert result.text.startswith("todo write: items must be a list")


IDS = st.sampled_from(["1", "2", "3", "1.1", "1.2", "2.1", "a", "b"])
STATUS = st.sampled_from(["pending", "in_progress", "done"])
LEAF = st.fixed_dictionaries({"text": st.just("t")}, optional={"id": IDS, "status": STATUS})
ITEM = st.recursive(
    LEAF,
    lambda children: st.fixed_dictionaries(
        {"text": st.just("t"), "children": st.lists(children, max_size=3)},
        optional={"id": IDS, "status": STATUS},
    ),
    max_leaves=6,
)
ITEMS = st.lists(ITEM, max_size=4)
OPS = st.one_of(
    st.tuples(st.just("write"), ITEMS),
    st.tuples(st.just("append"), ITEMS),
    st.tuples(st.just("start"), IDS),
    st.tuples(st.just("done"), IDS),
    st.tuples(st.just("remove"), IDS),
    st.tuples(st.just("update"), st.tuples(IDS, st.none() | STATUS)),
)


def check_invariants(checklist):
    leaves = []

    def visit(task):
        if not task.children:
            leaves.append(task)
            return task.status
        child_statuses = [visit(child) for child in task.children]
        if all(s == "done" for s in child_statuses):
            expected = "done"
        elif any(s != "pending" for s in child_statuses):
            expected = "in_progress"
        else:
            expected = "pending"
        assert task.status == expected, task
        return task.status

    for root in checklist.tasks():
        visit(root)
    current = [leaf for leaf in leaves if leaf.status == "in_progress"]
    assert len(current) <= 1
    progress = checklist.progress()
    assert progress.total == len(leaves)
    assert progress.done == sum(leaf.status == "done" for leaf in leaves)
    assert progress.current == (current[0].text if current else None)
    assert len(progress.next) == min(3, sum(leaf.status == "pending" for leaf in leaves))
    ids = [leaf.id for leaf in leaves]
    assert len(ids) == len(set(ids))


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=12))
def test_any_sequence_of_operations_keeps_the_invariants(ops):
    checklist = Checklist()
    for op, arg in ops:
        before = checklist.tasks()
        try:
            if op == "update":
                task_id, status = arg
                checklist.update(task_id, text="changed", status=status)
            else:
                getattr(checklist, op)(arg)
        except TodoError:
            assert checklist.tasks() == before
        check_invariants(checklist)
