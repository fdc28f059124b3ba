"""Snowflake mode: the layout and generator (no sockets), then real worker processes
(``juggler seq snowflake``) leasing worker IDs from a real 3-member cluster."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from seq.channel import ApiChannel
from seq.errors import ClockMovedBackwards, RpcFailed, SeqExhausted
from seq.localcluster import LocalCluster
from seq.localworker import LocalWorker
from seq.snowflake import Generator, Layout, Wait, decode, parse_epoch

EPOCH = parse_epoch("2024-01-01T00:00:00Z")
T0 = EPOCH + 1_000_000  # a Unix ms after the epoch


# -- sans-I/O ---------------------------------------------------------------------


def test_layout_validated() -> None:
    Layout()
    for bad in ({"time_bits": 40}, {"worker_bits": 0, "time_bits": 51}, {"sequence_bits": 23, "time_bits": 30}):
        with pytest.raises(ValueError):
            Layout(**bad)
    with pytest.raises(ValueError, match="time zone"):
        parse_epoch("2024-01-01T00:00:00")
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_epoch("yesterday")


def test_compose_split_decode() -> None:
    lay = Layout(epoch_ms=EPOCH)
    i = lay.compose(123_456, 789, 4095)
    assert i < 1 << 63 and lay.split(i) == (123_456, 789, 4095)
    d = decode(i, lay)
    assert d == {"id": i, "time": "2024-01-01T00:02:03.456Z", "ms": 123_456, "worker": 789, "sequence": 4095}
    top = lay.compose(lay.max_ms, 1023, 4095)
    assert top == (1 << 63) - 1


def test_generator_increasing_and_overflow_waits() -> None:
    lay = Layout(epoch_ms=EPOCH)
    g = Generator(lay, max_backward_ms=5)
    g.rebase(7, 0)
    a = g.take(1, T0)
    b = g.take(4094, T0)
    assert isinstance(a, int) and isinstance(b, int) and b == a + 1
    assert g.take(2, T0) == Wait(1, False)  # one left in this millisecond: the next one
    c = g.take(1, T0)
    assert c == b + 4094 and lay.split(c) == (T0 - EPOCH, 7, 4095)
    d = g.take(4096, T0 + 1)
    assert isinstance(d, int) and d > c and lay.split(d) == (T0 - EPOCH + 1, 7, 0)


def test_generator_clock_backwards() -> None:
    g = Generator(Layout(epoch_ms=EPOCH), max_backward_ms=5)
    g.rebase(1, 0)
    first = g.take(1, T0)
    assert g.take(1, T0 - 5) == Wait(5, True)  # within the bound: wait it out
    with pytest.raises(ClockMovedBackwards) as e:
        g.take(1, T0 - 6)
    assert e.value.behind_ms == 6 and isinstance(e.value, ConnectionError)
    later = g.take(1, T0 + 1)
    assert isinstance(later, int) and isinstance(first, int) and later > first


def test_generator_rebase_floor_and_exhaustion() -> None:
    lay = Layout(epoch_ms=EPOCH)
    g = Generator(lay, max_backward_ms=5)
    g.rebase(3, T0 + 100)  # the previous holder may have used up to T0 + 99
    assert g.take(1, T0 + 99) == Wait(1, False)  # as if that millisecond were used up
    assert g.take(1, T0 + 97) == Wait(3, True)
    x = g.take(1, T0 + 100)
    assert isinstance(x, int) and lay.split(x)[0] == T0 + 100 - EPOCH
    g.rebase(2, 0)  # another worker ID, lower: the next ID still goes above (a new millisecond)
    assert g.take(1, T0 + 100) == Wait(1, False)
    y = g.take(1, T0 + 101)
    assert isinstance(y, int) and y > x
    small = Generator(Layout(epoch_ms=EPOCH, time_bits=32, worker_bits=10, sequence_bits=21), max_backward_ms=0)
    small.rebase(0, 0)
    with pytest.raises(SeqExhausted):
        small.take(1, EPOCH + (1 << 32))


# -- the decoder CLI ----------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "seq", *args], check=False, capture_output=True,
                          text=True, timeout=60)


def test_decode_cli() -> None:
    lay = Layout(epoch_ms=EPOCH)
    i = lay.compose(86_400_000, 5, 17)
    r = _cli("decode", str(i))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"id": i, "time": "2024-01-02T00:00:00.000Z", "ms": 86_400_000,
                                    "worker": 5, "sequence": 17}
    other = _cli("decode", str(i), "--epoch", "2020-01-01T00:00:00+00:00", "--bits", "41,12,10")
    assert other.returncode == 0 and json.loads(other.stdout)["worker"] == (i >> 10) & 4095


@pytest.mark.parametrize("bad", ["-1", str(1 << 63), str(10**30), "12a", "", "0x10", "1e5", "+5", "٣"])
def test_decode_cli_refuses_hostile_input(bad: str) -> None:
    r = _cli("decode", bad)
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Traceback" not in r.stderr and "decimal integer from 0 to 2**63-1" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_decode_cli_refuses_bad_layout() -> None:
    for args in (("--bits", "41,10,13"), ("--epoch", "tomorrow"), ("--bits", "a,b,c")):
        r = _cli("decode", "1", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [
    ("--bits", "41,10,13"), ("--epoch", "2999-01-01T00:00:00Z"), ("--cluster", "nohost"),
    ("--max-clock-backward-ms", "-1"), ("--lease-ttl-ms", "1000", "--lease-margin-ms", "900"),
])
def test_snowflake_cli_refuses_bad_options(args: tuple[str, ...]) -> None:
    r = _cli("snowflake", "--cluster", "127.0.0.1:1", "--listen", "127.0.0.1:0", *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("juggler seq snowflake: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- real workers ------------------------------------------------------------------

FAST = ("--lease-ttl-ms", "1500", "--lease-margin-ms", "500", "--max-clock-skew-ms", "100", "--peer-timeout", "0.3")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


@pytest.fixture
def workers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    made: list[LocalWorker] = []
    root = tmp_path_factory.mktemp("workers")

    def make(c: LocalCluster, *flags: str) -> LocalWorker:
        w = LocalWorker(c.addrs, str(root / f"w{len(made)}.log"), flags=flags)
        made.append(w)
        w.start()
        return w

    yield make
    for w in made:
        w.stop()


async def _next(http: aiohttp.ClientSession, w: LocalWorker, n: int = 1) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{w.url}/v1/next/x?count={n}") as r:
        return r.status, await r.json()


async def _info(http: aiohttp.ClientSession, w: LocalWorker) -> dict[str, Any]:
    """``/v1/worker``, or not serving while the process is not listening yet."""
    try:
        async with http.get(w.url + "/v1/worker") as r:
            return dict(await r.json())
    except aiohttp.ClientConnectorError:
        return {"serving": False}


def _ids(body: dict[str, Any]) -> range:
    return range(body["from"], body["to"] + 1)


async def test_ids_increasing_decodable_over_http_and_grpc(
        cluster: LocalCluster, workers: Callable[..., LocalWorker], http: aiohttp.ClientSession) -> None:
    w = workers(cluster)
    info = await w.wait_ready(http)
    lay = Layout(epoch_ms=EPOCH)
    before = time.time() * 1000
    got: list[int] = []
    for n in (1, 1, 7, 1000, 4096, 1):
        status, body = await _next(http, w, n)
        assert status == 200, body
        assert body["to"] - body["from"] + 1 == n
        got.extend(_ids(body))
    ch = ApiChannel([w.addr])
    try:
        for n in (1, 1000):
            lo, hi = await ch.next_id(0, "x", n, timeout=5)
            assert hi - lo == n
            got.extend(range(lo, hi))
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(0, "x", 4097, timeout=5)
        assert e.value.code_name == "INVALID_ARGUMENT"
    finally:
        await ch.aclose()
    after = time.time() * 1000
    assert all(a < b for a, b in itertools.pairwise(got))
    for i in (got[0], got[len(got) // 2], got[-1]):
        ms, worker, _ = lay.split(i)
        assert worker == info["worker"]
        assert before - 1 <= EPOCH + ms <= after + 1
    status, body = await _next(http, w, 4097)
    assert status == 400 and body["error"]["code"] == "bad_count"
    r = _cli("decode", str(got[-1]))
    assert json.loads(r.stdout)["worker"] == info["worker"]


async def test_workers_never_share_a_worker_id(
        fresh_cluster: LocalCluster, workers: Callable[..., LocalWorker], http: aiohttp.ClientSession) -> None:
    """4 worker IDs (2 bits), 6 workers: 4 serve with distinct IDs, 2 wait; a killed holder's ID
    goes to a waiting worker only after it expired, with IDs above every one it could issue."""
    bits = ("--bits", "41,2,20")
    ws = [workers(fresh_cluster, *bits, *FAST) for _ in range(6)]
    end = asyncio.get_running_loop().time() + 30
    while True:
        infos = [await _info(http, w) for w in ws]
        serving = [i for i in infos if i.get("serving")]
        if len(serving) == 4 and all("epoch_ms" in i for i in infos):  # 4 leased, all 6 listening
            break
        assert asyncio.get_running_loop().time() < end, infos
        await asyncio.sleep(0.05)
    assert sorted(i["worker"] for i in serving) == [0, 1, 2, 3]
    idle = [w for w, i in zip(ws, infos) if not i.get("serving")]
    for w in idle:
        status, body = await _next(http, w)
        assert status == 503 and body["error"]["code"] == "no_lease"
    # kill -9 a holder after it issued IDs; a waiting worker takes its worker ID
    victim_k = next(k for k, i in enumerate(infos) if i.get("serving"))
    victim, vinfo = ws[victim_k], infos[victim_k]
    status, body = await _next(http, victim, 100)
    assert status == 200
    async with http.get(victim.url + "/v1/worker") as r:
        expiry = (await r.json())["lease_expiry_ms"]  # no ID of the victim has a time at or after this
    victim.kill()
    end = asyncio.get_running_loop().time() + 30
    taker = None
    while taker is None:
        for w in idle:
            i = await _info(http, w)
            if i["serving"] and i["worker"] == vinfo["worker"]:
                taker, tinfo = w, i
        assert asyncio.get_running_loop().time() < end, "nobody took the dead worker's ID"
        await asyncio.sleep(0.05)
    assert time.time() * 1000 > expiry  # taken only after expiry
    assert tinfo["floor_ms"] >= expiry
    status, tbody = await _next(http, taker, 10)
    assert status == 200
    lay = Layout(epoch_ms=EPOCH, time_bits=41, worker_bits=2, sequence_bits=20)
    assert lay.split(tbody["from"])[1] == vinfo["worker"]
    assert EPOCH + lay.split(tbody["from"])[0] >= expiry
    assert tbody["from"] > body["to"]


async def test_worker_stops_serving_before_its_lease_expires(
        fresh_cluster: LocalCluster, workers: Callable[..., LocalWorker], http: aiohttp.ClientSession) -> None:
    """Majority SIGSTOPped: renewals fail, and the worker refuses before the expiry it last won."""
    w = workers(fresh_cluster, "--lease-ttl-ms", "3000", "--lease-margin-ms", "1000", "--peer-timeout", "0.3")
    await w.wait_ready(http)
    stopped = [m.proc for m in fresh_cluster.members[:2]]
    last_ok: dict[str, Any] = {}
    try:
        for p in stopped:
            assert p is not None
            p.send_signal(signal.SIGSTOP)
        expiry = 0  # the latest expiry the worker won (a renewal sent before the SIGSTOP may still win)
        end = asyncio.get_running_loop().time() + 10
        while True:
            expiry = max(expiry, (await _info(http, w)).get("lease_expiry_ms") or 0)
            status, body = await _next(http, w)
            now = time.time() * 1000
            if status != 200:
                break
            last_ok = body
            assert now < expiry
            assert asyncio.get_running_loop().time() < end, "still serving"
            await asyncio.sleep(0.01)
        assert status == 503 and body["error"]["code"] == "no_lease"
        assert now < expiry, "refused only after the expiry"
        lay = Layout(epoch_ms=EPOCH)
        assert last_ok and EPOCH + lay.split(last_ok["to"])[0] < expiry
        async with http.get(w.url + "/readyz") as r:
            assert r.status == 503 and "lease" in (await r.json())["error"]["message"]
    finally:
        for p in stopped:
            assert p is not None
            p.send_signal(signal.SIGCONT)
    await w.wait_ready(http, timeout=30)  # renewed (or leased again) once the members are back
    status, body = await _next(http, w)
    assert status == 200 and body["from"] > last_ok["to"]


async def test_clock_backwards_waits_within_the_bound_then_fails_typed(
        cluster: LocalCluster, workers: Callable[..., LocalWorker], http: aiohttp.ClientSession) -> None:
    w = workers(cluster, "--test-clock-control", "--max-clock-backward-ms", "200")

    async def shift(ms: int) -> None:
        async with http.post(w.url + "/v1/test/clock", json={"offset_ms": ms}) as r:
            assert r.status == 200

    async def metric(name: str) -> float:
        async with http.get(w.url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(name)

    await w.wait_ready(http)
    _, a = await _next(http, w)
    await shift(-150)  # within the bound: waits until the clock is past the last millisecond used
    t = time.monotonic()
    status, b = await _next(http, w)
    assert status == 200 and b["from"] > a["to"]
    assert time.monotonic() - t >= 0.1
    assert await metric("seq_snowflake_waits_total") >= 1
    await shift(-150 - 5000)  # beyond it: refused, typed, logged, counted
    status, body = await _next(http, w)
    assert status == 503 and body["error"]["code"] == "clock_moved_backwards", body
    ch = ApiChannel([w.addr])
    try:
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(0, "x", 1, timeout=5)
        assert e.value.code_name == "UNAVAILABLE" and "clock moved backwards" in e.value.details
    finally:
        await ch.aclose()
    assert await metric("seq_snowflake_clock_backwards_total") >= 2
    assert "clock moved backwards" in w.output()
    await shift(0)
    status, c = await _next(http, w)
    assert status == 200 and c["from"] > b["to"]


@pytest.mark.slow
async def test_chaos_no_duplicate_across_workers(
        fresh_cluster: LocalCluster, workers: Callable[..., LocalWorker], http: aiohttp.ClientSession) -> None:
    """5 workers for 4 worker IDs, under kill -9 and restart, SIGSTOP/SIGCONT pauses (some longer
    than a lease), clocks stepped back (within and beyond the bound) and a member killed and
    restarted, while clients draw IDs from every worker: no ID twice, each run's stream increasing."""
    seed = int(os.environ.get("SEQ_CHAOS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    note = f"SEQ_CHAOS_SEED={seed}"
    ws = [workers(fresh_cluster, "--bits", "41,2,20", *FAST, "--test-clock-control", "--max-clock-backward-ms", "20")
          for _ in range(5)]
    for w in ws:
        await _wait_listening(http, w)
    streams: dict[tuple[int, int], list[int]] = {}
    refusals: dict[str, int] = {}
    stop = asyncio.Event()

    async def client(k: int) -> None:
        w = ws[k]
        while not stop.is_set():
            run = w.runs
            try:
                status, body = await _next(http, w, rng.choice((1, 1, 3, 10, 200)))
            except (aiohttp.ClientError, TimeoutError, ValueError):
                await asyncio.sleep(0.01)
                continue
            if status == 200:
                streams.setdefault((k, run), []).extend(_ids(body))
            else:
                code = body["error"]["code"]
                refusals[code] = refusals.get(code, 0) + 1
                await asyncio.sleep(0.005)

    async def shift(w: LocalWorker, ms: int) -> None:
        try:
            async with http.post(w.url + "/v1/test/clock", json={"offset_ms": ms}) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # not listening (restarting): its clock stays as is

    tasks = [asyncio.ensure_future(client(k)) for k in range(len(ws))]
    paused: list[LocalWorker] = []
    try:
        for _ in range(14):
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            w = rng.choice(ws)
            what = rng.choice(("kill", "pause", "clock", "clock", "member"))
            if what == "kill":
                w.kill()
                if rng.random() < 0.5:
                    await asyncio.sleep(rng.uniform(0.1, 1.0))
                w.start()
            elif what == "pause" and w.alive and w not in paused:
                w.signal(signal.SIGSTOP)  # sometimes past expiry + skew: a waiting worker may take its ID
                paused.append(w)
                asyncio.get_running_loop().call_later(rng.uniform(0.2, 3.0), _resume, w, paused)
            elif what == "clock":
                await shift(w, -rng.choice((rng.randint(1, 15), rng.randint(100, 2500))))
            elif what == "member":
                i = rng.randrange(3)
                fresh_cluster.kill(i)
                await asyncio.sleep(rng.uniform(0.05, 0.5))
                fresh_cluster.start(i)
                await fresh_cluster.wait_ready(i, timeout=60)
        while paused:
            _resume(paused[0], paused)
        for w in ws:
            await shift(w, 0)
        await fresh_cluster.wait_ready(timeout=60)
        mark = sum(len(s) for s in streams.values())
        end = asyncio.get_running_loop().time() + 30
        while sum(len(s) for s in streams.values()) < mark + 1000:  # serving again after the chaos
            assert asyncio.get_running_loop().time() < end, f"no progress after the chaos ({note}): {refusals}"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    every = [i for s in streams.values() for i in s]
    for key, s in streams.items():
        assert all(a < b for a, b in itertools.pairwise(s)), f"worker run {key} went backwards ({note})"
    assert len(every) == len(set(every)), f"an ID was issued twice ({note})"
    assert len(every) > 2000, (len(every), refusals)


def _resume(w: LocalWorker, paused: list[LocalWorker]) -> None:
    if w in paused:
        paused.remove(w)
        if w.alive:
            w.signal(signal.SIGCONT)


async def _wait_listening(http: aiohttp.ClientSession, w: LocalWorker, timeout: float = 30) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while "epoch_ms" not in await _info(http, w):
        assert asyncio.get_running_loop().time() < end, w.output()[-2000:]
        await asyncio.sleep(0.05)


async def test_lease_names_are_reserved(
        cluster: LocalCluster, workers: Callable[..., LocalWorker], http: aiohttp.ClientSession) -> None:
    """Clients cannot draw from or set a lease record (members and workers share the check); reading is allowed."""
    w = workers(cluster)
    info = await w.wait_ready(http)
    name = f"__snowflake/worker/{info['worker']}"
    ch = ApiChannel(cluster.addrs)
    try:
        for call in (ch.next_id(0, name, 1, 5), ch.set_id(1, name, 1 << 62, 5)):
            with pytest.raises(RpcFailed) as e:
                await call
            assert e.value.code_name == "INVALID_ARGUMENT" and "reserved" in e.value.details
        cur, _ = await ch.cur_id(0, name, 5)
        assert cur >= info["lease_expiry_ms"] - 60_000  # the lease value: its expiry in Unix ms
    finally:
        await ch.aclose()
    async with http.get(f"{w.url}/v1/next/__snowflake%2Fnext") as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "bad_name"
    async with http.post(f"{w.url}/v1/set/__snowflake/next", json={"value": 5}) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "bad_name"


async def test_worker_uses_the_members_configuration(
        cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, http: aiohttp.ClientSession) -> None:
    """--cluster naming some of the members is enough: the worker takes the member list (and the
    cluster id, the configuration epoch) from them (seq.membership)."""
    w = LocalWorker(cluster.addrs[:2], str(tmp_path_factory.mktemp("partial") / "w.log"))
    w.start()
    try:
        await w.wait_ready(http)
        assert f"members {','.join(sorted(cluster.addrs))}" in w.output()
        status, _ = await _next(http, w)
        assert status == 200
    finally:
        w.stop()
