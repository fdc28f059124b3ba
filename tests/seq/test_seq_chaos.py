"""Chaos: kill -9 and restart members at random, wipe one member's data, while many
clients with mixed range sizes draw IDs; then no ID may have been handed out twice."""

from __future__ import annotations

import asyncio
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
