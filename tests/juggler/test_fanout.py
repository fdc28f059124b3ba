"""`juggler load --mode fanout` against real servers: every published event
reaches every subscriber once, in order (counts reconcile; no timing
assertions), on the in-memory broker and through Redis."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from jugglerprocs import ROOT, juggler, juggler_up

from juggler.fanout import FanoutConfig, run_fanout

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with juggler_up() as u:
        yield u


def test_config_validation() -> None:
    for bad in ({"subscribers": 0}, {"rate": 0}, {"duration": 0}, {"payload_bytes": -1}, {"procs": 0},
                {"url": "http://x"}):
        with pytest.raises(ValueError):
            FanoutConfig(**bad)  # type: ignore[arg-type]


def test_every_event_reaches_every_subscriber(url: str) -> None:
    report = run_fanout(FanoutConfig(url=url, subscribers=30, rate=40, duration=1.5, payload_bytes=50,
                                     channel="fanout.test", settle=2.0))
    assert report.published >= 40 and not report.error_messages
    assert report.expected == report.published * 30
    assert report.delivered == report.expected and report.lost == 0
    assert report.duplicates == 0 and report.out_of_order == 0
    assert report.latency_ms["max"] >= report.latency_ms["min"] >= 0


def test_cli_two_procs_json(url: str) -> None:
    out = subprocess.run(
        [*juggler(), "load", "--mode", "fanout", "--url", url, "--subscribers", "20", "--rate", "20", "-d", "1",
         "--procs", "2", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=90,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["config"]["procs"] == 2
    assert report["delivered"] == report["published"] * 20 and report["lost"] == 0
    bad = subprocess.run([*juggler(), "load", "--mode", "fanout", "--url", url, "--subscribers", "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert bad.returncode == 2 and "subscribers" in bad.stderr


async def test_through_redis(redis_url: str) -> None:
    import asyncio

    from tests.juggler.stacks import redis_stack

    async with redis_stack(url=redis_url) as server:
        report = await asyncio.to_thread(run_fanout, FanoutConfig(
            url=server.url, subscribers=20, rate=30, duration=1.0, settle=2.0, channel="fanout.redis"))
    assert report.published >= 30 and report.lost == 0 and report.duplicates == 0
    assert report.delivered == report.published * 20


async def test_subscribers_answer_keepalive_pings() -> None:
    """The native subscribers and the publisher answer the server's pings:
    a run many ping intervals long loses no subscriber to the keepalive."""
    import asyncio

    from juggler.broker.memory import MemoryBroker
    from juggler.config import ServerConfig
    from juggler.server import Server

    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, ping_interval=0.05, pong_timeout=0.5))
    try:
        await server.start()
        report = await asyncio.to_thread(run_fanout, FanoutConfig(
            url=server.url, subscribers=10, rate=20, duration=2.0, settle=2.0, channel="fanout.pinged"))
        assert not report.error_messages and report.lost == 0
        assert report.delivered == report.published * 10
        assert "ping_timeout" not in server.stats.closed
    finally:
        await server.aclose()
        await broker.aclose()
