"""Server counters and their Prometheus exposition.

The hot path only increments plain integers on a :class:`ServerStats`; a
custom collector turns them into Prometheus metrics at scrape time, so a
message costs no lock and no label lookup. Metrics equivalent to the
original's expvar counters:

| metric | type | what |
| --- | --- | --- |
| ``juggler_messages_read_total{type}`` | counter | client messages read, by type |
| ``juggler_messages_written_total{type}`` | counter | server messages written, by type |
| ``juggler_connections_active`` | gauge | websocket connections open now |
| ``juggler_connections_total`` | counter | connections accepted |
| ``juggler_calls_total`` | counter | CALLs queued (ACKed) |
| ``juggler_results_total`` | counter | RES sent |
| ``juggler_expired_calls_total`` | counter | calls popped after their TTL (dropped) |
| ``juggler_expired_results_total`` | counter | results popped after their TTL, or for no live call |
| ``juggler_calls_timed_out_total`` | counter | calls answered with an error RES: no result by their timeout |
| ``juggler_redis_checks_unknown_total`` | counter | calls/results popped whose pop check's reply was lost (handed on, not dropped) |
| ``juggler_events_total`` | counter | EVNT sent |
| ``juggler_publishes_total`` | counter | PUBs published |
| ``juggler_nacks_total`` | counter | NACKs sent (broker errors, middleware refusals) |
| ``juggler_slow_messages_total`` | counter | messages over the slow threshold |
| ``juggler_recovered_total`` | counter | handler exceptions recovered (connection closed) |
| ``juggler_protocol_errors_total`` | counter | connections closed for bad input |
| ``juggler_history_recoveries_total{outcome}`` | counter | SUBs with ``since``: ``recovered`` or ``not_recovered`` |
| ``juggler_history_gaps_total{outcome}`` | counter | gaps in live events: ``filled`` from history, or ``lost`` (notice sent) |
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from juggler.extensions import TYPE_NAMES as EXTENSION_NAMES
from juggler.protocol import TYPE_NAMES

__all__ = ["MetricsServer", "ServerStats", "StatsCollector", "serve_metrics"]


@dataclass(slots=True)
class ServerStats:
    """Plain counters; read any time (from the loop thread)."""

    read: list[int] = field(default_factory=lambda: [0] * 11)  # by type (index = type)
    written: list[int] = field(default_factory=lambda: [0] * 11)
    #: extension messages (juggler.extensions, types 256 and above) read and written, by type
    extensions_read: dict[int, int] = field(default_factory=dict)
    extensions_written: dict[int, int] = field(default_factory=dict)
    connections_active: int = 0
    connections_total: int = 0
    calls: int = 0
    results: int = 0
    expired_results: int = 0  # results with no live call left here (late, or its conn closed)
    calls_timed_out: int = 0  # calls answered with an error RES: no result by their timeout
    events: int = 0
    publishes: int = 0
    nacks: int = 0
    slow_messages: int = 0
    recovered: int = 0
    protocol_errors: int = 0
    rejections: dict[str, int] = field(default_factory=dict)  # refusals by reason (juggler.limits.REASONS)
    closed: dict[str, int] = field(default_factory=dict)  # connections closed, by reason
    recoveries: dict[str, int] = field(default_factory=dict)  # SUBs with since, by outcome
    history_gaps: dict[str, int] = field(default_factory=dict)  # live gaps, by outcome (filled / lost)

    def wrote(self, msg_type: int) -> None:
        """One server message written: juggler.0's by type, extension messages apart."""
        try:
            self.written[msg_type] += 1
        except IndexError:
            ext = self.extensions_written
            ext[msg_type] = ext.get(msg_type, 0) + 1


