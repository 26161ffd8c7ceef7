"""The ray launcher on a real three-node ``ray.cluster_utils.Cluster`` (one machine)."""

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import ray  # the [ray] extra is part of [test]: absent, this fails (never skips)
import trio
from ray.cluster_utils import Cluster

from orchestrator.launch import _context
from orchestrator.launch._launcher import LaunchSpec, Shipment
from orchestrator.launch._ray import RayLauncher
from orchestrator.workspace._bundle import ship_workspace

if TYPE_CHECKING:
    from orchestrator.launch._ray_launched import LaunchedRay

pytestmark = pytest.mark.slow

SLOTS = (1, 1, 2)  # each simulated node's agent_slot count: 4 lanes in all


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    for slots in SLOTS:
        c.add_node(num_cpus=1, resources={"agent_slot": slots})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(params=[False, True], ids=["actor-per-child", "node-host"])
def hosted(request) -> bool:
    """Each test runs with an actor per child and with one host per node (``node_host``)."""
    return bool(request.param)


def launcher_for(*, hosted: bool, **kwargs) -> RayLauncher:
    return RayLauncher(node_host=hosted, **kwargs)


def spec(tmp_path, code: str, key: str = "c1") -> LaunchSpec:
    return LaunchSpec(
        key=key,
        name="scout",
        argv=(sys.executable, "-c", code),
        cwd=str(tmp_path),
        env={"PATH": os.environ.get("PATH", "")},
    )


def sink_into(out: list[bytes]):
    return lambda _stream, chunk: out.append(chunk)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def gone(pid: int, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while alive(pid):  # noqa: ASYNC110 - no event for another process's exit
            await trio.sleep(0.1)


async def test_children_spread_over_nodes_and_report(cluster, tmp_path, hosted):
    launcher = launcher_for(hosted=hosted)
    out: list[bytes] = []
    async with trio.open_nursery() as nursery:
        runs = [
            await launcher.launch(
                spec(tmp_path, "import time; print('hi'); time.sleep(3)", f"c{i}"),
                sink_into(out),
                nursery,
            )
            for i in range(4)
        ]
        codes = [await r.wait() for r in runs]
    assert codes == [0, 0, 0, 0]
    # 4 children on 4 slots over 3 nodes: every node got at least one.
    assert len({r.node for r in runs}) == 3
    assert out.count(b"hi\n") == 4


@pytest.fixture
def workspace(tmp_path) -> tuple[Path, bytes]:
    """A committed workspace of 1 MB of incompressible data, and that data."""
    repo = tmp_path / "repo"
    repo.mkdir()
    data = os.urandom(1024 * 1024)
    (repo / "data.bin").write_bytes(data)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "w"]):
        subprocess.run([*git, *args], check=True)
    return repo, data


async def test_a_batch_of_readers_puts_its_workspace_in_the_object_store_once(
    cluster, tmp_path, hosted, workspace, monkeypatch
):
    """Four readers of a 1 MB workspace, on all three nodes: the bundle goes into Ray's object
    store once (each launch carries its reference), and each reader's read-only checkout holds
    the workspace as it is. A second batch of the unchanged workspace (a new bundle of the
    same tree) puts nothing more."""
    repo, data = workspace
    puts: list[int] = []
    put = ray.put

    def counted(value, **kwargs):
        puts.append(len(value))
        return put(value, **kwargs)

    monkeypatch.setattr(ray, "put", counted)
    sizes: list[int] = []
    code = (
        "import hashlib, os, sys; p = os.path.join(sys.argv[1], 'data.bin'); "
        "print(hashlib.sha256(open(p, 'rb').read()).hexdigest(), oct(os.stat(p).st_mode & 0o777)); "
        "import time; time.sleep(3)"  # each holds its slot: the four are on all three nodes
    )
    launcher = launcher_for(hosted=hosted)
    for batch in ("a", "b"):
        shipped = await trio.to_thread.run_sync(ship_workspace, repo)
        sizes.append(len(shipped.bundle))
        out: list[bytes] = []
        async with trio.open_nursery() as nursery:
            runs = []
            for i in range(4):
                work_tree = str(tmp_path / f"{batch}{i}")
                ship = Shipment(
                    bundle=shipped.bundle, work_tree=work_tree, read_only=True, tree=shipped.tree
                )
                child = attrs.evolve(
                    spec(tmp_path, code, f"{batch}{i}"),
                    argv=(sys.executable, "-c", code, work_tree),
                    ship=ship,
                )
                runs.append(await launcher.launch(child, sink_into(out), nursery))
            assert [await r.wait() for r in runs] == [0] * 4
        assert len({r.node for r in runs}) == 3
        want = f"{hashlib.sha256(data).hexdigest()} 0o400\n".encode()
        assert b"".join(out) == want * 4
        assert puts == sizes[:1]  # the first batch's, once
        await trio.sleep(1.1)  # the next batch's snapshot commit: another bundle


