"""Membership changes on real clusters: add and remove one member at a time (seq/membership.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import subprocess
import sys
import time

import grpc
import pytest

from seq import RRSeq, SeqError, SeqUnavailable
from seq._proto import rrpeer_pb2 as peer_pb
from seq._proto import rrseq_pb2 as pb
from seq.errors import MembershipError
from seq.localcluster import LocalCluster, free_port
from seq.membership import Admin
from seq.peerlink import OK, OP_FENCE, OP_INSTALL
from seq.wire import ApiStub


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "seq", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


async def wait_for(cond, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def wait_log(c: LocalCluster, i: int, text: str, timeout: float = 30.0) -> None:
    async def seen() -> bool:
        return text in c.output(i)

    await wait_for(seen, f"{text!r} in member {i}'s log:\n{c.output(i)}", timeout)


async def join(c: LocalCluster) -> int:
    """A new member started with --join, answering."""
    i = c.add_member()
    c.start(i, "--join")

    async def joining() -> bool:
        return await c.state(i) == peer_pb.JOINING

    await wait_for(joining, f"member {i} to answer")
    return i


def check_streams(streams: list[list[int]]) -> None:
    for k, st in enumerate(streams):
        assert all(a < b for a, b in itertools.pairwise(st)), f"client {k} went backwards"
    every = [i for st in streams for i in st]
    assert len(every) == len(set(every)), "an ID was handed out twice"


class Load:
    """Clients with mixed buffer sizes drawing IDs until stopped."""

    def __init__(self, name: str, servers: list[str], clients: int = 8) -> None:
        sizes = [0, 1, 3, 10, 100, 0, 7, 64][:clients]
        self.seqs = [RRSeq(name, b, servers, timeout=2.0) for b in sizes]
        self.streams: list[list[int]] = [[] for _ in self.seqs]
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._client(k)) for k in range(len(self.seqs))]

    async def _client(self, k: int) -> None:
        s, out = self.seqs[k], self.streams[k]
        while not self._stop.is_set():
            try:
                out.append(await s.next())
            except SeqError as exc:
                self.errors.append(str(exc))
            if len(out) % 20 == 0:
                await asyncio.sleep(0.001)

    def count(self) -> int:
        return sum(len(s) for s in self.streams)

    async def progress(self, n: int = 50, timeout: float = 30.0) -> None:
        """Until every client drew `n` more IDs."""
        mark = [len(s) for s in self.streams]

        async def moved() -> bool:
            return all(len(s) >= m + n for s, m in zip(self.streams, mark))

        await wait_for(moved, f"every client to draw {n} more IDs (errors: {self.errors[-3:]})", timeout)

    async def stop(self) -> list[list[int]]:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 30)
        await asyncio.gather(*(s.aclose() for s in self.seqs))
        return self.streams


async def test_replace_a_member_under_load(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    # "quiet" is drawn once, while member 1 is down: only members 0 and 2 hold it, and after
    # the replacement (2 removed) and member 0 killed, only what the new member merged protects it
    c.kill(1)
    async with RRSeq("quiet", 0, c.addrs, timeout=10) as s:
        quiet = [await s.next() for _ in range(30)]
    c.start(1)
    await c.wait_ready(1)
    new = await join(c)
    load = Load("replace", c.addrs)  # the clients know the new member's address from the start
    try:
        await load.progress()
        async with Admin() as admin:
            added = await admin.add(c.addrs[:3], c.addrs[new])
            assert (added.epoch, added.members) == (2, tuple(sorted(c.addrs)))
            await c.wait_ready(new)
            await load.progress()
            removed = await admin.remove([c.addrs[0]], c.addrs[2])
            assert removed.epoch == 3 and c.addrs[2] not in removed.members
            await load.progress()
            conf = await admin.configuration([c.addrs[2], c.addrs[0]])  # the removed one asked too
            assert (conf.epoch, conf.members) == (3, tuple(sorted((c.addrs[0], c.addrs[1], c.addrs[new]))))
            assert conf.views[c.addrs[2]].state == "removed"
        await wait_log(c, 2, "removed from the cluster")
        c.kill(2)
        c.wipe(2)
        await load.progress()
        # the new member votes: with one of the old ones down, quorums need it
        c.kill(0)
        await load.progress()
        async with RRSeq("quiet", 0, c.addrs, timeout=10) as s:
            assert await s.next() > quiet[-1]
    finally:
        streams = await load.stop()
    check_streams(streams)
    assert sum(map(len, streams)) > 500


async def test_a_removed_member_refuses(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    async with RRSeq("gone", 5, c.addrs) as s:
        before = [await s.next() for _ in range(20)]
    new = await join(c)
    async with Admin() as admin:
        await admin.add(c.addrs, c.addrs[new])
        await admin.remove(c.addrs, c.addrs[1])
    await wait_log(c, 1, "removed from the cluster")
    async with grpc.aio.insecure_channel(c.addrs[1]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ApiStub(ch).NextID(pb.NextIDRequest(name="gone", range_size=1), timeout=5)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "removed" in (e.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ApiStub(ch).CurID(pb.CurIDRequest(name="gone"), timeout=5)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # a client that knows only the removed member says so at once; one that knows others goes on
    async with RRSeq("gone", 0, [c.addrs[1]], timeout=5) as s:
        t0 = time.monotonic()
        with pytest.raises(SeqUnavailable, match="removed"):
            await s.next()
        assert time.monotonic() - t0 < 2
    async with RRSeq("gone", 0, [c.addrs[1], c.addrs[0]], timeout=5) as s:
        after = [await s.next() for _ in range(5)]
        assert s._servers[0].removed
    assert after[0] > before[-1]
    # it refuses to start again
    c.stop(1)
    p = c.start(1)
    assert p.wait(timeout=60) == 2
    assert "removed from its cluster" in c.output(1) and "--join" in c.output(1)


async def test_restart_uses_the_persisted_configuration(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    new = await join(c)
    async with Admin() as admin:
        await admin.add(c.addrs, c.addrs[new])
    # member 0 restarted with its original --peers (the three old members): the configuration
    # in its data directory (four members, epoch 2) is used
    c.stop(0)
    c.start(0, peers=c.addrs[1:3])
    await c.wait_ready(0)
    assert "--peers" in c.output(0) and "is ignored" in c.output(0)
    # the new member restarted without --join
    c.stop(new)
    c.start(new)
    await c.wait_ready(new)
    async with Admin() as admin:
        conf = await admin.configuration([c.addrs[0]])
    assert (conf.epoch, conf.members) == (2, tuple(sorted(c.addrs)))
    assert all(conf.views[a].state == "ready" and conf.views[a].epoch == 2 for a in c.addrs)
    # with two of four down the cluster has no quorum (W = 3): it really counts four members
    c.kill(1)
    c.kill(2)
    async with RRSeq("persisted", 0, c.addrs, timeout=1.5) as s:
        with pytest.raises(SeqUnavailable):
            await s.next()
    c.start(2)
    await c.wait_ready(2)
    async with RRSeq("persisted", 0, c.addrs, timeout=10) as s:
        assert await s.next() >= 1


async def test_a_change_while_another_is_pending_is_refused(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    x = await join(c)
    y = await join(c)
    async with Admin() as admin:
        conf = await admin.configuration(c.addrs[:3])
        # a change to add X stopped after fencing one member (as if its CLI was killed)
        target = sorted((*conf.members, c.addrs[x]))
        rep = await admin._call(c.addrs[0], [OP_FENCE, conf.cluster, "", "t-x", 2, target])
        assert rep[0] == OK
        listed = run_cli("member", "list", "--servers", c.addrs[1])
        assert listed.returncode == 0, listed.stderr
        assert "pending change: to epoch 2" in listed.stdout and "fenced" in listed.stdout
        with pytest.raises(MembershipError, match="another membership change is in progress"):
            await admin.add(c.addrs[:3], c.addrs[y])
        out = run_cli("member", "add", c.addrs[y], "--servers", ",".join(c.addrs[:3]))
        assert out.returncode == 1 and "in progress" in out.stderr, out.stderr
        # the fenced member does not vote meanwhile; the other two do
        async with RRSeq("pending", 0, c.addrs[:3], timeout=10) as s:
            assert await s.next() == 1
        # running the first change again finishes it
        res = await admin.add(c.addrs[:3], c.addrs[x])
        assert res.resumed and res.epoch == 2
        res = await admin.add(c.addrs[:3], c.addrs[y])
        assert not res.resumed and res.epoch == 3 and len(res.members) == 5


async def test_a_new_member_counts_only_once_caught_up(fresh_cluster: LocalCluster) -> None:
    """Kill the old majority while the new member waits to be added: the new member and the one
    old member left must serve nothing; the change cannot be made; once the others are back it
    is, and the new member then holds every value handed out."""
    c = fresh_cluster
    async with RRSeq("catch", 0, c.addrs, timeout=10) as s:
        before = [await s.next() for _ in range(30)]
    d = await join(c)
    c.kill(0)
    c.kill(1)
    async with Admin(timeout=2.0) as admin:
        with pytest.raises(MembershipError, match="only 1 of the 3 members"):
            await admin.add([c.addrs[2]], c.addrs[d])
    assert await c.state(d) == peer_pb.JOINING
    async with RRSeq("catch", 0, [c.addrs[2], c.addrs[d]], timeout=1.5) as s:
        with pytest.raises(SeqUnavailable):
            await s.next()
    c.start(0)
    c.start(1)
    await c.wait_ready(0, 1)
    async with Admin() as admin:
        res = await admin.add(c.addrs[:3], c.addrs[d])
    assert res.resumed  # member 2 was fenced by the failed attempt
    await c.wait_ready(d)
    async with grpc.aio.insecure_channel(c.addrs[d]) as ch:
        cur = (await ApiStub(ch).CurID(pb.CurIDRequest(name="catch"), timeout=5)).cur_id
    assert cur > before[-1]
    async with RRSeq("catch", 0, c.addrs, timeout=10) as s:
        after = [await s.next() for _ in range(10)]
    assert after[0] > before[-1]


async def test_a_change_installed_on_a_minority_serves_nothing_then_heals(fresh_cluster: LocalCluster) -> None:
    """The old majority dies between the two steps of an add: the new configuration reached only
    two of its four members, which must not serve; the old members, back, learn it and catch up."""
    c = fresh_cluster
    async with RRSeq("half", 3, c.addrs, timeout=10) as s:
        before = [await s.next() for _ in range(40)]
    d = await join(c)
    async with Admin(timeout=5.0) as admin:
        conf = await admin.configuration(c.addrs[:3])
        target = sorted((*conf.members, c.addrs[d]))
        merged: dict[str, int] = {}
        for a in conf.members:
            rep = await admin._call(a, [OP_FENCE, conf.cluster, "", "t-half", 2, target])
            assert rep[0] == OK
            for k, v in rep[1].items():
                merged[k] = max(v, merged.get(k, 0))
        c.kill(0)
        c.kill(1)
        for a in (c.addrs[2], c.addrs[d]):
            rep = await admin._call(a, [OP_INSTALL, conf.cluster, "", "t-half", 2, target, merged])
            assert rep[0] == OK
    async with RRSeq("half", 0, [c.addrs[2], c.addrs[d]], timeout=1.5) as s:
        with pytest.raises(SeqUnavailable):
            await s.next()
    c.start(0)
    c.start(1)
    # members 0 and 1 come back fenced for epoch 1; the rounds of epoch 2 reach them and they learn it
    async with RRSeq("half", 0, c.addrs, timeout=20) as s:
        after = [await s.next() for _ in range(10)]
    assert after[0] > before[-1]
    async with Admin() as admin:
        async def all_in_epoch_2() -> bool:
            conf = await admin.configuration([c.addrs[0]])
            return all(conf.views[a].reachable and conf.views[a].epoch == 2 and conf.views[a].state == "ready"
                       for a in c.addrs)

        # without further traffic too: a fenced member looks for the change's outcome by itself
        await wait_for(all_in_epoch_2, "every member ready in epoch 2")


async def test_cli_member_list_add_remove_and_errors(fresh_cluster: LocalCluster,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    c = fresh_cluster
    servers = ",".join(c.addrs)
    out = run_cli("member", "list", "--servers", c.addrs[0])
    assert out.returncode == 0, out.stderr
    assert "configuration epoch 1: 3 members, quorum 2" in out.stdout
    for a in c.addrs:
        assert a in out.stdout
    assert out.stdout.count("ready") == 3
    out = run_cli("member", "list", "--servers", c.addrs[1], "--json")
    doc = json.loads(out.stdout)
    assert doc["epoch"] == 1 and doc["members"] == sorted(c.addrs) and doc["quorum"] == 2
    assert {s["member"]: s["state"] for s in doc["states"]} == dict.fromkeys(c.addrs, "ready")
    # errors: nothing listening, not started with --join, already a member, too few left, not a member
    nowhere = f"127.0.0.1:{free_port()}"
    out = run_cli("member", "add", nowhere, "--servers", servers, "--timeout", "2")
    assert out.returncode == 1 and f"cannot reach {nowhere}" in out.stderr and "--join" in out.stderr
    other = LocalCluster(1, root=str(tmp_path_factory.mktemp("other")))
    try:
        other.start(0, "--bootstrap")
        await other.wait_ready()
        out = run_cli("member", "add", other.addrs[0], "--servers", servers)
        assert out.returncode == 2 and "was not started with --join" in out.stderr, out.stderr
    finally:
        other.close()
    out = run_cli("member", "add", c.addrs[1], "--servers", servers)
    assert out.returncode == 2 and "already a member" in out.stderr
    out = run_cli("member", "remove", c.addrs[1], "--servers", servers)
    assert out.returncode == 2 and "would leave 2 members" in out.stderr and "add its replacement first" in out.stderr
    out = run_cli("member", "remove", nowhere, "--servers", servers)
    assert out.returncode == 2 and "is not a member" in out.stderr
    out = run_cli("member", "list", "--servers", nowhere, "--timeout", "1")
    assert out.returncode == 1 and "no member of a cluster answered" in out.stderr
    out = run_cli("member", "list", "--servers", "nonsense")
    assert out.returncode == 2 and "HOST:PORT" in out.stderr
    # add, then remove
    d = await join(c)
    out = run_cli("member", "add", c.addrs[d], "--servers", c.addrs[0])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"added {c.addrs[d]}: configuration epoch 2")
    out = run_cli("member", "remove", c.addrs[0], "--servers", c.addrs[1], "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["action"] == "remove" and doc["epoch"] == 3 and c.addrs[0] not in doc["members"]
    out = run_cli("member", "list", "--servers", f"{c.addrs[1]},{c.addrs[0]}")
    assert "configuration epoch 3: 3 members" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith(c.addrs[0]))
    assert row.split()[1:3] == ["no", "removed"]


async def test_random_order_of_changes_keeps_ids_unique(fresh_cluster: LocalCluster) -> None:
    """Add two, remove two, under load; every step checked by the clients' streams."""
    c = fresh_cluster
    rng = random.Random(3)
    extra = [await join(c), await join(c)]
    load = Load("steps", c.addrs)
    try:
        members = list(c.addrs[:3])
        async with Admin() as admin:
            for i in extra:
                await admin.add(members, c.addrs[i])
                members.append(c.addrs[i])
                await load.progress(20)
            for _ in range(2):
                victim = rng.choice(members)
                await admin.remove(members, victim)
                members.remove(victim)
                await load.progress(20)
    finally:
        streams = await load.stop()
    check_streams(streams)


