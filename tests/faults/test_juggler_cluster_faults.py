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
from dataclasses import dataclass, field
from typing import Any

import pytest

from juggler.broker.cluster import key_slot
from juggler.broker.redis.keys import call_key, result_key
from juggler.client import ACK, NACK, RES, Client, connect, new_uuid
from juggler.errors import JugglerError
from tests.faults.conftest import fd_count
from tests.faults.toxiproxy import Link, Toxiproxy
from tests.juggler.jugglerprocs import Proc, juggler
from tests.juggler.rediscluster import Node, RedisCluster
from tests.netutil import free_port, wait_for_port, wait_until

pytestmark = [pytest.mark.timeout(120)]

#: a call's timeout in these tests (s); its RES, or its NACK, comes within RES_BOUND more
CALL_TIMEOUT, RES_BOUND = 5.0, 2.5
#: the server's options: how long an operation retries a node (cluster_retry_timeout), and
#: how long a command waits for its reply (command_timeout)
RETRY_TIMEOUT, COMMAND_TIMEOUT = 2.0, 2.0
#: how long a fault lasts (s): longer than RETRY_TIMEOUT, so that some calls fail
FAULT = 4.0
#: the bound on service coming back once a fault ends (s)
RECOVERY = 10.0
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
class Call:
    uri: str
    expected: Any
    sent: float
    ack: float | None = None
    nack: tuple[float, int] | None = None
    res: list[tuple[float, Any]] = field(default_factory=list)

    @property
    def answered_at(self) -> float | None:
        if self.nack is not None:
            return self.nack[0]
        return self.res[0][0] if self.res else None

    @property
    def ok(self) -> bool:
        return self.nack is None and len(self.res) == 1 and self.res[0][1] == self.expected


class Traffic:
    """Callers in a loop, one call at a time each; every CALL, and the ACK,
    NACK and RES that came for it, with their times."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.calls: dict[str, Call] = {}
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def on_message(self, msg: dict[str, Any], _raw: str) -> None:
        payload = msg["payload"]
        call = self.calls.get(payload.get("for", ""))
        if call is None:
            return
        t, kind = self.loop.time(), msg["meta"]["type"]
        if kind == ACK:
            call.ack = t
        elif kind == NACK:
            call.nack = (t, payload.get("code"))
        elif kind == RES:
            call.res.append((t, payload.get("args")))

    def start(self, c: Client, uri: str, arg: str, expected: Any, callers: int = 3) -> None:
        async def caller() -> None:
            while not self.stopping.is_set():
                msg_uuid = new_uuid()
                self.calls[msg_uuid] = Call(uri, expected, self.loop.time())
                try:
                    await c.call(uri, arg, timeout=CALL_TIMEOUT, msg_uuid=msg_uuid)
                except JugglerError:
                    await asyncio.sleep(0.05)  # as a client that retries: no spinning on NACKs

        self.tasks += [asyncio.ensure_future(caller()) for _ in range(callers)]

    def of(self, uri: str, since: float = 0.0, until: float = float("inf")) -> list[Call]:
        return [c for c in self.calls.values() if c.uri == uri and since <= c.sent < until]

    async def back(self, c: Client, uri: str, arg: str, expected: Any, bound: float = RECOVERY) -> float:
        """Seconds until a call to ``uri`` succeeds (within ``bound``)."""
        t0 = self.loop.time()

        async def ok() -> bool:
            with contextlib.suppress(JugglerError):
                return await c.call(uri, arg, timeout=1.0) == expected
            return False

        await wait_until(ok, bound, interval=0.05, what=f"calls to {uri} succeeding again")
        return self.loop.time() - t0

    async def stop(self) -> None:
        """Stop calling, then wait (bounded) for every call to be answered, and check
        the promises that hold for every call."""
        self.stopping.set()
        await asyncio.wait(self.tasks, timeout=CALL_TIMEOUT + 5)
        await wait_until(lambda: all(c.answered_at is not None for c in self.calls.values()),
                         CALL_TIMEOUT + RES_BOUND + 5, interval=0.05, what=lambda: f"every call answered: {self.unanswered()}")
        for msg_uuid, c in self.calls.items():
            at = c.answered_at
            assert at is not None and at - c.sent <= CALL_TIMEOUT + RES_BOUND, (msg_uuid, c)
            assert len(c.res) <= 1, f"call {msg_uuid} got {len(c.res)} RES"
            if c.nack is not None:
                assert c.ack is None, (msg_uuid, c)
                assert c.nack[1] in (500, 504), (msg_uuid, c)
                assert c.nack[1] == 504 or not c.res, f"call {msg_uuid} NACKed {c.nack[1]} and still answered"
            else:
                assert c.ack is not None and c.res, (msg_uuid, c)
                args = c.res[0][1]
                assert args == c.expected or "call timed out" in str(args), (msg_uuid, c)

    def unanswered(self) -> list[Call]:
        return [c for c in self.calls.values() if c.answered_at is None][:3]


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