async def test_lane_queues_and_never_fails(cluster, tmp_path, hosted):
    launcher = launcher_for(hosted=hosted)
    marks = tmp_path / "marks"
    marks.mkdir()
    code = (
        "import time, os, sys; open(os.path.join(sys.argv[1], str(time.time())), 'w').close();"
        " time.sleep(4)"
    )
    async with trio.open_nursery() as nursery:
        t0 = time.monotonic()

        async def one(i: int, done: list[int]) -> None:
            s = spec(tmp_path, code, f"q{i}")
            s = LaunchSpec(key=s.key, name=s.name, argv=(*s.argv, str(marks)), cwd=s.cwd, env=s.env)
            r = await launcher.launch(s, lambda *_: None, nursery)
            done.append(await r.wait())

        done: list[int] = []
        for i in range(6):  # 6 children on 4 lanes: two must wait for a slot
            nursery.start_soon(one, i, done)
    wall = time.monotonic() - t0
    assert done == [0] * 6
    starts = sorted(float(p.name) for p in marks.iterdir())
    # The queued two started only once a first wave child ended (≥ ~4 s later).
    assert starts[-1] - starts[0] > 3.0
    assert wall > 7.0


async def test_stop_kills_the_whole_group_through_the_actor(cluster, tmp_path, hosted):
    launcher = launcher_for(hosted=hosted)
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time;"
        f" p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        f" open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(600)"
    )
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(spec(tmp_path, code), lambda *_: None, nursery)
        with trio.fail_after(60):
            while not pidfile.exists() or not pidfile.read_text():  # noqa: ASYNC110
                await trio.sleep(0.1)
        grandchild = int(pidfile.read_text())
        assert alive(r.pid)
        assert alive(grandchild)
        await r.terminate(grace=2.0)
        assert r.exited.is_set()
    assert r.returncode == -15
    await gone(grandchild)
    await gone(r.pid)


async def test_killed_actor_takes_its_child_with_it_and_its_node_directory_goes(
    cluster, tmp_path, hosted
):
    launcher = launcher_for(hosted=hosted, session="t")
    node = Path(await launcher.open_node("c1"))
    # What the child leaves there: a directory it made unwritable, with a file in it.
    code = (
        "import os, sys, time; d = sys.argv[1] + '/scratch/kept'; os.makedirs(d); "
        "open(d + '/f', 'w').write('x'); os.chmod(d, 0o500); print('ready', flush=True); "
        "time.sleep(600)"
    )
    child = attrs.evolve(spec(tmp_path, code), argv=(sys.executable, "-c", code, str(node)))
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(child, lambda *_: None, nursery)
        assert r.node_dir == str(node)
        assert alive(r.pid)
        with trio.fail_after(30):
            while not await trio.Path(node / "scratch" / "kept" / "f").exists():  # noqa: ASYNC110
                await trio.sleep(0.05)
        # Behind the launcher's back (as an OOM kill would): PR_SET_PDEATHSIG reaps the child,
        # and with the actor gone a task on its node removes the node directory.
        ray.kill(r.actor.host if hosted else r.actor, no_restart=True)
        with trio.fail_after(60):
            await r.wait()
    assert r.returncode is not None
    assert r.returncode < 0
    await gone(r.pid)
    assert not await trio.Path(node).exists()