async def test_a_new_member_the_change_missed_catches_up_when_added_again(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    async with RRSeq("missed", 7, c.addrs, timeout=10) as s:
        before = [await s.next() for _ in range(40)]
    d = await join(c)
    async with Admin() as admin:
        conf = await admin.configuration(c.addrs[:3])
        target = sorted((*conf.members, c.addrs[d]))
        merged: dict[str, int] = {}
        for a in conf.members:
            rep = await admin._call(a, [OP_FENCE, conf.cluster, "", "t-missed", 2, target])
            for k, v in rep[1].items():
                merged[k] = max(v, merged.get(k, 0))
        for a in conf.members:  # three of four: the change is made, the new member missed it
            assert (await admin._call(a, [OP_INSTALL, conf.cluster, "", "t-missed", 2, target, merged]))[0] == OK
        assert await c.state(d) == peer_pb.JOINING
        res = await admin.add([c.addrs[0]], c.addrs[d])
        assert res.resumed and res.epoch == 2
    await c.wait_ready(d)
    c.kill(0)  # quorums of three out of {1, 2, d}: the new member counts now
    async with RRSeq("missed", 0, c.addrs, timeout=10) as s:
        after = [await s.next() for _ in range(10)]
    assert after[0] > before[-1]


async def test_rejoin_after_a_change_learns_the_configuration(fresh_cluster: LocalCluster) -> None:
    c = fresh_cluster
    d = await join(c)
    async with Admin() as admin:
        await admin.add(c.addrs[:3], c.addrs[d])
        await admin.remove([c.addrs[0]], c.addrs[2])
    c.stop(2)
    async with RRSeq("relearn", 0, c.addrs, timeout=10) as s:
        before = [await s.next() for _ in range(30)]
        c.kill(1)  # member 1 misses what follows
        before += [await s.next() for _ in range(30)]
    c.kill(0)
    c.wipe(0)
    c.start(1)
    # --peers names only member 1: the configuration (and who else to catch up from) is asked from it
    c.start(0, "--rejoin", peers=[c.addrs[1]])
    await c.wait_ready(0, 1)
    assert "configuration epoch 3 learned" in c.output(0)
    c.kill(d)  # the only member with every write is gone: quorums are {0, 1}
    async with RRSeq("relearn", 0, c.addrs, timeout=10) as s:
        after = [await s.next() for _ in range(10)]
    assert after[0] > before[-1]


async def test_a_snowflake_worker_follows_the_change(fresh_cluster: LocalCluster,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """A worker started with the original member list keeps renewing its worker-ID lease after a
    member is replaced (it learns the new configuration), and its IDs keep increasing."""
    import aiohttp

    from seq.localworker import LocalWorker

    c = fresh_cluster
    flags = ("--lease-ttl-ms", "1500", "--lease-margin-ms", "500", "--max-clock-skew-ms", "100",
             "--peer-timeout", "0.3")
    w = LocalWorker(list(c.addrs), str(tmp_path_factory.mktemp("worker") / "w.log"), flags=flags)
    w.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await w.wait_ready(http)

            async def draw() -> int:
                async with http.get(f"{w.url}/v1/next/x") as r:
                    body = await r.json()
                    assert r.status == 200, body
                    return int(body["from"])

            got = [await draw()]
            d = await join(c)
            async with Admin() as admin:
                await admin.add(c.addrs[:3], c.addrs[d])
                await admin.remove([c.addrs[0]], c.addrs[1])
            c.stop(1)
            # several lease periods: each renewal must win in the new configuration
            end = time.monotonic() + 5.0
            while time.monotonic() < end:
                got.append(await draw())
                await asyncio.sleep(0.05)
            assert all(a < b for a, b in itertools.pairwise(got))
            assert "configuration epoch 3" in w.output()
    finally:
        w.stop()


async def test_http_api_of_joining_and_removed_members(tmp_path_factory: pytest.TempPathFactory) -> None:
    import aiohttp

    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seq-http")), http=True)
    try:
        c.start_all("--bootstrap")
        await c.wait_ready(timeout=60)
        d = await join(c)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

            async def http_listening() -> bool:  # the HTTP listener may open just after gRPC answers
                try:
                    async with http.get(f"{c.http_urls[d]}/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await wait_for(http_listening, f"member {d}'s HTTP API")
            async with http.get(f"{c.http_urls[d]}/v1/next/h") as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "unavailable"
            async with http.get(f"{c.http_urls[d]}/readyz") as r:
                assert r.status == 503 and (await r.json())["state"] == "joining"
            async with Admin() as admin:
                await admin.add(c.addrs[:3], c.addrs[d])
                await admin.remove(c.addrs[:3], c.addrs[0])
            async with http.get(f"{c.http_urls[d]}/v1/next/h") as r:
                assert r.status == 200, await r.text()
            async with http.get(f"{c.http_urls[0]}/v1/next/h") as r:
                body = await r.json()
                assert r.status == 410 and body["error"]["code"] == "removed", body
    finally:
        c.close()
