"""juggler on a Redis Cluster under faults: a real cluster (three masters, each
with a replica) with toxiproxy in front of every node, the nodes announcing the
proxies' ports (``cluster-announce-port``) so that the slot map and the
MOVED/ASK redirections lead through them too; the cluster bus stays direct, so
the cluster itself sees no fault but a killed master. A ``juggler server`` and
a ``juggler callee`` process run on it; websocket clients call, in a loop, a URI
whose calls live on the node under fault ("hit") and one on another node
("other"). The server's results list is on a third node.

Promises checked (docs/juggler/faults.md, "On a Redis Cluster"):

- every CALL is answered -- its result, an error RES, or a NACK -- within its
  timeout plus a bound: nothing hangs, and every ACKed call gets exactly one
  RES (its result or the timeout error RES); a NACK other than 504 gets none;
- calls whose keys live on the other nodes go on unaffected;
- calls to the node under fault are back within a bound once the fault ends
  (after a master's failover: once its replica is promoted);
- neither process crashes (both exit 0 at SIGTERM), and the server's
  descriptors come back to their level (plus at most one per node: the slot
  map is read from another node while one cannot be reached).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from juggler.broker.cluster import key_slot
from juggler.broker.redis.keys import call_key, result_key
from juggler.client import Client, connect
from tests.faults.conftest import fd_count
from tests.faults.jugglertraffic import Traffic
from tests.faults.toxiproxy import Link, Toxiproxy
from tests.juggler.jugglerprocs import Proc, juggler
from tests.juggler.rediscluster import Node, RedisCluster
from tests.netutil import free_port, wait_for_port, wait_until

pytestmark = [pytest.mark.timeout(120)]

#: the server's options: how long an operation retries a node (cluster_retry_timeout), and
#: how long a command waits for its reply (command_timeout)
RETRY_TIMEOUT, COMMAND_TIMEOUT = 2.0, 2.0
#: how long a fault lasts (s): longer than RETRY_TIMEOUT, so that some calls fail
FAULT = 4.0
HIT = ("test.echo", "x", "x")


@dataclass
class Faulty:
    """A Redis Cluster whose nodes clients reach through toxiproxy only."""

    cluster: RedisCluster
    links: dict[int, Link]  # by the port the node announces (its proxy's)

    def link(self, port: int) -> Link:
        return self.links[self.cluster.node_at(port).public_port]

    def owner(self, key: str) -> int:
        """The announced port of the master serving ``key``."""
        return self.cluster.slot_owner(key_slot(key))


@pytest.fixture(scope="module")
def faulty(toxiproxy_server: Toxiproxy) -> Iterator[Faulty]:
    links: dict[int, Link] = {}

    def announce(node: Node) -> int:
        link = toxiproxy_server.link(f"cluster-{node.port}", f"127.0.0.1:{node.port}")
        links[link.port] = link
        return link.port

    try:
        cluster = RedisCluster.create(announce=announce)
    except BaseException:
        toxiproxy_server.delete_all()
        raise
    try:
        yield Faulty(cluster, links)
    finally:
        cluster.stop()
        toxiproxy_server.delete_all()


@pytest.fixture
def healthy(faulty: Faulty, toxiproxy_server: Toxiproxy) -> Iterator[Faulty]:
    """The cluster whole, every link enabled and without toxics (before and after the test)."""
    toxiproxy_server.reset()
    faulty.cluster.wait_ok()
    faulty.cluster.flushall()
    yield faulty
    toxiproxy_server.reset()


@dataclass
class Stack:
    server: Proc
    callee: Proc
    url: str
    #: a URI whose calls live on a master other than the faulted one and the results' one
    other: tuple[str, str, Any]
    victim: int  # the announced port of the master serving HIT's calls


@contextlib.asynccontextmanager
async def stack(faulty: Faulty) -> AsyncIterator[Stack]:
    """``juggler callee`` and ``juggler server`` processes on the cluster, through
    its proxies; the server's results list on neither HIT's master nor OTHER's."""
    victim = faulty.owner(call_key(HIT[0]))
    other = next((f"test.delay.{i}", "1", 1) for i in range(4)
                 if faulty.owner(call_key(f"test.delay.{i}")) != victim)
    taken = {victim, faulty.owner(call_key(other[0]))}
    conn_uuid = next(u for u in (str(uuid.uuid4()) for _ in range(100)) if faulty.owner(result_key(u)) not in taken)
    seeds = faulty.cluster.seeds
    callee = Proc(juggler("callee", "--redis-cluster", seeds, "-n", "4", "--workers", "20"))
    port = free_port()
    server = Proc(juggler("server", "--redis-cluster", seeds, "--listen", f"127.0.0.1:{port}",
                          "--set", f"redis.cluster_retry_timeout={RETRY_TIMEOUT}",
                          "--set", f"redis.command_timeout={COMMAND_TIMEOUT}",
                          "--set", f'redis.conn_uuid="{conn_uuid}"'))
    try:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, lambda: wait_for_port(port, timeout=30, proc=server.proc))
        except Exception as exc:
            raise AssertionError(f"juggler server did not start: {exc}\n{server.output()}") from exc
        yield Stack(server, callee, f"ws://127.0.0.1:{port}/ws", other, victim)
        assert server.proc.poll() is None, server.output()
        assert callee.proc.poll() is None, callee.output()
    finally:
        server_log, callee_log = server.output(), callee.output()
        codes = server.stop(), callee.stop()
    assert codes == (0, 0), f"exit codes {codes}\nserver:\n{server_log[-3000:]}\ncallee:\n{callee_log[-3000:]}"