async def test_a_dead_node_fails_its_child_once_and_leaves_no_process(cluster, tmp_path, hosted):
    doomed = cluster.add_node(num_cpus=1, resources={"agent_slot": 1, "doomed": 1})
    cluster.wait_for_nodes()
    launcher = launcher_for(hosted=hosted, resources={"doomed": 1})
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(
            spec(tmp_path, "import time; time.sleep(600)"), lambda *_: None, nursery
        )
        assert r.node == doomed.node_id
        assert alive(r.pid)
        # The node's raylet dies mid-turn (no graceful drain): its workers go, and with them
        # the child (PR_SET_PDEATHSIG on the actor's worker).
        await trio.to_thread.run_sync(lambda: cluster.remove_node(doomed, allow_graceful=False))
        with trio.fail_after(90):
            code = await r.wait()
    assert code < 0
    await gone(r.pid, within=30)
    # The surviving nodes' lanes are unaffected: a new child still runs.
    async with trio.open_nursery() as nursery:
        again = await launcher_for(hosted=hosted).launch(
            spec(tmp_path, "pass", "c2"), lambda *_: None, nursery
        )
        assert await again.wait() == 0
    assert again.node != doomed.node_id


async def test_a_node_host_killed_mid_turn_fails_only_its_children_and_is_replaced(
    cluster, tmp_path
):
    launcher = launcher_for(hosted=True)
    sleeper = "import time; print('up', flush=True); time.sleep(600)"
    async with trio.open_nursery() as nursery:
        runs = [
            await launcher.launch(spec(tmp_path, sleeper, f"h{i}"), lambda *_: None, nursery)
            for i in range(4)
        ]
        by_node: dict[str, list[LaunchedRay]] = {}
        for r in runs:
            by_node.setdefault(r.node, []).append(r)
        # One host per node: the children of a node share its worker process.
        assert len(by_node) == 3
        for on_node in by_node.values():
            assert len({r.actor_pid for r in on_node}) == 1
        doomed = next(rs for rs in by_node.values() if len(rs) == 2)
        others = [r for r in runs if r not in doomed]
        ray.kill(doomed[0].actor.host, no_restart=True)
        with trio.fail_after(90):
            codes = [await r.wait() for r in doomed]
        assert all(code < 0 for code in codes)
        for r in doomed:
            await gone(r.pid, within=30)
        # The other nodes' children never noticed.
        assert all(alive(r.pid) and not r.exited.is_set() for r in others)
        # The freed slots are taken by the next spawns, on that node under a new host.
        for r in doomed:
            await r.terminate(1.0)
        again = [
            await launcher.launch(spec(tmp_path, "pass", f"n{i}"), lambda *_: None, nursery)
            for i in range(2)
        ]
        assert {r.node for r in again} == {doomed[0].node}
        assert {r.actor_pid for r in again} != {doomed[0].actor_pid}
        assert [await r.wait() for r in again] == [0, 0]
        for r in others:
            await r.terminate(1.0)
    assert all(r.returncode == -15 for r in others)


