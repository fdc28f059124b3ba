"""juggler through a run of real Redis faults, one after the other: added
latency (200 ms each way), Redis paused (SIGSTOP: connections hang, nothing
answers), Redis unreachable (connecting refused), then every connection
reset as soon as it is used. A server and
its callees reach Redis through a fault proxy; closed-loop callers, a
publisher and a subscriber of a channel with history talk to the server
throughout. What must hold at the end:

- every ACKed call got exactly one RES (its result, never another's, or the
  timeout error RES) by its timeout plus a small bound;
- a call NACKed with a code other than 504 got no RES: it was not queued;
- a PUB NACKed with a code other than 504 was not published, and every ACKed
  one reached the subscriber once, in order (the gaps read from history);
- the broker's connections were retried at a growing interval through the
  resets, with a bounded number of warning lines (no reconnect storm);
- calls work again soon after the last fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

import pytest

from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.callee import Callee, make_test_app
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import ACK, EVNT, NACK, RES, Client, connect, new_uuid
from juggler.config import ServerConfig
from juggler.errors import JugglerError
from juggler.server import Server
from tests.faultproxy import FaultProxy
from tests.netutil import start_redis, wait_until

pytestmark = pytest.mark.timeout(60)

CALL_TIMEOUT = 2.0
#: how late after its timeout an ACKed call's last chance of a RES may come (the
#: server's expiry sweep, about a second, and scheduling on a busy machine)
RES_BOUND = 2.5


class Frames:
    """Every message one client connection received, with the time it came."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.seen: list[tuple[float, dict[str, Any]]] = []

    def __call__(self, msg: dict[str, Any], _raw: str) -> None:
        self.seen.append((self.loop.time(), msg))

    def of(self, kind: int) -> dict[str, list[tuple[float, dict[str, Any]]]]:
        out: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        for t, m in self.seen:
            if m["meta"]["type"] == kind and "for" in m["payload"]:
                out.setdefault(m["payload"]["for"], []).append((t, m))
        return out


async def caller(c: Client, name: str, sent: dict[str, str], stop: asyncio.Event) -> None:
    """Calls test.echo in a loop, one at a time; pauses a little after a failure
    (as a client that retries does), so that it does not spin on NACKs."""
    k = 0
    while not stop.is_set():
        msg_uuid, arg = new_uuid(), f"{name}-{k}"
        sent[msg_uuid] = arg
        k += 1
        try:
            await c.call("test.echo", arg, timeout=CALL_TIMEOUT, msg_uuid=msg_uuid)
        except JugglerError:
            await asyncio.sleep(0.05)


async def publisher(c: Client, outcomes: dict[int, int | None], stop: asyncio.Event) -> None:
    """PUBs {"n": k} to h.news in a loop; `outcomes[k]` is None (ACKed) or the NACK code."""
    k = 0
    while not stop.is_set():
        try:
            await c.pub("h.news", {"n": k}, timeout=5.0)
            outcomes[k] = None
        except JugglerError as exc:
            outcomes[k] = getattr(exc, "code", -1)
            await asyncio.sleep(0.05)
        except TimeoutError:
            outcomes[k] = -1  # no answer: unknown, as a 504
        k += 1
        await asyncio.sleep(0.02)


async def test_calls_and_pubs_through_latency_a_paused_redis_and_resets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="juggler")
    redis = start_redis()
    try:
        async with FaultProxy(redis.port) as proxy:
            url = f"redis://127.0.0.1:{proxy.port}/0"
            opts = {"url": url, "command_timeout": 1.0, "connect_timeout": 1.0, "block_timeout": 0.5}
            broker = RedisBroker(RedisBrokerConfig(**opts))  # type: ignore[arg-type]
            callee_broker = RedisBroker(RedisBrokerConfig(**opts))  # type: ignore[arg-type]
            await broker.start()
            await callee_broker.start()
            server = Server(broker, ServerConfig(port=0),
                            channels=ChannelRules([ChannelOptions(match="h.*", history_size=1000, history_ttl=60)]))
            callee = Callee(callee_broker, make_test_app(4), workers=20)
            await server.start()
            await callee.start()
            stop = asyncio.Event()
            try:
                await run_faults(server, proxy, redis.proc.pid, stop)
                # one line per kind of trouble every 10 s, not one per attempt
                lines = [r for r in caplog.records if r.name.startswith("juggler.broker")]
                assert len(lines) < 60, [r.getMessage() for r in lines]
            finally:
                stop.set()
                await server.aclose()
                await callee.drain(timeout=5)
                await callee.aclose()
                await callee_broker.aclose()
                await broker.aclose()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(redis.proc.pid, signal.SIGCONT)
        redis.stop()


