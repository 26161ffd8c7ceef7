"""The supervisor's side of the fork server (``orchestrator.launch._forkserver``): what its
start does to the descriptors of the rest of the process."""

import os
import socket
import sys

import trio

import ipc
from orchestrator.launch._forkserver import ForkServer


def _next_pair_end() -> int:
    """The number the next socket pair's second end will get (the lowest free ones)."""
    probe = socket.socketpair()
    number = probe[1].fileno()
    for end in probe:
        end.close()
    return number


async def test_starting_a_server_leaves_every_other_descriptor_of_the_process_open(tmp_path):
    # Another thread's descriptor (a node host's trio wakeup socket, a child's pipe) sitting
    # at 10 above the server's new socket end: the start used to dup2 onto it and close it.
    held: list[int] = []
    base = 10 + _next_pair_end()
    read_end, write_end = os.pipe()
    for target in range(base, base + 4):  # the probe and the start may differ by one or two
        if target not in (read_end, write_end):
            os.dup2(read_end, target, inheritable=False)
            held.append(target)
    os.close(read_end)
    os.close(write_end)
    before = {fd: os.fstat(fd).st_ino for fd in held}
    async with trio.open_nursery() as nursery:
        server = ForkServer(python=sys.executable, label="t", env=dict(os.environ), nursery=nursery)
        server.start()
        try:
            with trio.fail_after(30):
                assert await server.ready(), server.failure
            assert {fd: os.fstat(fd).st_ino for fd in held} == before
        finally:
            await server.aclose()
    for fd in held:
        os.close(fd)


async def test_many_spawns_at_once_each_get_their_fork_even_when_the_socket_is_full():
    # 64 requests of 16 KiB each at once are more than the socket's buffer holds: the ones that
    # found it full used to fail ("another task is already writing"), not wait their turn.
    env = {**os.environ, "FLEET_BENCH_PAD": "x" * 16384}
    null = os.open(os.devnull, os.O_WRONLY)
    pidfds: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            server = ForkServer(python=sys.executable, label="t", env=dict(env), nursery=nursery)
            server.start()
            try:
                with trio.fail_after(60):
                    assert await server.ready(), server.failure

                    async def one() -> None:
                        loadout = ipc.sealed_loadout(b"{}")  # a child that reads it and quits
                        try:
                            _pid, pidfd = await server.spawn(
                                cwd="/",
                                env=env,
                                name="t",
                                stdio=(null, null),
                                inherit=(loadout,),
                                dial=True,
                            )
                        finally:
                            os.close(loadout)
                        pidfds.append(pidfd)

                    async with trio.open_nursery() as spawns:
                        for _ in range(64):
                            spawns.start_soon(one)
                assert len(pidfds) == 64
            finally:
                await server.aclose()
    finally:
        os.close(null)
        for fd in pidfds:
            os.close(fd)
