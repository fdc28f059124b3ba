"""End to end, in the spirit of upstream's integration test: real Redis, two
`juggler server --redis` processes, three `juggler callee` processes × 4
workers, and several clients sending random CALL/SUB/UNSB/PUB for a few
seconds, some calls built to expire. Then every counter is reconciled
exactly: ACKs = messages sent, no NACK, one RES per call (a result, or for
each call built to expire exactly one "call timed out" error RES, its real
result never), every event received by every subscriber that was
subscribed throughout, nothing received twice or out of a subscription."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from jugglerprocs import Proc, juggler, juggler_server

from tests.netutil import wait_for_port, wait_until
from juggler.client import ACK, EVNT, NACK, RES, Client, connect
from juggler.errors import CallExpired

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

DURATION = 3.0
CLIENTS = 6
CHANNELS = [f"ch.{i}" for i in range(4)]


@dataclass
class Tally:
    sent: int = 0
    calls: int = 0
    built_to_expire: set[str] = field(default_factory=set)
    expired: set[str] = field(default_factory=set)
    results_ok: int = 0
    wrong_results: list[Any] = field(default_factory=list)
    received: Counter[int] = field(default_factory=Counter)
    # RES by call: for_uuid -> how many, and those that said "call timed out"
    res_for: Counter[str] = field(default_factory=Counter)
    timed_out: set[str] = field(default_factory=set)
    # (for_uuid, channel, pattern) -> count
    events: Counter[tuple[str, str, str | None]] = field(default_factory=Counter)
    # channel -> list of [sub_sent_at, sub_acked_at, unsb_sent_at | None, unsb_acked_at | None]
    subs: dict[str, list[list[float | None]]] = field(default_factory=dict)


@dataclass
class Pub:
    uuid: str
    channel: str
    sent_at: float
    acked_at: float
    args: Any


def make_on_message(t: Tally):  # type: ignore[no-untyped-def]
    def on_message(msg: dict[str, Any], _raw: str) -> None:
        typ = msg["meta"]["type"]
        t.received[typ] += 1
        if typ == EVNT:
            p = msg["payload"]
            t.events[(p["for"], p["channel"], p.get("pattern"))] += 1
        elif typ == RES:
            p = msg["payload"]
            t.res_for[p["for"]] += 1
            error = p.get("args") if isinstance(p.get("args"), dict) else None
            if error is not None and str(error.get("error", {}).get("message", "")).startswith("call timed out"):
                t.timed_out.add(p["for"])

    return on_message


async def client_loop(i: int, url: str, deadline: float, pubs: list[Pub], rng: random.Random) -> tuple[Tally, Client]:
    t = Tally()
    c = await connect(url, on_message=make_on_message(t))
    own = f"own.{i}"
    t0 = time.monotonic()
    await c.sub(own)
    t.sent += 1
    t.subs[own] = [[t0, time.monotonic(), None, None]]
    n = 0
    while time.monotonic() < deadline:
        n += 1
        op = rng.random()
        if op < 0.45:
            word = "".join(rng.choice("abcdé✓🎉") for _ in range(rng.randint(0, 12)))
            t.sent += 1
            t.calls += 1
            if rng.random() < 0.5:
                res = await c.call("test.echo", word, timeout=10)
                want: Any = word
            else:
                res = await c.call("test.reverse", word, timeout=10)
                want = word[::-1]
            if res == want:
                t.results_ok += 1
            else:
                t.wrong_results.append((want, res))
        elif op < 0.55:
            t.sent += 1
            t.calls += 1
            if rng.random() < 0.4:  # built to expire: 300 ms of work, 50 ms to live
                uid = f"{i}-{n}"
                t.built_to_expire.add(uid)
                try:
                    await c.call("test.delay", "300", timeout=0.05)
                    t.wrong_results.append(("expected expiry", uid))
                except CallExpired:
                    t.expired.add(uid)
            else:
                res = await c.call("test.delay", "5", timeout=10)
                if res == 5:
                    t.results_ok += 1
                else:
                    t.wrong_results.append((5, res))
        elif op < 0.70:
            ch = rng.choice(CHANNELS)
            t.sent += 1
            sent_at = time.monotonic()
            await c.sub(ch)
            spans = t.subs.setdefault(ch, [])
            if not spans or spans[-1][2] is not None:
                spans.append([sent_at, time.monotonic(), None, None])
        elif op < 0.80:
            ch = rng.choice(CHANNELS)
            spans = t.subs.get(ch)
            span = spans[-1] if spans and spans[-1][2] is None else None
            if span is not None:
                span[2] = time.monotonic()
            t.sent += 1
            await c.unsb(ch)
            if span is not None:
                span[3] = time.monotonic()
        else:
            ch = rng.choice(CHANNELS + [f"own.{rng.randrange(CLIENTS)}"])
            args = {"from": i, "n": n}
            sent_at = time.monotonic()
            t.sent += 1
            u = await c.pub(ch, args)
            pubs.append(Pub(u, ch, sent_at, time.monotonic(), args))
    return t, c


async def test_random_traffic_reconciles_exactly(redis_url: str) -> None:
    callees = [Proc(juggler("callee", "--redis", redis_url, "--workers", "4")) for _ in range(3)]
    try:
        with juggler_server(redis_url) as url1, juggler_server(redis_url) as url2:
            urls = [url1, url2]
            for u in urls:
                wait_for_port(int(u.split(":")[2].split("/")[0]))
            # observers: a pattern subscription that never changes, one per server
            obs_tallies = [Tally() for _ in urls]
            observers = [await connect(u, on_message=make_on_message(obs_tallies[k])) for k, u in enumerate(urls)]
            for o in observers:
                await o.sub("ch.*", pattern=True)
            # the callees are up when a call goes through
            for o in observers:
                assert await o.call("test.echo", "warm-up", timeout=30) == "warm-up"

            pubs: list[Pub] = []
            deadline = time.monotonic() + DURATION
            rng = random.Random(1234)
            results = await asyncio.gather(*(
                client_loop(i, urls[i % 2], deadline, pubs, random.Random(rng.random())) for i in range(CLIENTS)
            ))
            tallies = [t for t, _ in results]
            clients = [c for _, c in results]

            # every pattern event reaches both observers (bounded wait, then exact check)
            ch_pubs = [p for p in pubs if p.channel.startswith("ch.")]
            await wait_until(lambda: all(o.received[EVNT] >= len(ch_pubs) for o in obs_tallies), timeout=15,
                             what="every pattern event at both observers")
            # determinate deliveries on the never-unsubscribed own.<i> channels
            own_pubs = [p for p in pubs if p.channel.startswith("own.")]

            def own_received() -> int:
                return sum(1 for p in own_pubs
                           if tallies[int(p.channel.split(".")[1])].events[(p.uuid, p.channel, None)] >= 1)

            await wait_until(lambda: own_received() >= len(own_pubs), timeout=15, what="every own.<i> event")
            # every call is answered: the expired ones by the server's error RES, about a
            # second after their timeout
            await wait_until(lambda: sum(t.received[RES] for t in tallies) >= sum(t.calls for t in tallies),
                             timeout=15, what="a RES for every call")
            # the real result of an expired call must not come as well: an absence cannot be
            # awaited, so give one the time to show up before the exact checks
            await asyncio.sleep(0.6)

            for c in [*clients, *observers]:
                await c.aclose()
    finally:
        codes = [p.stop() for p in callees]
    assert codes == [0, 0, 0]

    total_sent = sum(t.sent for t in tallies)
    total_calls = sum(t.calls for t in tallies)
    total_expired = sum(len(t.expired) for t in tallies)
    assert total_calls > 50 and len(pubs) > 10  # the run did something
    assert total_expired > 0

    # ACKs = messages sent, no NACK
    assert sum(t.received[ACK] for t in tallies) == total_sent
    assert sum(t.received[NACK] for t in tallies) == 0
    # one RES per call: the expired ones (exactly those built to expire) got the server's
    # "call timed out" error RES, and nothing else
    assert sum(t.received[RES] for t in tallies) == total_calls
    assert all(n == 1 for t in tallies for n in t.res_for.values())
    assert all(t.expired == t.built_to_expire for t in tallies)
    assert sum(len(t.timed_out) for t in tallies) == total_expired
    assert [w for t in tallies for w in t.wrong_results] == []
    assert sum(t.results_ok for t in tallies) == total_calls - total_expired

    # observers: each ch.* PUB exactly once, through the pattern, nothing else
    for o in obs_tallies:
        assert o.events == Counter({(p.uuid, p.channel, "ch.*"): 1 for p in ch_pubs})

    # own channels: the owner got every PUB exactly once
    for p in own_pubs:
        owner = tallies[int(p.channel.split(".")[1])]
        assert owner.events[(p.uuid, p.channel, None)] == 1

    # random SUB/UNSB: nothing twice; nothing outside a subscription (SUB sent
    # before the PUB was acked, UNSB acked after the PUB was sent); everything
    # inside a subscription that spanned the whole PUB (SUB acked before the PUB
    # was sent, no UNSB before the end of the run) was received
    by_uuid = {p.uuid: p for p in pubs}
    for t in tallies:
        for (u, ch, pattern), count in t.events.items():
            assert count == 1
            assert pattern is None
            p = by_uuid[u]
            spans = t.subs.get(ch, [])
            near = [sp for sp in spans if p.sent_at - 0.5 < sp[0] < p.acked_at + 0.5]
            assert any(s0 <= p.acked_at and (e1 is None or e1 >= p.sent_at) for s0, _, _, e1 in spans), (p, near)
        for p in ch_pubs:
            if any(s1 <= p.sent_at and e0 is None for _, s1, e0, _ in t.subs.get(p.channel, [])):
                assert t.events[(p.uuid, p.channel, None)] == 1


async def test_unserved_uri_is_bounded_by_call_cap(redis_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Calls to a URI nobody serves fill its list up to call_cap, then NACK 500."""
    import redis.asyncio as aredis

    from juggler.client import CALL
    from juggler.errors import CallNacked

    cfg = tmp_path / "juggler.toml"
    cfg.write_text(f'[redis]\nurl = "{redis_url}"\ncall_cap = 2\n')
    with juggler_server(redis_url, "--config", str(cfg)) as url:
        async with connect(url) as c:
            for _ in range(2):
                await c._acked(CALL, {"uri": "nobody.serves", "timeout": 5_000_000_000}, '"x"', 10)
            with pytest.raises(CallNacked) as info:
                await c._acked(CALL, {"uri": "nobody.serves", "timeout": 5_000_000_000}, '"x"', 10)
            assert (info.value.code, info.value.message) == (500, "list capacity exceeded")
    r = aredis.Redis.from_url(redis_url)
    try:
        assert await r.llen("juggler:calls:{nobody.serves}") == 2
    finally:
        await r.aclose()