@contextlib.asynccontextmanager
async def traffic(s: Stack, nodes: int) -> AsyncIterator[tuple[Traffic, Client]]:
    """Callers of HIT and of the other URI, each URI on a connection of its own;
    yields them and a spare connection, once calls to both succeed. At the end,
    checks every call, and that the server's descriptors come back to their
    level: plus, at most, one for each of the ``nodes`` (the slot map is read
    from another node while one cannot be reached, and that connection is kept)."""
    t = Traffic()
    async with connect(s.url, on_message=t.on_message) as hit, connect(s.url, on_message=t.on_message) as other, \
            connect(s.url) as spare:
        await t.back(spare, *HIT, bound=30)  # the callee up and popping
        await t.back(spare, *s.other, bound=30)
        pid = s.server.proc.pid
        level, before = fd_count(pid), peers(pid)
        t.start(hit, *HIT)
        t.start(other, *s.other)
        yield t, spare
        await t.stop()
        await wait_until(lambda: fd_count(pid) <= level + nodes, 10,
                         what=lambda: f"the server's descriptors back to {level} + {nodes} (now {fd_count(pid)}; "
                                      f"its TCP peers {before} then {peers(pid)})")


def peers(pid: int) -> list[str]:
    """The remote ends of process ``pid``'s TCP connections (what a failure message shows)."""
    try:
        out = subprocess.run(["ss", "-Htnp"], capture_output=True, text=True, timeout=10, check=False).stdout
    except OSError:  # no iproute2: the message goes without
        return []
    return sorted(line.split()[4] for line in out.splitlines() if f"pid={pid}," in line)


def unaffected(t: Traffic, uri: str) -> None:
    calls = t.of(uri)
    assert calls and all(c.ok for c in calls), [c for c in calls if not c.ok][:3]


