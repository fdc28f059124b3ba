"""Prometheus exposition of the server counters, served over HTTP."""

from __future__ import annotations

import urllib.request

from prometheus_client.registry import CollectorRegistry

from juggler.broker.memory import MemoryBroker
from juggler.metrics import ServerStats, StatsCollector, broker_source, serve_metrics


def test_metrics_endpoint() -> None:
    stats = ServerStats()
    stats.read[1] = 7
    stats.written[8] = 7
    stats.connections_active = 2
    stats.calls = 7
    broker = MemoryBroker()
    broker.stats.expired_calls = 3
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats, broker_source(broker)))
    server = serve_metrics(registry, 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        server.close()
    assert 'juggler_messages_read_total{type="CALL"} 7.0' in text
    assert 'juggler_messages_written_total{type="ACK"} 7.0' in text
    assert "juggler_connections_active 2.0" in text
    assert "juggler_calls_total 7.0" in text
    assert "juggler_expired_calls_total 3.0" in text
    for name in ("results", "expired_results", "events", "slow_messages", "recovered", "connections"):
        assert f"juggler_{name}_total" in text
