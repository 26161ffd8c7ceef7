import trio

from orchestrator._sync import wait_first


async def test_wait_first_returns_when_any_event_is_set(autojump_clock):
    first, second = trio.Event(), trio.Event()

    async def set_later() -> None:
        await trio.sleep(3)
        second.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(set_later)
        await wait_first(first, second)
    assert trio.current_time() == 3
    assert not first.is_set()


async def test_wait_first_returns_at_once_when_one_is_already_set(autojump_clock):
    done = trio.Event()
    done.set()
    await wait_first(trio.Event(), done)
    assert trio.current_time() == 0