async def run_faults(server: Server, proxy: FaultProxy, redis_pid: int, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    call_frames = [Frames() for _ in range(6)]
    pub_frames, sub_frames = Frames(), Frames()
    async with contextlib.AsyncExitStack() as clients:
        callers = [await clients.enter_async_context(connect(server.url, on_message=f)) for f in call_frames]
        pub = await clients.enter_async_context(connect(server.url, on_message=pub_frames))
        sub = await clients.enter_async_context(connect(server.url, on_message=sub_frames))
        assert await callers[0].call("test.echo", "warm", timeout=10) == "warm"
        await sub.sub("h.news")
        sent: dict[str, str] = {}
        published: dict[int, int | None] = {}
        tasks = [asyncio.ensure_future(caller(c, f"c{i}", sent, stop)) for i, c in enumerate(callers)]
        tasks.append(asyncio.ensure_future(publisher(pub, published, stop)))
        try:
            await asyncio.sleep(0.5)  # traffic before the faults: a window of time is the point
            proxy.latency(0.2, 0.2)
            await asyncio.sleep(2.0)
            proxy.latency(0.0, 0.0)
            os.kill(redis_pid, signal.SIGSTOP)
            await asyncio.sleep(3.0)
            os.kill(redis_pid, signal.SIGCONT)
            await proxy.unreachable(True)
            await asyncio.sleep(2.0)
            await proxy.unreachable(False)
            reconnects = server.broker._fanout.reconnects  # type: ignore[attr-defined]
            accepted = proxy.accepted
            proxy.resetting(True)
            await asyncio.sleep(3.0)
            proxy.resetting(False)
            # 50 ms doubling to 2 s while every connection drops at once: a handful, not thousands
            assert server.broker._fanout.reconnects - reconnects <= 12  # type: ignore[attr-defined]
            assert proxy.accepted - accepted < 300, proxy.accepted - accepted
            healed = loop.time()
            fresh = await clients.enter_async_context(connect(server.url))

            async def answers() -> bool:
                with contextlib.suppress(JugglerError):
                    return await fresh.call("test.echo", "back", timeout=1.0) == "back"
                return False

            while not await answers():
                assert loop.time() - healed < 15.0, "calls did not come back after the faults"
        finally:
            stop.set()
            await asyncio.wait(tasks, timeout=CALL_TIMEOUT + 6)
        # the last calls' RES (or error RES) come by their timeout plus the bound
        await asyncio.sleep(0)
        acked = {u: fs[0][0] for f in call_frames for u, fs in f.of(ACK).items() if u in sent}
        ress = {u: fs for f in call_frames for u, fs in f.of(RES).items()}
        await wait_until(lambda: all(u in ress or any(u in f.of(RES) for f in call_frames) for u in acked),
                         timeout=CALL_TIMEOUT + RES_BOUND + 2, what="a RES for every ACKed call")
        ress = {u: fs for f in call_frames for u, fs in f.of(RES).items()}
        nacked = {u: fs[0][1]["payload"]["code"] for f in call_frames for u, fs in f.of(NACK).items() if u in sent}
        assert len(acked) > 20, "too few calls ACKed to say anything"
        for u, at in acked.items():
            got = ress[u]
            assert len(got) == 1, f"call {u} got {len(got)} RES"
            t, res = got[0]
            assert t - at <= CALL_TIMEOUT + RES_BOUND, f"call {u}: RES {t - at:.2f}s after its ACK"
            args = res["payload"]["args"]
            assert args == sent[u] or "error" in args, (u, sent[u], args)
        for u, code in nacked.items():
            if code != 504:
                assert u not in ress, f"call {u} NACKed {code} and still answered"
        assert {500, 504} <= set(nacked.values()), "the faults were not seen: refusals (500) and losses (504)"
        # PUBs: a NACK other than 504 means not published; every ACKed one arrives, once, in order
        acked_pubs = sorted(k for k, code in published.items() if code is None)
        not_published = {k for k, code in published.items() if code not in (None, 504, -1)}

        def delivered() -> list[int]:
            return [m["payload"]["args"]["n"] for _, m in sub_frames.seen
                    if m["meta"]["type"] == EVNT and isinstance(m["payload"].get("args"), dict)]

        await wait_until(lambda: set(acked_pubs) <= set(delivered()), timeout=10,
                         what="every ACKed PUB delivered (the gaps read from history)")
        got = delivered()
        assert got == sorted(set(got)), "an event twice or out of order"
        assert not (set(got) & not_published), sorted(set(got) & not_published)