async def test_a_hostile_childs_context_comes_back_through_ray_without_links_or_excess(
    cluster, tmp_path, hosted
):
    """What a revive keeps of a remote child (``LaunchedRay.context``) and ships to a new node
    (``RayLauncher.restore``), through real actors and node hosts."""
    secret = tmp_path / "secret"
    secret.write_text("not the child's\n")
    launcher = launcher_for(hosted=hosted, session="t")
    node = Path(await launcher.open_node("c1"))
    # The child plants a link to a secret where its transcript goes, and a session file of
    # twice the cap (sparse: it costs no disk).
    code = (
        "import os, sys; s = sys.argv[1] + '/scratch'; "
        "os.symlink(sys.argv[2], s + '/transcript.json'); "
        "p = s + '/claude/home/.claude/projects/-w'; os.makedirs(p); "
        "f = open(p + '/u-1.jsonl', 'wb'); f.truncate(2 * int(sys.argv[3])); f.close(); "
        "print('ready', flush=True); import time; time.sleep(600)"
    )
    argv = (sys.executable, "-c", code, str(node), str(secret), str(_context.CAP))
    child = attrs.evolve(spec(tmp_path, code), argv=argv)
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(child, lambda *_: None, nursery)
        with trio.fail_after(30):
            while not await trio.Path(node / "scratch/claude/home/.claude/projects/-w").exists():  # noqa: ASYNC110
                await trio.sleep(0.05)
        await trio.sleep(0.5)  # its truncate, after the mkdir
        assert await r.context("builtin", "") == {}
        assert await r.context("claude", "u-1") == _context.over(_context.CAP)
        os.unlink(node / "scratch" / "transcript.json")
        (node / "scratch" / "transcript.json").write_bytes(b'[{"role": "user"}]')
        assert await r.context("builtin", "") == {"transcript.json": b'[{"role": "user"}]'}
        await r.terminate(1.0)
    # A revive's new node directory gets the kept copy in its scratch, before its child starts.
    again = Path(await launcher.open_node("c2"))
    await launcher.restore("c2", {"transcript.json": b"[]", "pi-session.jsonl": b"{}"})
    assert (again / "scratch" / "transcript.json").read_bytes() == b"[]"
    with pytest.raises(ray.exceptions.RayTaskError, match="not a context file"):
        await launcher.restore("c2", {"../loadout.json": b"planted"})
    assert not (again / "loadout.json").exists()
    await launcher.close_node("c2")
    assert not await trio.Path(again).exists()


async def test_a_hosts_childrens_contexts_come_in_one_call_a_batch(cluster, tmp_path, monkeypatch):
    """Context fetches of a host's children asked at once share one ``contexts`` call (a
    fleet's turns end together); each child gets its own files, and a child that has ended
    (its state gone from its host) fails its fetch alone."""
    from orchestrator.launch import _ray_contexts, _ray_refs  # noqa: PLC0415
    from orchestrator.remote._ca import SessionCA  # noqa: PLC0415

    ca = SessionCA("t")
    calls: list[int] = []  # the fetches each call carried
    real = _ray_refs.resolved

    async def counted(ref, **kwargs):
        got = await real(ref, **kwargs)
        calls.append(len(got))
        return got

    monkeypatch.setattr(_ray_contexts, "resolved", counted)
    code = (
        "import os, sys, time; s = os.environ['NODE'] + '/scratch'; "
        "open(s + '/transcript.json', 'w').write(sys.argv[1]); "
        "print('ready', flush=True); time.sleep(60)"
    )
    async with trio.open_nursery() as session:
        launcher = launcher_for(
            hosted=True,
            session="t",
            spread=False,
            certify=lambda owner, csr: (ca.sign(csr, owner), ca.certificate_pem),
            placed=lambda _link, _key: None,
            vouch=lambda _link, _seconds: None,
            nursery=session,
        )
        launched = []
        async with trio.open_nursery() as nursery:
            for i in range(4):  # packed: the node of two lanes holds two of them
                node = await launcher.open_node(f"x{i}")
                child = attrs.evolve(
                    spec(tmp_path, code, f"x{i}"),
                    argv=(sys.executable, "-c", code, f"transcript {i}"),
                    env={"NODE": node},
                )
                launched.append(await launcher.launch(child, lambda *_: None, nursery))
            with trio.fail_after(30):
                for r in launched:
                    while not await trio.Path(r.node_dir, "scratch/transcript.json").exists():  # noqa: ASYNC110
                        await trio.sleep(0.05)
            hosts = len({r.node for r in launched})
            assert hosts < len(launched)  # two share a host
            got: dict[int, object] = {}

            async def fetch(i: int) -> None:
                got[i] = await launched[i].context("builtin", "")

            async with trio.open_nursery() as fetches:
                for i in range(4):
                    fetches.start_soon(fetch, i)
            assert got == {i: {"transcript.json": f"transcript {i}".encode()} for i in range(4)}
            assert max(calls) == 2  # the two children of one host, in one call
            assert len(calls) == hosts
            await launched[0].terminate(1.0)  # its state goes with it
            with pytest.raises(RuntimeError, match="gone from its node host"):
                await launched[0].context("builtin", "")
            assert await launched[1].context("builtin", "") == {"transcript.json": b"transcript 1"}
            for r in launched[1:]:
                await r.terminate(1.0)
        session.cancel_scope.cancel()


