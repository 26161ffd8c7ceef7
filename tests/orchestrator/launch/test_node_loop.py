"""A node process's one trio thread (``launch/_node_loop.py``): many tasks on one thread, and
a task that fails never ends the loop the others run on."""

import threading

import pytest
import trio

from orchestrator.launch._node_loop import NodeLoop


def until(condition, within: float = 10.0) -> None:
    waited = threading.Event()
    for _ in range(int(within / 0.05)):
        if condition():
            return
        waited.wait(0.05)
    raise AssertionError("the loop did not get there in time")


def threads_named(name: str) -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == name)


def test_many_tasks_share_one_thread_and_a_late_failure_reaches_only_its_own_callback():
    loop = NodeLoop(name="fleet-test-loop")
    ended: dict[str, BaseException | None] = {}
    proceed = threading.Event()
    where: set[str] = set()

    def task(name: str, fail_later: bool):
        async def serve(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            where.add(threading.current_thread().name)
            task_status.started()
            if fail_later:
                await trio.to_thread.run_sync(proceed.wait)
                raise OSError(f"{name} lost its socket")
            await trio.sleep_forever()

        return serve

    def told(name: str):
        def tell(error: BaseException | None) -> None:
            ended[name] = error

        return tell

    scopes = {name: loop.start(task(name, name == "b"), ended=told(name)) for name in "abc"}
    assert where == {"fleet-test-loop"}
    assert threads_named("fleet-test-loop") == 1
    proceed.set()
    until(lambda: "b" in ended)
    assert isinstance(ended["b"], OSError)
    assert sorted(ended) == ["b"]  # the others are still served
    # The loop lives on: a new task starts, and ending one by its scope says so (no error).
    loop.run_sync(scopes["a"].cancel)
    until(lambda: "a" in ended)
    assert ended["a"] is None
    assert loop.run(trio.sleep, 0) is None


def test_a_task_that_fails_before_it_has_started_fails_its_start_only():
    loop = NodeLoop(name="fleet-test-loop-2")
    told: list[BaseException | None] = []

    async def broken(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise PermissionError("socket path refused")

    with pytest.raises(PermissionError, match="socket path refused"):
        loop.start(broken, ended=told.append)
    assert told == []  # it never started: nothing to tell
    assert loop.run_sync(threading.current_thread).name == "fleet-test-loop-2"
