"""Prometheus metrics and access logging through the dispatcher."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rpc.examples import Arith
from rpc.message import Message
from rpc.plugins import AccessLogPlugin, MetricsPlugin, PluginContainer
from rpc.service import Context, Peer, ServiceDispatcher


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float:
    value = reg.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_requests_errors_latency_in_flight_connections() -> None:
    reg = CollectorRegistry()
    metrics = MetricsPlugin(reg)
    seen_in_flight: list[float] = []

    class Probe:
        async def Look(self, ctx: Context, args: Any) -> None:
            seen_in_flight.append(sample(reg, "rpc_server_in_flight"))

    d = ServiceDispatcher(plugins=PluginContainer([metrics]))
    d.registry.register(Arith(), "Arith")
    d.registry.register(Probe())
    s = d.session(Peer())
    await s.accept()
    assert sample(reg, "rpc_server_connections") == 1
    for payload in (b'{"A":1,"B":2}', b'{"A":3,"B":4}', b'{"A":"x"}', b"{bad"):
        await s.handle(Message(service_path="Arith", service_method="Mul", payload=payload))
    await s.handle(Message(service_path="Probe", service_method="Look", payload=b"null"))
    labels = {"service": "Arith", "method": "Mul"}
    assert sample(reg, "rpc_server_requests_total", **labels) == 4
    assert sample(reg, "rpc_server_errors_total", **labels) == 2
    assert sample(reg, "rpc_server_request_duration_seconds_count", **labels) == 4
    assert seen_in_flight == [1.0]
    assert sample(reg, "rpc_server_in_flight") == 0  # also after the decode failure
    await s.close()
    assert sample(reg, "rpc_server_connections") == 0
    assert b"rpc_server_request_duration_seconds_bucket" in metrics.exposition()
    await d.aclose()


async def test_access_log(caplog: pytest.LogCaptureFixture) -> None:
    d = ServiceDispatcher(plugins=PluginContainer([AccessLogPlugin()]))
    d.registry.register(Arith(), "Arith")
    with caplog.at_level(logging.INFO, logger="rpc.access"):
        await d.dispatch(Message(service_path="Arith", service_method="Add", seq=4, payload=b'{"A":1,"B":2}'),
                         Peer(address="1.2.3.4:5"))
        await d.dispatch(Message(service_path="Arith", service_method="Add", seq=5, payload=b'{"A":true}'))
    lines = [r.getMessage() for r in caplog.records if r.name == "rpc.access"]
    assert lines[0].startswith("1.2.3.4:5 Arith.Add seq=4 ok ")
    assert "seq=5 error=" in lines[1] and "A must be an integer" in lines[1]
    await d.aclose()