async def test_a_step_that_waited_for_the_launch_fails_it_and_leaves_nothing(
    cluster, tmp_path, hosted
):
    """A loadout write waits for the launch's first round trip: one the node refuses (a path
    outside the node directory) fails that launch, the node directory goes, and the node (its
    host, with node hosts) still serves the next child."""
    from orchestrator.launch import _ray_host  # noqa: PLC0415 - the hosts known here

    launcher = launcher_for(hosted=hosted, session="t")
    node = Path(await launcher.open_node("w1"))
    await launcher.write_files("w1", {str(tmp_path / "loadout.json"): b"{}"})  # not yet sent
    assert not (tmp_path / "loadout.json").exists()
    hosts = dict(_ray_host._hosts)
    async with trio.open_nursery() as nursery:
        with pytest.raises(ray.exceptions.RayTaskError, match="is not in"):
            await launcher.launch(spec(tmp_path, "print('never')", "w1"), lambda *_: None, nursery)
    assert not (tmp_path / "loadout.json").exists()
    await gone_path(node)
    # A step of the child's own that fails is no sign of a dead host: none is replaced.
    bad = launcher_for(hosted=hosted, session="no/such")
    with pytest.raises(ray.exceptions.RayTaskError, match="not a session or child id"):
        await bad.open_node("w2")
    assert _ray_host._hosts == hosts
    # The loadout of the next child is written with its launch, which runs it.
    again = Path(await launcher.open_node("w3"))
    await launcher.write_files("w3", {str(again / "loadout.json"): b"{}"})
    code = "import os, sys; print(os.path.exists(sys.argv[1]))"
    child = attrs.evolve(
        spec(tmp_path, code, "w3"), argv=(sys.executable, "-c", code, str(again / "loadout.json"))
    )
    out: list[bytes] = []
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(child, sink_into(out), nursery)
        assert await r.wait() == 0
        await r.terminate(1.0)
    assert b"True\n" in out
    assert _ray_host._hosts == hosts
    await gone_path(again)  # its end removes it (the test left it in /dev/shm before)


