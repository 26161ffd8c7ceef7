import trio
import trio.testing

from ipc._handoff import Pending, Worker

CEILING = 10


async def test_a_slot_filled_before_anyone_waits_keeps_its_result():
    pending = Pending(type="steer")
    pending.finish("answer")
    pending.finish("late")  # a slot is filled once
    assert (pending.done, pending.result, pending.error) == (True, "answer", None)


async def test_finishing_wakes_the_parked_requester_once():
    pending = Pending(type="steer")
    woke = []

    async def requester() -> None:
        await pending.wait()
        woke.append(pending.result)

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(requester)
            await trio.testing.wait_all_tasks_blocked()
            pending.finish("first")
            pending.finish("second")  # a slot is filled once
    assert woke == ["first"]


async def test_an_error_is_kept_for_the_requester():
    pending = Pending(type="steer")
    failure = RuntimeError("closed")

    async def requester() -> None:
        await pending.wait()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(requester)
            await trio.testing.wait_all_tasks_blocked()
            pending.finish(error=failure)
    assert pending.error is failure
    assert pending.result is None


async def test_a_cancelled_wait_leaves_the_slot_open_and_a_late_finish_is_harmless():
    pending = Pending(type="question")
    with trio.fail_after(CEILING), trio.move_on_after(0.01) as scope:
        await pending.wait()
    assert scope.cancelled_caught
    assert not pending.done
    pending.finish("late")  # the requester is gone: nothing to reschedule
    assert pending.result == "late"


async def test_an_idle_worker_takes_a_job_and_a_busy_one_declines():
    release = trio.Event()
    ran = []

    async def job(name: str) -> None:
        ran.append(name)
        await release.wait()

    worker: Worker[str] = Worker(run_job=job)
    assert not worker.offer("before start")
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await trio.testing.wait_all_tasks_blocked()
            assert worker.offer("first")
            assert not worker.offer("second")  # taken, not started yet: busy
            await trio.testing.wait_all_tasks_blocked()
            assert ran == ["first"]
            assert not worker.offer("third")  # still running the first
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert worker.offer("fourth")
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert ran == ["first", "fourth"]