async def test_latency_on_one_nodes_link_slows_its_calls_without_errors(healthy: Faulty) -> None:
    async with stack(healthy) as s, traffic(s, len(healthy.cluster.nodes)) as (t, _spare):
        link = healthy.link(s.victim)
        await asyncio.sleep(0.5)  # traffic before the fault: a window of time is the point
        since = t.loop.time()
        link.toxic("latency", "upstream", name="up", latency=100)
        link.toxic("latency", "downstream", name="down", latency=100)
        await asyncio.sleep(FAULT)
        until = t.loop.time()
        link.clear()
        await asyncio.sleep(0.5)
    # (a toxic added or removed lets through at once what it was delaying: the calls of the fault's middle)
    slow = [c for c in t.of(HIT[0], since + 1.0, until - 1.0) if c.ok]
    assert slow, "no call to the slowed node during the fault"
    # the fault had its effect: a call reaches that node (100 ms) before any callee can run it
    assert min(c.res[0][0] - c.sent for c in slow) >= 0.1
    unaffected(t, HIT[0])
    unaffected(t, s.other[0])


async def fault_and_back(t: Traffic, spare: Client, begin: Callable[[], object], end: Callable[[], object]) -> None:
    """Traffic, then ``begin()`` for FAULT seconds, then ``end()``: calls to HIT
    failed meanwhile (the fault was seen), and succeed again within RECOVERY."""
    await asyncio.sleep(0.5)  # traffic before the fault: a window of time is the point
    since = t.loop.time()
    begin()
    await asyncio.sleep(FAULT)
    end()
    await t.back(spare, *HIT)
    assert [c for c in t.of(HIT[0], since, since + FAULT) if not c.ok], "the fault was not seen"
    await asyncio.sleep(0.5)  # traffic after the fault


async def test_resets_on_one_nodes_link_fail_its_calls_explicitly_and_only_them(healthy: Faulty) -> None:
    async with stack(healthy) as s, traffic(s, len(healthy.cluster.nodes)) as (t, spare):
        link = healthy.link(s.victim)
        await fault_and_back(t, spare, lambda: link.toxic("reset_peer", "upstream", timeout=0), link.clear)
    unaffected(t, s.other[0])


async def test_one_node_unreachable_fails_its_calls_explicitly_and_only_them(healthy: Faulty) -> None:
    async with stack(healthy) as s, traffic(s, len(healthy.cluster.nodes)) as (t, spare):
        link = healthy.link(s.victim)
        await fault_and_back(t, spare, link.disable, link.enable)
    unaffected(t, s.other[0])


async def test_calls_resume_once_a_killed_masters_replica_is_promoted(healthy: Faulty) -> None:
    cluster = healthy.cluster
    killed: Node | None = None
    try:
        async with stack(healthy) as s, traffic(s, len(healthy.cluster.nodes)) as (t, spare):
            await asyncio.sleep(0.5)
            killed = cluster.kill(s.victim)
            loop = asyncio.get_running_loop()
            promoted = await loop.run_in_executor(None, cluster.wait_promoted, key_slot(call_key(HIT[0])), s.victim, 30.0)
            assert promoted != s.victim
            await t.back(spare, *HIT)  # within RECOVERY of the promotion
            await asyncio.sleep(0.5)
        unaffected(t, s.other[0])
    finally:
        if killed is not None:  # the module's cluster whole again: the node rejoins as a replica
            cluster.restart(killed)
            cluster.wait_ok(30)


async def test_a_bandwidth_limit_on_one_nodes_link_slows_its_calls_explicitly(healthy: Faulty) -> None:
    async with stack(healthy) as s, traffic(s, len(healthy.cluster.nodes)) as (t, spare):
        link = healthy.link(s.victim)
        await asyncio.sleep(0.5)  # traffic before the fault: a window of time is the point
        since = t.loop.time()
        link.toxic("bandwidth", "upstream", name="up", rate=4)  # KB/s
        link.toxic("bandwidth", "downstream", name="down", rate=4)
        await asyncio.sleep(FAULT)
        until = t.loop.time()
        link.clear()
        await t.back(spare, *HIT)
        await asyncio.sleep(0.5)
    assert [c for c in t.of(HIT[0], since + 1.0, until - 1.0) if c.ok], "no call through the throttled link"
    unaffected(t, s.other[0])
