"""Prometheus metrics of one member (``juggler seq server --metrics-port``, and
``GET /metrics`` on the ``--http`` listener).

Collectors read the member's counters at scrape time (own registry, no
global state); the ``--metrics-port`` endpoint runs on prometheus_client's
thread, ``/metrics`` on the loop.

Per-name series (``seq_name_*``, label ``name``) cover the ranges this
member served to clients (gRPC and HTTP). They are bounded by
``--metrics-max-names``: the first names served get series of their own,
every later one is added to the series labelled ``_other`` (see
:mod:`seq.namestats`), so a scrape holds at most that many + 1 series per
metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from seq.namestats import OTHER, NameStats


class Member(Protocol):
    """What the metrics read of a member (:class:`seq.server.RRServer`), which
    itself serves them: a protocol, so that this module imports nothing of it."""

    names: NameStats

    @property
    def stats(self) -> Any: ...

    @property
    def store(self) -> Any: ...

    @property
    def state(self) -> str: ...

    @property
    def refused(self) -> int: ...


class _Collector(Collector):
    def __init__(self, server: Member) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        s = self._server.stats
        store = self._server.store
        rounds = CounterMetricFamily("seq_rounds", "Quorum rounds by outcome", labels=["result"])
        rounds.add_metric(["won"], s.rounds_won)
        rounds.add_metric(["conflict"], s.rounds_conflict)
        rounds.add_metric(["no_quorum"], s.rounds_no_quorum)
        yield rounds
        yield CounterMetricFamily("seq_requests", "NextID requests coordinated here", value=s.requests)
        yield CounterMetricFamily("seq_requests_expired", "Requests that hit their deadline", value=s.requests_expired)
        yield CounterMetricFamily("seq_requests_refused", "NextID calls refused at once with RESOURCE_EXHAUSTED "
                                  "(more than max_pending waiting)", value=self._server.refused)
        yield CounterMetricFamily("seq_ids_issued", "IDs in ranges won here", value=s.ids_issued)
        yield CounterMetricFamily("seq_forwarded", "Batches served by the preferred member", value=s.forwarded)
        yield CounterMetricFamily("seq_forward_failures", "Forwards that failed", value=s.forward_failures)
        yield CounterMetricFamily("seq_store_fsyncs", "Log batches written and fsync'd", value=store.fsyncs)
        yield CounterMetricFamily("seq_store_writes", "Entries written to the log", value=store.writes)
        yield GaugeMetricFamily("seq_round_max_attempts", "Most attempts one round needed", value=s.max_attempts)
        yield GaugeMetricFamily("seq_ready", "1 when this member votes", value=1 if self._server.state == "ready" else 0)
        yield GaugeMetricFamily("seq_names", "Sequences this member holds", value=len(store))


class _NameCollector(Collector):
    """The ``seq_name_*`` series (bounded, see the module doc)."""

    def __init__(self, server: Member, names: NameStats) -> None:
        self._server = server
        self._names = names

    def collect(self) -> Iterator[Any]:
        tracked, other, other_names = self._names.tracked()
        now = self._names.clock()
        store = self._server.store
        ranges = CounterMetricFamily("seq_name_ranges_served", "Ranges this member served, by name",
                                     labels=["name"])
        ids = CounterMetricFamily("seq_name_ids_served", "IDs this member served, by name", labels=["name"])
        last = GaugeMetricFamily("seq_name_last_served_timestamp_seconds",
                                 "Unix time of the last range this member served, by name", labels=["name"])
        rate = GaugeMetricFamily("seq_name_rate_ids_per_second",
                                 "IDs/s this member served over about the last minute, by name", labels=["name"])
        value = GaugeMetricFamily("seq_name_value", "This member's high-water mark (the next ID), by name; "
                                  "none for the _other aggregate", labels=["name"])
        rows = list(tracked)
        if other is not None:
            rows.append((OTHER, other))
        for name, f in rows:
            ranges.add_metric([name], f.ranges)
            ids.add_metric([name], f.ids)
            if f.last_wall is not None:
                last.add_metric([name], f.last_wall)
            rate.add_metric([name], f.rate(now))
        for name, _ in tracked:
            value.add_metric([name], store.get(name))
        yield ranges
        yield ids
        yield last
        yield rate
        yield value
        yield GaugeMetricFamily("seq_name_other_names", "Names counted under name=\"_other\" "
                                "(beyond --metrics-max-names)", value=other_names)


def member_registry(server: Member, names: NameStats | None = None) -> CollectorRegistry:
    """A registry of the member's metrics (per name too when `names` is given)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Collector(server))
    if names is not None:
        registry.register(_NameCollector(server, names))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The exposition text of `registry` and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve_metrics(server: Member, port: int, addr: str = "127.0.0.1") -> Any:
    """Start the endpoint; returns the WSGI server (call ``shutdown()`` to stop it)."""
    httpd, _thread = start_http_server(port, addr=addr, registry=member_registry(server, server.names))
    return httpd