async def gone_path(path: Path, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while await trio.Path(path).exists():  # noqa: ASYNC110 - removed by the node's actor
            await trio.sleep(0.05)


async def test_a_key_opened_again_gets_a_state_of_its_own(cluster, tmp_path):
    """A revived child reuses its key, while its last life's state may still be in the host
    (its release is sent without waiting, or not yet sent: a child that ended by itself keeps
    its state until its handle goes). The new life opens beside it on the same host, and the
    old one's release touches only the old state."""
    from orchestrator.launch import _ray_host  # noqa: PLC0415 - the hosts known here

    launcher = launcher_for(hosted=True, session="t")
    out: list[bytes] = []
    async with trio.open_nursery() as nursery:
        first = await launcher.launch(
            spec(tmp_path, "print('first life')", "k1"), sink_into(out), nursery
        )
        assert await first.wait() == 0  # ended by itself: its state is still in the host
        hosts = dict(_ray_host._hosts)
        node = Path(await launcher.open_node("k1"))
        await trio.to_thread.run_sync(first.actor.release)  # the old life's release, now
        await trio.sleep(1.0)  # long after it has reached the host
        assert await trio.Path(node).exists()
        assert _ray_host._hosts == hosts  # the same hosts: none was taken for dead
        again = await launcher.launch(
            spec(tmp_path, "print('second life')", "k1"), sink_into(out), nursery
        )
        assert await again.wait() == 0
    assert out.count(b"first life\n") == 1
    assert out.count(b"second life\n") == 1


async def test_a_tls_child_on_a_host_opens_starts_and_ends_in_a_round_trip_each(
    cluster, tmp_path, monkeypatch
):
    """A hosted TLS child's key and CSR are made in the round trip that opens its node
    directory, its loadout, CA-signed leaf and start go in the next, and its end (stop,
    clean-up, release) is one more: the supervisor's Ray calls are what a remote child costs
    beyond a local one. The key stays on the node; the leaf names the child."""
    from cryptography import x509  # noqa: PLC0415

    from orchestrator.launch import _ray, _ray_host  # noqa: PLC0415
    from orchestrator.remote._ca import SessionCA, owner_of  # noqa: PLC0415

    trips: list[str] = []
    for name in ("_open_in", "_steps"):
        real = getattr(_ray, name)

        async def counted(*args, _real=real, _name=name):
            trips.append(_name)
            return await _real(*args)

        monkeypatch.setattr(_ray, name, counted)
    finish = _ray_host.HostedChild.finish

    def finished(self, calls=()):
        trips.append("finish")
        return finish(self, calls)

    monkeypatch.setattr(_ray_host.HostedChild, "finish", finished)
    ca = SessionCA("t")
    launcher = launcher_for(
        hosted=True,
        session="t",
        certify=lambda owner, csr: (ca.sign(csr, owner), ca.certificate_pem),
    )
    node = Path(await launcher.open_node("t1", tls="scratch/tls"))
    assert trips == ["_open_in"]
    tls = node / "scratch" / "tls"
    assert sorted(os.listdir(tls)) == ["key.pem"]  # made on the node, with the directory
    await launcher.write_files("t1", {str(node / "loadout.json"): b"{}"})
    code = "import os, sys, time; print(sorted(os.listdir(sys.argv[1])), flush=1); time.sleep(60)"
    child = attrs.evolve(
        spec(tmp_path, code, "t1"), argv=(sys.executable, "-c", code, str(tls)), tls=str(tls)
    )
    out: list[bytes] = []
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(child, sink_into(out), nursery)
        assert trips == ["_open_in", "_steps"]
        leaf = x509.load_pem_x509_certificate((tls / "cert.pem").read_bytes())
        assert owner_of(leaf, "t") == "t1"
        assert (node / "loadout.json").read_bytes() == b"{}"
        await trio.sleep(1.0)  # it has listed its TLS directory (its output comes at its end)
        await r.terminate(1.0)
        assert trips == ["_open_in", "_steps", "finish"]
        assert r.returncode == -15  # stopped by its host, in that one round trip
    assert b"['ca.pem', 'cert.pem', 'key.pem']" in b"".join(out)
    await gone_path(node)
    host, ident = r.actor.host, r.actor.ident
    with pytest.raises(ray.exceptions.RayTaskError, match="gone from its node host"):
        await trio.to_thread.run_sync(lambda: ray.get(host.call.remote(ident, "clean_up", ())))


async def test_a_carried_child_on_a_host_launches_in_one_round_trip(cluster, tmp_path, monkeypatch):
    """A child whose channel its host's link carries costs no call to open: its node directory
    is named by the supervisor in its host's root and made by its launch's one call, with its
    loadout and start. The link is certified once per host (the door is told of it first), and
    a path the host was not given a root for is refused there."""
    from orchestrator.launch import _ray, _ray_host, _ray_refs  # noqa: PLC0415
    from orchestrator.remote._ca import SessionCA  # noqa: PLC0415

    trips: list[str] = []  # every Ray call the launcher awaits
    real = _ray_refs.called

    async def counted(submit, *args):
        trips.append(getattr(getattr(submit, "func", submit), "__name__", "?"))
        return await real(submit, *args)

    monkeypatch.setattr(_ray, "called", counted)
    ca = SessionCA("t")
    vouched: list[tuple[str, float]] = []
    async with trio.open_nursery() as session:
        launcher = launcher_for(
            hosted=True,
            session="t",
            certify=lambda owner, csr: (ca.sign(csr, owner), ca.certificate_pem),
            placed=lambda _link, _key: None,
            vouch=lambda link, seconds: vouched.append((link, seconds)),
            nursery=session,
        )
        node = Path(await launcher.open_node("t1", tls="scratch/tls"))
        # Its host's link certified (a CSR, the leaf, where it makes node directories);
        # nothing asked of the host for the child itself.
        assert trips == ["remote"] * 3
        assert not await trio.Path(node).exists()
        [(link, seconds)] = vouched  # its host's link, certified before its first child
        assert link.startswith("host.")
        assert 2500 < seconds <= 45 * 60
        await launcher.write_files("t1", {str(node / "loadout.json"): b"{}"})
        code = "import time; print('up', flush=True); time.sleep(60)"
        out: list[bytes] = []
        async with trio.open_nursery() as nursery:
            r = await launcher.launch(spec(tmp_path, code, "t1"), sink_into(out), nursery)
            assert len(trips) == 4  # its node directory, loadout and start in one call
            assert await trio.Path(node / "loadout.json").read_bytes() == b"{}"
            listed = sorted(p.name for p in await trio.Path(node).iterdir())
            assert listed == ["checkout", "loadout.json", "scratch"]
            await r.terminate(1.0)
        await gone_path(node)
        session.cancel_scope.cancel()  # its link's renewal
    host, ident = r.actor.host, "t2#0"
    elsewhere = ("make_node", ("t", "t2", f"/fleet-node-t-t2-{'0' * 32}"))
    with pytest.raises(ray.exceptions.RayTaskError, match="none of this node's roots"):
        await trio.to_thread.run_sync(lambda: ray.get(host.open.remote(ident, [elsewhere])))
    assert isinstance(r.actor, _ray_host.HostedChild)


def test_a_child_watched_to_be_released_is_gone_with_its_group_when_its_end_is_handed_over(
    cluster,
):
    """A child that ships nothing back ends without a call of its own: the poll that hands its
    end over has released it first (its node directory removed, what it left running in its
    process group killed, its state gone, a late finish a no-op); a child watched without
    *release* keeps its state for the supervisor's finish."""
    from orchestrator.launch._ray_host import NodeHost  # noqa: PLC0415

    host = NodeHost()  # in this process: the driver's node
    code = "import subprocess; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True)"
    argv = [sys.executable, "-c", code]
    ends = {}
    for key, release in (("r#1", True), ("k#1", False)):
        [directory, started] = host.open(
            key, [("make_node", ("t", key[0])), ("start", (argv, "/", {}, {}, None))]
        )
        assert started["pid"] > 0
        host.call(key, "watch", (release,))
        ends[key] = directory
    got: dict[str, tuple[int, bytes]] = {}
    deadline = time.monotonic() + 30
    while len(got) < 2:
        assert time.monotonic() < deadline, got
        got |= host.exits(1.0)
    left = {key: int(tail.split()[0]) for key, (_status, tail) in got.items()}
    assert not os.path.exists(ends["r#1"])  # released: gone before its end was handed over
    assert _gone(left["r#1"])  # its group's straggler with it
    assert os.path.exists(ends["k#1"])  # kept for its finish
    assert not _gone(left["k#1"])
    assert host.count() == 1
    assert host.finish("r#1", [("stop", (1.0,))]) == []  # released already: nothing to do
    host.finish("k#1")
    assert host.count() == 0
    assert not os.path.exists(ends["k#1"])
    assert _gone(left["k#1"])


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1][0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False
