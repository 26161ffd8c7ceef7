"""Small trio synchronisation helpers shared by the supervisor's parts."""

import trio


async def wait_first(*events: trio.Event) -> None:
    """Return as soon as any of *events* is set (at once if one already is)."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        for event in events:
            nursery.start_soon(wait, event)
