"""Seq under network faults between its members: three real ``juggler seq server``
processes, each reached by the others only through toxiproxy.

Member i listens on 127.0.0.1 and advertises 127.0.0.(10+i), where toxiproxy
forwards both its gRPC port and its peer port: every connection *to* member i
crosses its two links, so disabling them makes it unreachable, and a latency
toxic slows every answer it gives. Clients reach members directly (on
127.0.0.1), so that they can stay on one side of a partition.

Promises checked (docs/seq.md, "Under faults"): every draw returns or fails
with SeqUnavailable within its deadline (no hang); no ID is handed out twice, across
the fault and its healing; service goes on while a majority can talk, and is
back within a bound once the partition heals; no member crashes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest

from seq import RRSeq, SeqError, SeqUnavailable
from seq.localcluster import LocalCluster
from tests.faults.toxiproxy import Link, Toxiproxy

pytestmark = [pytest.mark.timeout(90)]

#: a draw's deadline in these tests (s), and slack over it for a loaded machine
DEADLINE, SLACK = 2.0, 2.0
#: the bound on recovery once a partition heals (s)
HEAL = 15.0


@dataclass
class Faulty:
    """A three-member cluster whose members reach each other through toxiproxy."""

    cluster: LocalCluster
    links: list[list[Link]]  # per member: [gRPC link, peer-port link]
    ids: dict[str, list[int]] = field(default_factory=dict)

    def direct(self, *members: int) -> list[str]:
        return [self.cluster.addrs[i] for i in members]

    def cut(self, *members: int) -> None:
        for i in members:
            for link in self.links[i]:
                link.disable()

    def heal(self) -> None:
        for pair in self.links:
            for link in pair:
                link.enable()
                link.clear()

    def alive(self) -> None:
        for i, m in enumerate(self.cluster.members):
            assert m.alive, f"member {i} exited:\n{self.cluster.output(i)}"

    def unique(self) -> None:
        for name, got in self.ids.items():
            assert len(got) == len(set(got)), f"{name}: {len(got) - len(set(got))} IDs handed out twice"


@pytest.fixture(scope="module")
def faulty(toxiproxy_server: Toxiproxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faulty]:
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seqfaults")))
    links: list[list[Link]] = []
    advertised: list[str] = []
    for i, m in enumerate(c.members):
        host = f"127.0.0.{10 + i}"
        port = int(m.addr.rpartition(":")[2])
        assert m.peer_port is not None
        links.append([
            toxiproxy_server.link(f"seq{i}-grpc", m.addr, port=port, host=host),
            toxiproxy_server.link(f"seq{i}-peer", f"127.0.0.1:{m.peer_port}", port=m.peer_port, host=host),
        ])
        advertised.append(f"{host}:{port}")
    try:
        for i in range(3):
            c.start(i, "--bootstrap", "--advertise", advertised[i],
                    peers=[a for j, a in enumerate(advertised) if j != i])
        asyncio.run(c.wait_ready(timeout=60))
        yield Faulty(c, links)
    finally:
        c.close()
        toxiproxy_server.delete_all()


@pytest.fixture
async def healed(faulty: Faulty) -> AsyncIterator[Faulty]:
    """The cluster, every link healed after the test, IDs checked unique."""
    yield faulty
    faulty.heal()
    await faulty.cluster.wait_ready(timeout=HEAL * 2)
    faulty.alive()
    faulty.unique()


class Drawers:
    """Clients drawing IDs of ``name`` one by one (no buffer) until stopped; every
    draw's outcome and time is recorded, and a draw slower than its deadline fails."""

    def __init__(self, f: Faulty, name: str, servers: list[str], clients: int = 4) -> None:
        self.ids = f.ids.setdefault(name, [])
        self.seqs = [RRSeq(name, 0, servers, timeout=DEADLINE) for _ in range(clients)]
        self.failures = 0
        self.last_ok = 0.0
        self.slow: list[float] = []
        self.unexpected: list[str] = []
        self.stop = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self.draw(s)) for s in self.seqs]

    async def draw(self, s: RRSeq) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.ids.append(await asyncio.wait_for(s.next(), DEADLINE + SLACK))
                self.last_ok = time.monotonic()
            except SeqUnavailable:
                self.failures += 1
                await asyncio.sleep(0.05)  # a failed draw is answered at once: do not spin
            except TimeoutError:
                self.slow.append(time.monotonic() - t0)
            except SeqError as exc:  # anything but "unavailable" under a partition is a broken promise
                self.unexpected.append(repr(exc))
            took = time.monotonic() - t0
            if took > DEADLINE + SLACK:
                self.slow.append(took)

    async def served_since(self, t: float, n: int = 20, timeout: float = HEAL) -> None:
        """Until ``n`` draws succeeded after time ``t`` (bounded)."""
        start = len(self.ids)
        deadline = time.monotonic() + timeout
        while not (self.last_ok > t and len(self.ids) - start >= n):
            assert time.monotonic() < deadline, f"no {n} draws within {timeout}s (failures: {self.failures})"
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        for s in self.seqs:
            await s.aclose()
        assert not self.slow, f"draws that outlived their deadline: {self.slow}"
        assert not self.unexpected, self.unexpected


async def test_latency_between_members_slows_draws_but_none_fails_or_repeats(healed: Faulty) -> None:
    for pair in healed.links:
        for link in pair:
            link.toxic("latency", latency=50, jitter=20)
    d = Drawers(healed, "latency", healed.direct(0, 1, 2))
    try:
        await d.served_since(time.monotonic(), n=100)
    finally:
        await d.close()
    assert d.failures == 0


async def test_one_member_unreachable_service_goes_on(healed: Faulty) -> None:
    d = Drawers(healed, "minority", healed.direct(0, 1))
    try:
        await d.served_since(time.monotonic())
        cut = time.monotonic()
        healed.cut(2)  # nothing reaches member 2 (it can still call the others)
        await d.served_since(cut, n=100)
        healed.heal()
        await healed.cluster.wait_ready(2, timeout=HEAL)
        await d.served_since(time.monotonic())
    finally:
        await d.close()


async def test_no_majority_draws_fail_in_time_and_the_heal_restores_service_while_drawing(healed: Faulty) -> None:
    d = Drawers(healed, "majority", healed.direct(0))
    try:
        await d.served_since(time.monotonic())
        healed.cut(0, 1, 2)  # no member reaches another
        before = d.failures
        deadline = time.monotonic() + HEAL
        while d.failures < before + 3:  # draws now fail, each explicitly and within its deadline
            assert time.monotonic() < deadline, "draws kept succeeding without a majority"
            await asyncio.sleep(0.05)
        healed_at = time.monotonic()
        healed.heal()  # while the clients go on drawing
        await d.served_since(healed_at, n=50)
        recovery = d.last_ok - healed_at
        assert recovery < HEAL
    finally:
        await d.close()
