"""seq/peerlink.py: the member-to-member hot path over rpc.transport, against real members."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from seq import RRSeq
from seq._proto import rrpeer_pb2 as peer_pb
from seq.localcluster import LocalCluster, free_ports
from seq.peerlink import (
    NOT_READY,
    OK,
    OP_ACQUIRE,
    OP_CAS,
    OP_READ,
    WRONG_CLUSTER,
    PeerLink,
    PeerUnavailable,
)
from seq.server import ServerConfig
from seq.wire import CHANNEL_OPTIONS


def cluster_id(c: LocalCluster, i: int) -> str:
    peers = tuple(a for j, a in enumerate(c.addrs) if j != i)
    return ServerConfig(listen=c.addrs[i], data_dir="-", peers=peers).cluster


async def call_until_answered(link: PeerLink, req: list[object], timeout: float = 30.0) -> list[object]:
    """The link re-discovers a restarted member (new port): retry through its backoff."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await link.call(req, 1.0)
        except PeerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_read_cas_acquire_and_rediscovery_after_restart(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    cid = cluster_id(c, 1)
    async with grpc.aio.insecure_channel(c.addrs[1], options=CHANNEL_OPTIONS) as ch:
        link = PeerLink(c.addrs[1], ch, cid)
        try:
            status, lo, hi = await link.call([OP_ACQUIRE, cid, "pl", 5, 2.0], 3.0)
            assert (status, hi - lo) == (OK, 5) and lo >= 1
            assert await link.call([OP_READ, cid, "pl"], 1.0) == [OK, hi]
            # compare-and-set below the stored value is refused and says where it is
            assert await link.call([OP_CAS, cid, "pl", hi - 1, hi + 10], 1.0) == [OK, False, hi]
            assert await link.call([OP_CAS, cid, "pl", hi, hi + 10], 1.0) == [OK, True, hi + 10]
            assert (await link.call([OP_READ, "another-cluster", "pl"], 1.0))[0] == WRONG_CLUSTER
            for bad in ([OP_READ, cid, 7], [OP_CAS, cid, "pl", -1, 3], ["zz", cid, "pl"], [OP_CAS, cid, "pl", 1, 1 << 63]):
                with pytest.raises(PeerUnavailable):
                    await link.call(bad, 1.0)
            assert link.connects == 1  # one connection, multiplexed (bad requests did not close it)
            c.kill(1)
            c.start(1, "--peer-port", str(free_ports(1)[0]))  # listens for peers on another port
            await c.wait_ready(1)
            assert await call_until_answered(link, [OP_READ, cid, "pl"]) == [OK, hi + 10]  # durable
            assert link.connects >= 2
        finally:
            await link.aclose()


@pytest.mark.parametrize(
    "down",
    [
        (2,),  # learns the configuration from member 1, then waits for member 2 to catch up
        (1, 2),  # nobody to learn the configuration (and the cluster id) from
    ],
    ids=["configuration-known", "configuration-unknown"],
)
async def test_a_catching_up_member_does_not_vote(fresh_cluster: LocalCluster, down: tuple[int, ...]) -> None:
    c = fresh_cluster
    async with RRSeq("cu", 10, c.addrs) as s:
        for _ in range(30):
            await s.next()
    c.kill(0)
    c.wipe(0)
    for i in down:
        c.kill(i)
    c.start(0, "--rejoin")  # stays catching up: answers NOT_READY, never WRONG_CLUSTER
    deadline = time.monotonic() + 30
    while await c.state(0) != peer_pb.CATCHING_UP:
        assert time.monotonic() < deadline, c.output(0)
        await asyncio.sleep(0.05)
    cid = cluster_id(c, 0)
    async with grpc.aio.insecure_channel(c.addrs[0], options=CHANNEL_OPTIONS) as ch:
        link = PeerLink(c.addrs[0], ch, cid)
        try:
            assert (await call_until_answered(link, [OP_READ, cid, "cu"]))[0] == NOT_READY
            assert (await link.call([OP_CAS, cid, "cu", 1 << 40, (1 << 40) + 1], 1.0))[0] == NOT_READY
        finally:
            await link.aclose()


async def test_explicit_peer_port(tmp_path_factory: pytest.TempPathFactory) -> None:
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seqport")))
    ports = free_ports(3)
    try:
        for i in range(3):
            c.start(i, "--bootstrap", "--peer-port", str(ports[i]))
        await c.wait_ready(timeout=60)
        assert f"peer port {ports[0]}" in c.output(0)
        async with RRSeq("pp", 0, c.addrs) as s:
            got = [await s.next() for _ in range(5)]
        assert got == [1, 2, 3, 4, 5]
    finally:
        c.close()