class StatsCollector(Collector):
    """Exposes a ServerStats plus the broker's (and callee's) expiry counters."""

    def __init__(self, stats: ServerStats, *sources: Callable[[], dict[str, int]],
                 gauges: Callable[[], dict[str, tuple[str, float]]] | None = None) -> None:
        self.stats = stats
        self.sources = sources
        self.gauges = gauges

    def collect(self) -> Iterator[Any]:
        s = self.stats
        extra: dict[str, int] = {}
        for src in self.sources:
            try:
                for k, v in src().items():
                    extra[k] = extra.get(k, 0) + v
            except Exception:  # a scrape must never fail because of one source
                pass
        read = CounterMetricFamily("juggler_messages_read", "Client messages read, by type", labels=["type"])
        written = CounterMetricFamily("juggler_messages_written", "Server messages written, by type", labels=["type"])
        for t, name in TYPE_NAMES.items():
            if t <= 4:
                read.add_metric([name], s.read[t])
            else:
                written.add_metric([name], s.written[t])
        for counts, family in ((s.extensions_read, read), (s.extensions_written, written)):
            for t, n in sorted(counts.items()):
                family.add_metric([EXTENSION_NAMES.get(t, str(t))], n)
        yield read
        yield written
        yield GaugeMetricFamily("juggler_connections_active", "Open websocket connections", value=s.connections_active)
        yield CounterMetricFamily("juggler_connections", "Websocket connections accepted", value=s.connections_total)
        yield CounterMetricFamily("juggler_calls", "CALLs queued (ACKed)", value=s.calls)
        yield CounterMetricFamily("juggler_results", "RES messages sent", value=s.results)
        yield CounterMetricFamily(
            "juggler_expired_calls", "Calls dropped because their TTL ran out", value=extra.get("expired_calls", 0)
        )
        yield CounterMetricFamily(
            "juggler_expired_results", "Results dropped because their TTL ran out or no call waits for them",
            value=s.expired_results + extra.get("expired_results", 0),
        )
        yield CounterMetricFamily("juggler_calls_timed_out", "Calls answered with an error RES: no result by "
                                  "their timeout", value=s.calls_timed_out)
        yield CounterMetricFamily("juggler_redis_checks_unknown", "Calls and results popped whose pop check's "
                                  "reply was lost (handed on, not dropped)", value=extra.get("checks_unknown", 0))
        yield CounterMetricFamily("juggler_events", "EVNT messages sent", value=s.events)
        yield CounterMetricFamily("juggler_publishes", "PUB messages published", value=s.publishes)
        yield CounterMetricFamily("juggler_nacks", "NACK messages sent", value=s.nacks)
        yield CounterMetricFamily("juggler_slow_messages", "Messages slower than the threshold", value=s.slow_messages)
        yield CounterMetricFamily("juggler_recovered", "Handler exceptions recovered", value=s.recovered)
        yield CounterMetricFamily(
            "juggler_protocol_errors", "Connections closed for bad input", value=s.protocol_errors
        )
        rej = CounterMetricFamily("juggler_rejections", "Handshakes, messages and connections refused, by reason",
                                  labels=["reason"])
        for reason, n in sorted(dict(s.rejections).items()):
            rej.add_metric([reason], n)
        yield rej
        closed = CounterMetricFamily("juggler_connections_closed", "Connections closed, by reason",
                                     labels=["reason"])
        for reason, n in sorted(dict(s.closed).items()):
            closed.add_metric([reason], n)
        yield closed
        for name, help_text, counts in (
            ("juggler_history_recoveries", "SUBs that asked to recover (since), by outcome", s.recoveries),
            ("juggler_history_gaps", "Gaps in live events of channels with history, by outcome", s.history_gaps),
        ):
            family = CounterMetricFamily(name, help_text, labels=["outcome"])
            for outcome, n in sorted(dict(counts).items()):
                family.add_metric([outcome], n)
            yield family
        for k, v in extra.items():
            if k.startswith("redis_"):
                yield CounterMetricFamily(f"juggler_{k}", f"Redis broker: {k[6:].replace('_', ' ')}", value=v)
        if self.gauges is not None:
            try:
                values = self.gauges()
            except Exception:
                values = {}
            for name, (doc, v) in values.items():
                yield GaugeMetricFamily(name, doc, value=v)


def server_gauges(server: Any) -> Callable[[], dict[str, tuple[str, float]]]:
    """Queue depths of a server, computed at scrape time (the scrape runs on
    another thread: it reads snapshots, never mutates)."""

    def read() -> dict[str, tuple[str, float]]:
        conns = list(server.conns)
        inbox = 0
        wbuf = 0
        for c in conns:
            inbox += c.queued
            t = c.transport
            if t is not None:
                try:
                    wbuf += t.get_write_buffer_size()
                except Exception:
                    pass
        out = {
            "juggler_pending_calls": ("Calls ACKed and waiting for their result", float(server.pending_calls)),
            "juggler_inbox_messages": ("Messages queued in connections (incoming and outgoing)", float(inbox)),
            "juggler_write_buffer_bytes": ("Bytes written and not yet sent, all connections", float(wbuf)),
            "juggler_tcp_connections": ("TCP connections (handshaking included)", float(len(conns))),
            "juggler_draining": ("1 while the server drains at shutdown", 1.0 if server.draining else 0.0),
        }
        for name, b in (("rpc", server.broker), ("pubsub", server.pubsub)):
            router = getattr(b, "router", None)
            if router is not None and (name == "rpc" or server.pubsub is not server.broker):
                out[f"juggler_redis_{name}_connections"] = (
                    f"Redis command connections of the {name} broker", float(router.connections))
        return out

    return read


def broker_source(broker: Any) -> Callable[[], dict[str, int]]:
    """Expiry counters of a broker (anything with ``stats.expired_calls/results``)."""

    def read() -> dict[str, int]:
        st = getattr(broker, "stats", None)
        out = {
            "expired_calls": int(getattr(st, "expired_calls", 0)),
            "expired_results": int(getattr(st, "expired_results", 0)),
            "checks_unknown": int(getattr(st, "checks_unknown", 0)),
        }
        router = getattr(broker, "router", None)
        if router is not None and getattr(router, "cluster", False):
            out["redis_cluster_refreshes"] = router.refreshes
            out["redis_cluster_redirects"] = router.redirects
            out["redis_cluster_retries"] = router.retries
        return out

    return read


def callee_source(callee: Any) -> Callable[[], dict[str, int]]:
    """Calls a callee skipped or whose result it dropped (TTL ran out)."""

    def read() -> dict[str, int]:
        return {"expired_calls": int(getattr(getattr(callee, "stats", None), "expired", 0))}

    return read


class MetricsServer:
    """A Prometheus ``/metrics`` endpoint on its own thread; ``close()`` stops it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` on http://host:port/metrics (port 0 picks a free one)."""
    from prometheus_client.exposition import start_http_server

    from rustext.net import listen_error

    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise listen_error(host, port, exc) from exc
    return MetricsServer(server, thread)
