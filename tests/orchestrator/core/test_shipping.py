"""A reading remote child's workspace shipment, shared by the children launched before it began
(``orchestrator.core._shipping``), on a real Git repository."""

import subprocess
import time

import pytest
import trio

from orchestrator.core._shipping import ReaderShipments


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "a"]):
        subprocess.run([*git, *args], check=True)
    return root


async def test_children_launched_together_share_one_shipment(repo):
    shipments, asked, got = ReaderShipments(), time.monotonic(), []
    async with trio.open_nursery() as nursery:

        async def one() -> None:
            got.append(await shipments.ship(repo, asked, nursery))

        async with trio.open_nursery() as children:
            for _ in range(8):
                children.start_soon(one)
        assert len({id(shipped) for shipped in got}) == 1
        nursery.cancel_scope.cancel()


async def test_a_child_launched_after_a_write_gets_the_write(repo):
    shipments = ReaderShipments()
    async with trio.open_nursery() as nursery:
        first = await shipments.ship(repo, time.monotonic(), nursery)
        (repo / "b.txt").write_text("written after the first shipment\n")
        later = await shipments.ship(repo, time.monotonic(), nursery)
        assert later is not first
        assert later.commit != first.commit  # its tree has b.txt
        nursery.cancel_scope.cancel()


async def test_a_later_batch_of_an_unchanged_workspace_takes_the_last_bundle(repo):
    shipments = ReaderShipments()
    async with trio.open_nursery() as nursery:
        first = await shipments.ship(repo, time.monotonic(), nursery)
        await trio.sleep(1.1)  # a snapshot commit a second later would be another bundle
        again = await shipments.ship(repo, time.monotonic(), nursery)
        assert again is first  # the same tree: not packed again
        (repo / "a.txt").write_text("changed\n")
        changed = await shipments.ship(repo, time.monotonic(), nursery)
        assert changed.tree != first.tree
        assert changed.bundle != first.bundle
        nursery.cancel_scope.cancel()


async def test_a_failed_shipment_is_not_shared_and_each_child_gets_its_error(tmp_path):
    shipments, asked, errors = ReaderShipments(), time.monotonic(), []
    async with trio.open_nursery() as nursery:

        async def one() -> None:
            try:
                await shipments.ship(tmp_path / "nothing", asked, nursery)
            except Exception as exc:
                errors.append(exc)

        async with trio.open_nursery() as children:
            for _ in range(3):
                children.start_soon(one)
        assert len(errors) == 3
        assert shipments._newest == {}
        nursery.cancel_scope.cancel()
