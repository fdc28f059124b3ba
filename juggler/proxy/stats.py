"""Counters of each proxy and their Prometheus exposition.

The request path only bumps plain numbers on a :class:`ProxyStats`; the
collector builds the metric families at scrape time (as
:mod:`juggler.metrics` does for the server):

| metric | type | what |
| --- | --- | --- |
| ``juggler_proxy_calls_total{kind,name}`` | counter | questions put to the backend |
| ``juggler_proxy_refusals_total{kind,name}`` | counter | answers that refused |
| ``juggler_proxy_errors_total{kind,name,error}`` | counter | no usable answer: ``unavailable``, ``timeout``, ``bad_answer`` |
| ``juggler_proxy_duration_seconds{kind,name}`` | histogram | time to the answer (or the error) |
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BUCKETS", "ProxyCollector", "ProxyStats"]

#: upper bounds (s) of the latency histogram's buckets
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class ProxyStats:
    """What one proxy did; read any time from the loop thread."""

    kind: str
    name: str
    calls: int = 0
    refusals: int = 0
    #: by error label (juggler.proxy.errors: unavailable, timeout, bad_answer)
    errors: dict[str, int] = field(default_factory=dict)
    #: answers per bucket of BUCKETS (not cumulative), the last one past the largest bound
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    seconds: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.seconds += seconds

    def error(self, label: str) -> None:
        self.errors[label] = self.errors.get(label, 0) + 1


class ProxyCollector(Collector):
    """Exposes the stats of every proxy of a set (``stats()`` gives them at scrape time)."""

    def __init__(self, stats: Callable[[], Iterable[ProxyStats]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        labels = ["kind", "name"]
        calls = CounterMetricFamily("juggler_proxy_calls", "Questions put to the application's backend", labels=labels)
        refusals = CounterMetricFamily("juggler_proxy_refusals", "Backend answers that refused", labels=labels)
        errors = CounterMetricFamily("juggler_proxy_errors", "Questions without a usable answer, by error",
                                     labels=[*labels, "error"])
        hist = HistogramMetricFamily("juggler_proxy_duration_seconds", "Time to the backend's answer",
                                     labels=labels)
        for s in self.stats():
            key = [s.kind, s.name]
            calls.add_metric(key, s.calls)
            refusals.add_metric(key, s.refusals)
            for label in ("unavailable", "timeout", "bad_answer"):
                errors.add_metric([*key, label], s.errors.get(label, 0))
            cumulative, buckets = 0, []
            for bound, n in zip((*BUCKETS, float("inf")), s.counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            hist.add_metric(key, buckets, s.seconds)
        yield calls
        yield refusals
        yield errors
        yield hist
