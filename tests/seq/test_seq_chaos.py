"""Chaos: kill -9 and restart members at random, wipe one member's data, while many
clients with mixed range sizes draw IDs; then no ID may have been handed out twice."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time

import pytest

from seq import RRSeq, SeqError
from seq.localcluster import LocalCluster

pytestmark = pytest.mark.slow


async def test_chaos_kill_restart_wipe(tmp_path_factory: pytest.TempPathFactory) -> None:
    seed = int(os.environ.get("SEQ_CHAOS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    seed_note = f"SEQ_CHAOS_SEED={seed}"
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("chaos")))
    # Member 2 coordinates everything itself; 0 and 1 forward: both paths under fire.
    flags = [[], [], ["--no-forward"]]
    try:
        for i in range(3):
            c.start(i, "--bootstrap", *flags[i])
        await c.wait_ready(timeout=60)

        sizes = [0, 0, 1, 2, 3, 5, 10, 50, 100, 500, 1000, 0, 2, 7, 64, 256]
        seqs = [RRSeq("chaos", b, c.addrs, timeout=2.0) for b in sizes]
        streams: list[list[int]] = [[] for _ in seqs]
        errors = [0] * len(seqs)
        stop = asyncio.Event()

        async def client(k: int) -> None:
            s, out = seqs[k], streams[k]
            while not stop.is_set():
                try:
                    out.append(await s.next())
                except SeqError:
                    errors[k] += 1  # no quorum for a while: keep trying
                if len(out) % 50 == 0:
                    await asyncio.sleep(0.001)  # let the other clients and the chaos run

        tasks = [asyncio.ensure_future(client(k)) for k in range(len(seqs))]

        async def restart(i: int, *extra: str) -> None:
            c.start(i, *flags[i], *extra)
            await c.wait_ready(i, timeout=60)

        wiped = rng.randrange(3)
        for step in range(10):
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            victim = rng.randrange(3)
            c.kill(victim)  # kill -9
            if step == 4:
                # A member loses its disk: it comes back with --rejoin and must not vote until it
                # caught up from ALL others, so it waits while the victim is still down.
                c.kill(wiped)
                c.wipe(wiped)
                c.start(wiped, *flags[wiped], "--rejoin")
                if victim != wiped:
                    await asyncio.sleep(rng.uniform(0.1, 0.4))  # maybe two down: no quorum
                    await restart(victim)
                await c.wait_ready(wiped, timeout=60)
            elif rng.random() < 0.3:
                other = (victim + 1) % 3
                c.kill(other)  # majority down: clients see no quorum, then recover
                await asyncio.sleep(rng.uniform(0.1, 0.5))
                await restart(other)
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            if not c.members[victim].alive:
                await restart(victim)
        await c.wait_ready(timeout=60)
        mark = [len(s) for s in streams]
        deadline = time.monotonic() + 30
        while any(len(s) <= m + 5 for s, m in zip(streams, mark)):  # everyone makes progress again
            assert time.monotonic() < deadline, f"clients stalled after the chaos ({seed_note})"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await asyncio.gather(*(s.aclose() for s in seqs))
    finally:
        c.close()

    for k, out in enumerate(streams):
        assert all(a < b for a, b in zip(out, out[1:])), f"client {k} went backwards ({seed_note})"
    every = [i for out in streams for i in out]
    assert len(every) == len(set(every)), f"an ID was handed out twice ({seed_note})"
    assert len(every) > 1000


async def test_chaos_replace_a_member_under_load(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Members killed (-9) and restarted at random while, under load, a new member is added and an
    old one removed (then killed and its data wiped), and another one loses its data and rejoins;
    a change cut short by a kill is finished by running it again, as an operator would."""
    from seq.errors import MembershipError
    from seq.membership import Admin

    seed = int(os.environ.get("SEQ_CHAOS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    seed_note = f"SEQ_CHAOS_SEED={seed}"
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("chaos-members")))
    flags: dict[int, list[str]] = {0: [], 1: [], 2: ["--no-forward"]}
    try:
        for i in range(3):
            c.start(i, "--bootstrap", *flags[i])
        await c.wait_ready(timeout=60)
        new = c.add_member()
        flags[new] = []

        sizes = [0, 0, 1, 2, 3, 5, 10, 50, 100, 500, 1000, 0, 2, 7, 64, 256]
        seqs = [RRSeq("chaos", b, c.addrs, timeout=2.0) for b in sizes]  # the new member's address too
        streams: list[list[int]] = [[] for _ in seqs]
        stop = asyncio.Event()

        async def client(k: int) -> None:
            s, out = seqs[k], streams[k]
            while not stop.is_set():
                try:
                    out.append(await s.next())
                except SeqError:
                    pass  # no quorum for a while: keep trying
                if len(out) % 50 == 0:
                    await asyncio.sleep(0.001)

        tasks = [asyncio.ensure_future(client(k)) for k in range(len(seqs))]

        async def chaos(pool: list[int], steps: int) -> None:
            for _ in range(steps):
                await asyncio.sleep(rng.uniform(0.1, 0.4))
                victim = rng.choice(pool)
                c.kill(victim)
                await asyncio.sleep(rng.uniform(0.05, 0.3))
                c.start(victim, *flags[victim])
                await c.wait_ready(victim, timeout=60)

        async def change(admin: Admin, what: str, member: int, servers: list[int]) -> None:
            deadline = time.monotonic() + 90
            while True:
                try:
                    fn = admin.add if what == "add" else admin.remove
                    await fn([c.addrs[i] for i in servers], c.addrs[member])
                    return
                except MembershipError as exc:
                    assert time.monotonic() < deadline, f"{what} never went through: {exc} ({seed_note})"
                    await asyncio.sleep(0.2)

        old = rng.randrange(3)
        async with Admin(timeout=2.0) as admin:
            await chaos([0, 1, 2], 3)
            c.start(new, "--join")
            await asyncio.gather(chaos([0, 1, 2], 4), change(admin, "add", new, [0, 1, 2]))
            await c.wait_ready(new, timeout=60)
            rest = [i for i in (0, 1, 2, new) if i != old]
            await asyncio.gather(chaos(rest, 4), change(admin, "remove", old, rest))
            conf = await admin.configuration([c.addrs[i] for i in rest])
            assert set(conf.members) == {c.addrs[i] for i in rest}, seed_note
        c.kill(old)
        c.wipe(old)
        await chaos(rest, 3)
        wiped = rng.choice(rest)  # a remaining member loses its disk and comes back with --rejoin
        c.kill(wiped)
        c.wipe(wiped)
        c.start(wiped, *flags[wiped], "--rejoin")
        await c.wait_ready(wiped, timeout=60)
        await c.wait_ready(*rest, timeout=60)
        mark = [len(s) for s in streams]
        deadline = time.monotonic() + 30
        while any(len(s) <= m + 5 for s, m in zip(streams, mark)):  # everyone makes progress again
            assert time.monotonic() < deadline, f"clients stalled after the chaos ({seed_note})"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await asyncio.gather(*(s.aclose() for s in seqs))
    finally:
        c.close()

    for k, out in enumerate(streams):
        assert all(a < b for a, b in itertools.pairwise(out)), f"client {k} went backwards ({seed_note})"
    every = [i for out in streams for i in out]
    assert len(every) == len(set(every)), f"an ID was handed out twice ({seed_note})"
    assert len(every) > 1000
