"""A node host's link through the door, over real TCP, real TLS 1.3 and the real multiplexer:
the door takes a child's stream only from the link the supervisor placed that child on, and
then only that child's hello with its own token; a link that breaks the multiplexing rules is
cut, with every stream on it, and counted."""

from __future__ import annotations

import contextlib
import struct
from typing import TYPE_CHECKING

import trio

import ipc
from child._tls import client_context
from orchestrator.remote._ca import SessionCA
from orchestrator.remote._door import TlsDoor
from tests.orchestrator.remote.test_door import HELLO, SESSION, WAIT_S, Fleet, node, said

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

LINK = "host." + "ab" * 8
OTHER_LINK = "host." + "cd" * 8


async def over_link(
    tmp_path: Path,
    act: Callable[[str, ipc.MuxLink], Awaitable[None]],
    *,
    placed: dict[str, str],
    owner: str = LINK,
    fleet: Fleet | None = None,
) -> Fleet:
    """Open a door with children *placed* (child → link), dial it with a certificate for
    *owner* and run *act* (the door's address, the link) with the link served."""
    ca = SessionCA(SESSION)
    fleet = fleet or Fleet(pending={"a1": "t" * 43, "a2": "u" * 43})
    door = TlsDoor(
        ca=ca,
        token_for=fleet.token_for,
        attach=fleet.attach,
        refuse=fleet.refuse,
        carries=lambda link, key: placed.get(key) == link,
        hello_timeout=5,
    )
    directory = node(tmp_path, ca, owner)
    context = client_context(directory / "key.pem", directory / "cert.pem", directory / "ca.pem")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            stream = await ipc.connect_tls(address, context, timeout=10)
            link = ipc.MuxLink(stream, opener=True)
            async with trio.open_nursery() as inner:
                await inner.start(link.run)
                await act(address, link)
                await link.aclose()
            door.release("a1")
    return fleet


async def hello_over(link: ipc.MuxLink, name: str, owner: str, token: str) -> str:
    """Child *owner*'s hello on a stream named *name*: ``"ok"`` or the one-line refusal."""
    opening = ipc.hello_on(
        link.open(name), owner=owner, token=token, hello=HELLO, request_timeout=WAIT_S
    )
    return await said(owner, opening)


async def test_children_placed_on_a_link_attach_over_it(tmp_path: Path) -> None:
    results: list[str] = []

    async def act(_address: str, link: ipc.MuxLink) -> None:
        async with trio.open_nursery() as nursery:
            for owner, token in (("a1", "t" * 43), ("a2", "u" * 43)):
                nursery.start_soon(_append, results, hello_over(link, owner, owner, token))

    fleet = await over_link(tmp_path, act, placed={"a1": LINK, "a2": LINK})
    assert sorted(results) == ["ok", "ok"]
    assert sorted(fleet.attached) == [f"a1 via {LINK}", f"a2 via {LINK}"]
    assert fleet.refused == []


async def _append(results: list[str], outcome: Awaitable[str]) -> None:
    results.append(await outcome)


async def test_a_child_placed_on_another_link_is_refused_before_its_hello(tmp_path: Path) -> None:
    results: list[str] = []

    async def act(_address: str, link: ipc.MuxLink) -> None:
        results.append(await hello_over(link, "a2", "a2", "u" * 43))  # right token, wrong link
        results.append(await hello_over(link, "nobody", "nobody", "t" * 43))  # placed nowhere

    fleet = await over_link(tmp_path, act, placed={"a1": LINK, "a2": OTHER_LINK})
    assert results == ["refused: eof", "refused: eof"]
    assert fleet.attached == []
    assert fleet.refused == [("link", "a2"), ("link", "nobody")]


async def test_a_stream_cannot_carry_another_childs_hello(tmp_path: Path) -> None:
    # Both are placed on this link, but the stream is a1's: a2's hello (with a2's own
    # token) is never looked up there.
    results: list[str] = []

    async def act(_address: str, link: ipc.MuxLink) -> None:
        results.append(await hello_over(link, "a1", "a2", "u" * 43))
        results.append(await hello_over(link, "a1", "a1", "x" * 43))  # a wrong token

    fleet = await over_link(tmp_path, act, placed={"a1": LINK, "a2": LINK})
    assert results == ["refused: eof", "refused: eof"]
    assert fleet.attached == []
    assert fleet.refused == [("token", "a1"), ("token", "a1")]


async def test_a_childs_certificate_opens_no_link(tmp_path: Path) -> None:
    # A child's own certificate is a child's connection: mux frames there are no hello.
    results: list[str] = []

    async def act(_address: str, link: ipc.MuxLink) -> None:
        results.append(await hello_over(link, "a1", "a1", "t" * 43))

    fleet = await over_link(tmp_path, act, placed={"a1": "a1"}, owner="a1")
    assert results[0].startswith("refused")
    assert fleet.attached == []
    assert fleet.refused  # counted, whatever the frame decoder called it


async def test_a_link_that_breaks_the_rules_is_cut_and_counted(tmp_path: Path) -> None:
    ca = SessionCA(SESSION)
    fleet = Fleet(pending={"a1": "t" * 43})
    door = TlsDoor(
        ca=ca,
        token_for=fleet.token_for,
        attach=fleet.attach,
        refuse=fleet.refuse,
        carries=lambda _link, _key: True,
        hello_timeout=5,
    )
    directory = node(tmp_path, ca, LINK)
    context = client_context(directory / "key.pem", directory / "cert.pem", directory / "ca.pem")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            stream = await ipc.connect_tls(address, context, timeout=10)
            # DATA on a stream that was never opened.
            await stream.send_all(struct.pack(">IBI", 7, 2, 3) + b"abc")
            with contextlib.suppress(trio.BrokenResourceError):
                while await stream.receive_some(1024):  # until the door cuts the connection
                    pass
            while not fleet.refused:  # noqa: ASYNC110 - counted as the door's task ends, after the cut
                await trio.sleep(0.01)
            await stream.aclose()
            door.release("a1")
    assert fleet.attached == []
    assert [reason for reason, _ in fleet.refused] == ["link"]


class Failing(Fleet):
    """A fleet whose run of a2 breaks as its channel is handed over."""

    async def attach(
        self, channel: ipc.Channel, hello: ipc.Envelope, seconds: float, link: str = ""
    ) -> None:
        if channel.owner == "a2":
            raise RuntimeError("the run broke")
        await super().attach(channel, hello, seconds, link)


async def test_one_childs_failure_never_ends_its_siblings_link(tmp_path: Path) -> None:
    results: list[str] = []

    async def act(_address: str, link: ipc.MuxLink) -> None:
        results.append(await hello_over(link, "a2", "a2", "u" * 43))
        results.append(await hello_over(link, "a1", "a1", "t" * 43))  # the same link, after

    fleet = Failing(pending={"a1": "t" * 43, "a2": "u" * 43})
    await over_link(tmp_path, act, placed={"a1": LINK, "a2": LINK}, fleet=fleet)
    assert results == ["refused: eof", "ok"]
    assert fleet.attached == [f"a1 via {LINK}"]
    assert fleet.refused == [("channel", "a2")]
