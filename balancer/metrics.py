"""Prometheus metrics of the data plane, through prometheus-client's collector
API (as juggler, rpc and seq expose theirs): :class:`BalancerCollector` reads
``rustext.Balancer.stats()`` at scrape time; :func:`exposition` renders a
registry holding it in the text format."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["CONTENT_TYPE_LATEST", "BalancerCollector", "exposition", "registry_for"]

STATES = ("up", "down", "drain", "ejected")


class BalancerCollector(Collector):
    """The balancer's counters, gauges and latency histogram, from ``stats()``."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield CounterMetricFamily("balancer_connections", "Client connections accepted.", value=s["connections_total"])
        yield GaugeMetricFamily("balancer_connections_active", "Client connections open.", value=s["connections_active"])
        yield CounterMetricFamily("balancer_requests", "Client requests received.", value=s["requests"])
        responses = CounterMetricFamily("balancer_responses", "Responses sent to clients by status class.",
                                        labels=["class"])
        for cls, n in s["responses"].items():
            responses.add_metric([cls], n)
        yield responses
        yield CounterMetricFamily("balancer_request_bytes", "Request body bytes from clients.", value=s["bytes_in"])
        yield CounterMetricFamily("balancer_response_bytes", "Response body bytes to clients.", value=s["bytes_out"])
        yield CounterMetricFamily("balancer_retries", "Requests retried on another backend.", value=s["retries"])
        yield CounterMetricFamily("balancer_no_backend", "Requests answered 503 (no backend).", value=s["no_backend"])
        yield CounterMetricFamily("balancer_backend_errors", "Requests answered 502.", value=s["backend_errors"])
        yield CounterMetricFamily("balancer_timeouts", "Backend timeouts (504 or cut body).", value=s["timeouts"])
        yield CounterMetricFamily("balancer_rate_limited", "Requests refused by the rate limit (429).",
                                  value=s.get("rate_limited", 0))
        yield CounterMetricFamily("balancer_rate_delayed", "Requests held back by a rate limit in delay mode, "
                                  "then sent on.", value=s.get("rate_delayed", 0))
        yield CounterMetricFamily("balancer_compressed_responses", "Responses compressed (gzip, br or zstd).",
                                  value=s.get("compressed", 0))
        yield CounterMetricFamily("balancer_compress_in_bytes", "Body bytes of compressed responses, before.",
                                  value=s.get("compress_bytes_in", 0))
        yield CounterMetricFamily("balancer_compress_out_bytes", "Body bytes of compressed responses, after.",
                                  value=s.get("compress_bytes_out", 0))
        yield CounterMetricFamily("balancer_access_log_lines", "Access log lines written.",
                                  value=s.get("access_log_lines", 0))
        yield CounterMetricFamily("balancer_access_log_dropped",
                                  "Access log lines dropped because the writer fell behind.",
                                  value=s.get("access_log_dropped", 0))
        yield CounterMetricFamily("balancer_proxy_refused",
                                  "Connections closed on an accept_proxy listener: PROXY header missing, invalid or late.",
                                  value=s.get("proxy_refused", 0))

        buckets, cum = [], 0
        for bound, n in zip([*s["latency_bounds"], "+Inf"], s["latency_buckets"], strict=True):
            cum += n
            buckets.append((str(bound), cum))
        yield HistogramMetricFamily("balancer_request_duration_seconds",
                                    "Time to the response head, as seen by the balancer.",
                                    buckets=buckets, sum_value=s["latency_sum"])

        backends = s.get("backends", [])
        state = GaugeMetricFamily("balancer_backend_state", "Backend state (1 for the current one).",
                                  labels=["backend", "pool", "state"])
        for b in backends:
            for st in STATES:
                state.add_metric([b["name"], b.get("pool", ""), st], int(b["state"] == st))
        yield state
        for key, family, name, help_ in (
            ("weight", GaugeMetricFamily, "balancer_backend_weight", "Backend weight."),
            ("active", GaugeMetricFamily, "balancer_backend_active", "Requests in flight to the backend."),
            ("requests", CounterMetricFamily, "balancer_backend_requests", "Requests sent to the backend."),
            ("failures", CounterMetricFamily, "balancer_backend_failures",
             "Transport failures (connect, reset, timeout)."),
            ("ejections", CounterMetricFamily, "balancer_backend_ejections", "Passive ejections."),
            ("bytes_out", CounterMetricFamily, "balancer_backend_response_bytes",
             "Response body bytes from the backend."),
        ):
            m = family(name, help_, labels=["backend", "pool"])  # a server may be in several pools
            for b in backends:
                m.add_metric([b["name"], b.get("pool", "")], b[key])
            yield m
        by_class = CounterMetricFamily("balancer_backend_responses", "Backend responses by status class.",
                                       labels=["backend", "pool", "class"])
        for b in backends:
            for cls, n in b["responses"].items():
                by_class.add_metric([b["name"], b.get("pool", ""), cls], n)
        yield by_class

        dns = s.get("dns", {})  # backends given by name (balancer.discovery)
        for key, family, name, help_ in (
            ("resolutions", CounterMetricFamily, "balancer_dns_resolutions", "DNS resolutions of a backend name."),
            ("failures", CounterMetricFamily, "balancer_dns_failures",
             "Failed DNS resolutions of a backend name (the last good addresses were kept)."),
            ("addresses", GaugeMetricFamily, "balancer_dns_addresses", "Addresses in use for a backend name."),
        ):
            m = family(name, help_, labels=["name"])
            for n, d in dns.items():
                m.add_metric([n], d[key])
            yield m

        ocsp = s.get("ocsp", {})  # OCSP stapling per certificate file (balancer.ocsp)
        stapled = GaugeMetricFamily("balancer_ocsp_stapled", "1 when an OCSP response is stapled to the certificate.",
                                    labels=["certificate"])
        next_update = GaugeMetricFamily("balancer_ocsp_next_update_seconds",
                                        "Unix time the stapled OCSP response expires.", labels=["certificate"])
        failures = CounterMetricFamily("balancer_ocsp_fetch_failures",
                                       "OCSP responses that could not be fetched or were refused.",
                                       labels=["certificate"])
        for path, o in ocsp.items():
            stapled.add_metric([path], int(o["stapled"]))
            if o["stapled"] and o["next_update"] is not None:
                next_update.add_metric([path], o["next_update"])
            failures.add_metric([path], o["failures"])
        yield stapled
        yield next_update
        yield failures


def registry_for(stats: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry of its own (no global state) holding a :class:`BalancerCollector`."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(BalancerCollector(stats))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of ``registry``."""
    return generate_latest(registry)
