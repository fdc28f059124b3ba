"""A real 3-member cluster: the original's invariants and the failure cases it never automated."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time

import grpc
import pytest

from seq import RRSeq, SeqUnavailable
from seq._proto import rrpeer_pb2 as peer_pb
from seq._proto import rrseq_pb2 as pb
from seq.localcluster import LocalCluster, free_port
from seq.wire import ApiStub

from collections.abc import Awaitable, Callable


async def draw(s: RRSeq, n: int) -> list[int]:
    return [await s.next() for _ in range(n)]


def strictly_increasing(xs: list[int]) -> bool:
    return all(a < b for a, b in zip(xs, xs[1:]))


@pytest.mark.parametrize("buf", [0, 1, 7, 1000])
async def test_ids_start_at_one_without_gaps_for_one_client(cluster: LocalCluster, buf: int) -> None:
    async with RRSeq(f"nogap-{buf}", buf, cluster.addrs) as s:
        got = await draw(s, 300)
    assert got == list(range(1, 301))


async def test_any_grpc_client_speaks_rrapi(cluster: LocalCluster) -> None:
    async with grpc.aio.insecure_channel(cluster.addrs[1]) as ch:
        stub = ApiStub(ch)
        assert (await stub.CurID(pb.CurIDRequest(name="raw"), timeout=5)).cur_id == 1
        r = await stub.NextID(pb.NextIDRequest(name="raw", range_size=0), timeout=5)  # < 1 counts as 1
        assert (r.from_id, r.to_id) == (1, 2)
        r = await stub.NextID(pb.NextIDRequest(name="raw", range_size=10), timeout=5)
        assert (r.from_id, r.to_id) == (2, 12)
        # (this member may be the one of three that the quorum did not wait for)
        assert (await stub.CurID(pb.CurIDRequest(name="raw"), timeout=5)).cur_id in (1, 12)
        assert (await stub.SetID(pb.SetIDRequest(name="raw", new_id=5), timeout=5)).success is False
        assert (await stub.SetID(pb.SetIDRequest(name="raw", new_id=500), timeout=5)).success is True
        assert (await stub.CurID(pb.CurIDRequest(name="raw"), timeout=5)).cur_id == 500
        # SetID moves one member only: the other two may still form quorums below it
        # (which one coordinates decides), never below what was handed out...
        r = await stub.NextID(pb.NextIDRequest(name="raw", range_size=1), timeout=5)
        assert r.from_id in (12, 500) and r.to_id == r.from_id + 1
        assert (await stub.CurID(pb.CurIDRequest(name="raw"), timeout=5)).cur_id >= 500
    # ... and once a majority was moved, every write quorum contains one of them.
    for i in (1, 2):
        async with grpc.aio.insecure_channel(cluster.addrs[i]) as ch:
            assert (await ApiStub(ch).SetID(pb.SetIDRequest(name="raw", new_id=700), timeout=5)).success
    async with RRSeq("raw", 0, cluster.addrs) as s:
        assert await s.next() >= 700
    async with grpc.aio.insecure_channel(cluster.addrs[1]) as ch:
        stub = ApiStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.NextID(pb.NextIDRequest(name="x" * 300, range_size=1), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def concurrent_mixed(addrs: list[str], name: str, clients: int, per_client: int) -> list[list[int]]:
    rng = random.Random(7)
    sizes = [rng.choice([0, 1, 2, 3, 10, 100, 1000]) for _ in range(clients)]
    seqs = [RRSeq(name, b, addrs) for b in sizes]
    try:
        return await asyncio.gather(*(draw(s, per_client) for s in seqs))
    finally:
        await asyncio.gather(*(s.aclose() for s in seqs))


def check_unique(streams: list[list[int]]) -> None:
    for st in streams:
        assert strictly_increasing(st)
    every = [i for st in streams for i in st]
    assert len(set(every)) == len(every), "an ID was handed out twice"
    assert min(every) >= 1


async def test_many_concurrent_clients_mixed_sizes(cluster: LocalCluster) -> None:
    check_unique(await concurrent_mixed(cluster.addrs, "mixed", clients=24, per_client=150))


async def test_mixed_sizes_with_competing_coordinators(make_cluster: Callable[..., Awaitable[LocalCluster]]) -> None:
    """Every member coordinates (no forwarding): the compare-and-set races are real."""
    c = await make_cluster("--no-forward")
    check_unique(await concurrent_mixed(c.addrs, "race", clients=24, per_client=120))
    for i in range(3):
        assert c.stop(i) == 0
    conflicts = sum(int(c.output(i).split("conflicts=")[1].split()[0]) for i in range(3))
    assert conflicts > 0  # the races did happen, and were resolved


async def test_restart_after_crash_never_goes_backwards(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    async with RRSeq("crash", 0, c.addrs) as s:
        before = await draw(s, 50)
    for i in range(3):
        c.kill(i)
    for i in range(3):
        c.start(i)
    await c.wait_ready()
    async with RRSeq("crash", 5, c.addrs) as s:
        after = await draw(s, 20)
    assert after[0] > before[-1]
    assert strictly_increasing(after)


async def test_no_quorum_is_a_clear_error_within_the_deadline(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    c.kill(1)
    c.kill(2)
    async with RRSeq("nq", 0, c.addrs, timeout=1.5) as s:
        t0 = time.monotonic()
        with pytest.raises(SeqUnavailable, match="no quorum|UNAVAILABLE"):
            await s.next()
        assert time.monotonic() - t0 < 1.5 + 3.0  # bounded by the deadline (slack for a loaded machine)
    c.start(1)
    await c.wait_ready(0, 1)
    async with RRSeq("nq", 0, c.addrs, timeout=10) as s:
        assert await s.next() >= 1  # one member down: a quorum again


async def test_rejoin_after_data_loss_waits_for_all_members(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    async with RRSeq("lost", 100, c.addrs) as s:
        before = await draw(s, 250)
    c.kill(0)
    c.wipe(0)
    # Without --rejoin an empty data dir is refused.
    p = c.start(0)
    assert p.wait(timeout=60) == 2
    assert "--rejoin" in c.output(0)
    # With --rejoin but one other member down, it must not vote yet.
    c.kill(2)
    c.start(0, "--rejoin")
    deadline = time.monotonic() + 30
    while "not voting yet" not in c.output(0):
        assert time.monotonic() < deadline, c.output(0)
        await asyncio.sleep(0.1)
    assert await c.state(0) == peer_pb.CATCHING_UP
    c.start(2)
    await c.wait_ready()
    c.kill(1)  # member 0 and 2 now form the quorums: 0 must have caught up
    async with RRSeq("lost", 0, c.addrs, timeout=10) as s:
        after = await draw(s, 10)
    assert after[0] > before[-1]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "seq", *args], capture_output=True, text=True,
                          timeout=timeout)


async def test_unsafe_starts_are_refused(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    c.stop(0)
    # --bootstrap on an initialized data dir
    p = c.start(0, "--bootstrap")
    assert p.wait(timeout=60) == 2
    assert "brand-new" in c.output(0)
    # (another --peers than the configuration the dir holds is not refused: the persisted
    # configuration wins, see test_seq_membership.py)
    # a second process on a data dir in use
    c.start(0)
    await c.wait_ready(0)
    cmd = c.command(0)
    cmd[cmd.index("--listen") + 1] = f"127.0.0.1:{free_port()}"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "in use" in out.stderr


def test_cli_client_prints_ids(cluster: LocalCluster) -> None:
    out = run_cli("client", "cli", "--servers", ",".join(cluster.addrs), "--buf", "3", "--count", "7")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(i) for i in range(1, 8)]


def test_cli_help() -> None:
    out = run_cli("--help")
    assert out.returncode == 0 and "server" in out.stdout and "bench" in out.stdout
    out = run_cli("server", "--help")
    assert "--bootstrap" in out.stdout and "--rejoin" in out.stdout


async def test_wiped_member_and_stale_member_never_reissue(fresh_cluster: LocalCluster) -> None:
    """The case rrseq.md warns about: an empty member plus one that missed the last writes
    form a quorum. The wiped member must have caught up from all others before voting."""
    c = fresh_cluster
    async with RRSeq("stale", 0, c.addrs, timeout=10) as s:
        ids = await draw(s, 50)
        c.kill(2)  # member 2 misses what follows
        ids += await draw(s, 50)
    c.kill(0)
    c.wipe(0)
    c.start(2)
    c.start(0, "--rejoin")
    await c.wait_ready(0, 2)
    c.kill(1)  # the only member that has every write is gone: quorums are {0, 2}
    async with RRSeq("stale", 0, c.addrs, timeout=10) as s:
        after = await draw(s, 20)
    assert after[0] > ids[-1]
    assert strictly_increasing(after)


async def test_metrics_endpoint(tmp_path_factory: pytest.TempPathFactory) -> None:
    import urllib.request


    c = LocalCluster(1, root=str(tmp_path_factory.mktemp("metrics")))
    port = free_port()
    try:
        c.start(0, "--bootstrap", "--metrics-port", str(port))
        await c.wait_ready()
        async with RRSeq("m", 0, c.addrs) as s:
            await draw(s, 3)
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        )
    finally:
        c.close()
    assert 'seq_rounds_total{result="won"} 3.0' in body
    assert "seq_ready 1.0" in body
    assert 'seq_name_ids_served_total{name="m"} 3.0' in body  # per name too (see test_seq_http.py)


async def test_end_of_the_id_space_is_a_clear_error(cluster: LocalCluster) -> None:
    from seq import SeqExhausted

    top = (1 << 63) - 5
    for a in cluster.addrs:
        async with grpc.aio.insecure_channel(a) as ch:
            assert (await ApiStub(ch).SetID(pb.SetIDRequest(name="full", new_id=top), timeout=5)).success
    async with RRSeq("full", 3, cluster.addrs) as s:
        assert [await s.next() for _ in range(3)] == [top, top + 1, top + 2]
        with pytest.raises(SeqExhausted):
            for _ in range(3):
                await s.next()


async def test_client_skips_an_unreachable_server_with_backoff(cluster: LocalCluster) -> None:

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    async with RRSeq("skip", 0, [dead, *cluster.addrs], timeout=10) as s:
        got = await draw(s, 30)
        bad = s._servers[0]
        assert bad.failures >= 1  # tried once, round robin ...
        assert bad.failures < 5  # ... then skipped while its backoff runs, not hammered
    assert got == list(range(1, 31))
