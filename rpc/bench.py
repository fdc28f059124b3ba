"""The benchmark client's engine (``juggler rpc bench``), like rpcx-benchmark's.

``C`` concurrent callers share ``N`` calls; each call's latency is recorded
(nanoseconds); the report gives TPS and mean / median / p99 / p99.9 / max /
min latency, plus the client's own CPU time (so that a client-bound run is
visible). Several worker processes (``processes``) split ``C`` and ``N`` so
that the client is not the bottleneck; their latencies are merged before
the percentiles are taken.

A target says what to call and through which caller::

    BenchTarget(address="http://127.0.0.1:8972", service="Hello", method="Say",
                serialize_type=SerializeType.PROTOBUF, payload=benchmark_request().SerializeToString())

The caller comes from ``rpc.callers`` by the address's scheme (``host:port``
/ ``tcp@`` / ``unix@`` rpcx protocol, ``http://`` gateway, ``grpc://``,
``inproc:`` examples in process); with a ``route`` (a registry), an XClient
picks among the registered servers for each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import resource
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rustext.interrupt import ignore_sigint, two_step_interrupt

from rpc.callers import open_caller
from rpc.message import Message, SerializeType

@dataclass(frozen=True)
class BenchTarget:
    address: str
    service: str
    method: str
    serialize_type: SerializeType
    payload: bytes
    pool: int = 10
    timeout: float | None = 10.0
    #: rpcx over TLS / how https:// is verified (``rustext.tls.ClientTls``; picklable, for client processes)
    tls: Any = None
    #: the block crypt of kcp@ addresses (``rpc.transport.kcpchannel.KcpOptions``; picklable)
    kcp: Any = None
    #: call through a registry (``rpc.discovery.url.RegistryRoute``) with an XClient instead of ``address``
    route: Any = None
    #: trace every call with OpenTelemetry (``rpc.tracing.TracingClientPlugin``): this sets up the
    #: tracer provider in each client process (picklable: a module-level function or a partial of one)
    #: and returns an object whose ``shutdown()`` exports what is left; None = no tracing
    setup_tracing: Callable[[], Any] | None = None


@dataclass
class BenchResult:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    elapsed: float = 0.0
    latencies_ns: array = field(default_factory=lambda: array("q"))
    cpu_user: float = 0.0
    cpu_sys: float = 0.0
    first_error: str | None = None
    started: float = 0.0  # wall clock (time.time()) of the first call, 0 = unknown
    ended: float = 0.0  # wall clock when the last call finished
    interrupted: bool = False  # stopped early (Ctrl-C): the figures cover what was sent

    @property
    def tps(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    def merge(self, other: BenchResult) -> None:
        self.sent += other.sent
        self.ok += other.ok
        self.errors += other.errors
        if self.started and other.started:
            # the window in which any process was calling: processes that did
            # not overlap must not look like parallel throughput
            self.started = min(self.started, other.started)
            self.ended = max(self.ended, other.ended)
            self.elapsed = self.ended - self.started
        else:
            self.started, self.ended = other.started, other.ended
            self.elapsed = max(self.elapsed, other.elapsed)
        self.latencies_ns.extend(other.latencies_ns)
        self.cpu_user += other.cpu_user
        self.cpu_sys += other.cpu_sys
        self.first_error = self.first_error or other.first_error
        self.interrupted = self.interrupted or other.interrupted

    def summary(self) -> dict[str, float]:
        """Latency statistics in nanoseconds (nearest-rank percentiles)."""
        values = sorted(self.latencies_ns)
        if not values:
            return {"mean": 0, "median": 0, "p99": 0, "p99.9": 0, "max": 0, "min": 0}
        return {
            "mean": sum(values) / len(values),
            "median": percentile(values, 50),
            "p99": percentile(values, 99),
            "p99.9": percentile(values, 99.9),
            "max": values[-1],
            "min": values[0],
        }


def percentile(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of an ascending list (``p`` in [0, 100])."""
    if not sorted_values:
        raise ValueError("no values")
    if not 0 <= p <= 100:
        raise ValueError("p must be in [0, 100]")
    rank = max(1, -(-len(sorted_values) * p // 100))  # ceil(n * p / 100), at least 1
    return sorted_values[int(rank) - 1]


def format_report(result: BenchResult, *, concurrency: int, processes: int = 1) -> str:
    s = result.summary()
    ms = {k: v / 1e6 for k, v in s.items()}
    cpu = result.cpu_user + result.cpu_sys
    lines = [
        f"took {result.elapsed * 1000:.0f} ms for {result.sent} requests "
        f"(concurrency {concurrency}, {processes} client process(es))"
        + (" (stopped early)" if result.interrupted else ""),
        f"sent     requests    : {result.sent}",
        f"received requests_OK : {result.ok}",
        f"errors               : {result.errors}" + (f" (first: {result.first_error})" if result.first_error else ""),
        f"throughput  (TPS)    : {result.tps:.0f}",
        "mean: {mean:.0f} ns, median: {median:.0f} ns, p99: {p99:.0f} ns, p99.9: {p999:.0f} ns, "
        "max: {max:.0f} ns, min: {min:.0f} ns".format(p999=s["p99.9"], **{k: v for k, v in s.items() if k != "p99.9"}),
        "mean: {mean:.3f} ms, median: {median:.3f} ms, p99: {p99:.3f} ms, p99.9: {p999:.3f} ms, "
        "max: {max:.3f} ms, min: {min:.3f} ms".format(p999=ms["p99.9"], **{k: v for k, v in ms.items() if k != "p99.9"}),
        f"client CPU           : {cpu:.2f} s ({100 * cpu / result.elapsed if result.elapsed else 0:.0f}% of one core)",
    ]
    return "\n".join(lines)


async def run_load(
    call: Callable[[], Awaitable[Any]], *, concurrency: int, total: int,
    stopped: Callable[[], bool] = lambda: False,
) -> BenchResult:
    """Run ``total`` calls with ``concurrency`` concurrent callers, or fewer
    when ``stopped()`` turns true (no new call; those in flight finish)."""
    if concurrency < 1 or total < 0:
        raise ValueError("concurrency must be >= 1 and total >= 0")
    result = BenchResult()
    lat = result.latencies_ns
    remaining = total
    clock = time.perf_counter_ns

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            if stopped():
                result.interrupted = True
                return
            remaining -= 1
            result.sent += 1
            t0 = clock()
            try:
                await call()
            except Exception as exc:
                result.errors += 1
                if result.first_error is None:
                    result.first_error = f"{type(exc).__name__}: {exc}"
                continue
            lat.append(clock() - t0)
            result.ok += 1

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    result.started = time.time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, max(total, 1)))))
    result.elapsed = time.perf_counter() - start
    result.ended = result.started + result.elapsed
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    result.cpu_user = ru1.ru_utime - ru0.ru_utime
    result.cpu_sys = ru1.ru_stime - ru0.ru_stime
    return result


async def bench_target(
    target: BenchTarget, *, concurrency: int, total: int, start_at: float | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> BenchResult:
    """Run the load against ``target`` in this process. ``start_at`` (wall
    clock): warm up (connect) first, then start the load at that time, so
    that several processes load the server together."""
    stack = contextlib.AsyncExitStack()
    # a registry's servers are rpcx servers (tcp@host:port)
    caller, close = await open_caller("tcp@registry" if target.route else target.address, pool=target.pool,
                                      tls=target.tls, kcp=target.kcp)
    stack.push_async_callback(close)
    template = Message(
        service_path=target.service,
        service_method=target.method,
        serialize_type=target.serialize_type,
        payload=target.payload,
    )
    address, timeout = target.address, target.timeout

    async def call() -> None:
        res = await caller(address, template, timeout)
        if res is not None and res.is_error:
            raise RuntimeError(res.error_text)

    plugin = None
    if target.setup_tracing is not None:
        from rpc.client_plugins import CallInfo
        from rpc.tracing import TracingClientPlugin

        plugin = TracingClientPlugin()

        async def call() -> None:  # a CLIENT span per call, its context in the request metadata
            info = CallInfo(service=template.service_path, method=template.service_method, address=address,
                            metadata={})
            plugin.pre_call(info, None)
            error: Exception | None = None
            res = None
            try:
                res = await caller(address, dataclasses.replace(template, metadata=info.metadata), timeout)
                if res is not None and res.is_error:
                    error = RuntimeError(res.error_text)
            except Exception as exc:
                error = exc
            plugin.post_call(info, None, None if error else res, error)
            if error is not None:
                raise error

    if target.route is not None:
        try:
            # the payload is encoded already: sent as it is, under the target's serialize type
            xc = await stack.enter_async_context(target.route.xclient(
                target.service, caller, serialize_type=target.serialize_type, timeout=timeout, codecs=_AsIs()))
            if plugin is not None:
                xc.plugins.add(plugin)
        except BaseException:
            await stack.aclose()
            raise
        payload, method = target.payload, target.method

        async def call() -> None:
            await xc.call_message(method, payload)

    try:
        if start_at is not None:
            for _ in range(target.pool):  # open the pool's connections before the clock starts
                try:
                    await call()
                except Exception:
                    break
            delay = start_at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        return await run_load(call, concurrency=concurrency, total=total, stopped=stopped)
    finally:
        await stack.aclose()


class _AsIs:
    """A codec registry whose every codec sends bytes as they are (the
    benchmark's payload, encoded once)."""

    def get(self, serialize_type: Any) -> Any:
        from rpc.transport.codec import RawCodec

        return RawCodec()


def _worker(target: BenchTarget, concurrency: int, total: int, start_at: float | None,
            stopped: Callable[[], bool]) -> BenchResult:
    import uvloop

    tracing = target.setup_tracing() if target.setup_tracing is not None else None
    try:
        return uvloop.run(bench_target(target, concurrency=concurrency, total=total, start_at=start_at,
                                       stopped=stopped))
    finally:
        if tracing is not None:
            tracing.shutdown()


def _child(target: BenchTarget, concurrency: int, total: int, start_at: Any, stop: Any, out: Any) -> None:
    """A client process: waits for the common start time (``start_at.value``
    set by the parent once every process is up), reports through ``out``."""
    ignore_sigint()  # the parent handles Ctrl-C and raises ``stop``
    out.send("ready")
    while not start_at.value and not stop.value:
        time.sleep(0.01)
    try:
        result = _worker(target, concurrency, total, start_at.value or None, lambda: bool(stop.value))
    except Exception as exc:  # report, never hang the parent
        result = BenchResult(errors=1, first_error=f"client process: {exc!r}")
    out.send(result)
    out.close()


def run_bench(target: BenchTarget, *, concurrency: int, total: int, processes: int = 1) -> BenchResult:
    """Run the benchmark with ``processes`` client processes (1 = this one).

    The first Ctrl-C stops sending (the calls in flight finish) and the
    result covers what was sent (``interrupted``); the second stops now
    (KeyboardInterrupt). No client process outlives it."""
    if processes < 1:
        raise ValueError("processes must be >= 1")
    if processes == 1:
        box = {"stop": False}
        with two_step_interrupt(lambda: box.update(stop=True), prog="juggler rpc bench"):
            # open the connections before the clock starts, as the processes below do
            return _worker(target, concurrency, total, time.time(), lambda: box["stop"])
    shares = [(concurrency // processes + (i < concurrency % processes), total // processes + (i < total % processes))
              for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Value("b", 0, lock=False)
    start_at = ctx.Value("d", 0.0, lock=False)
    pipes, children = [], []
    merged = BenchResult()
    with two_step_interrupt(lambda: setattr(stop, "value", 1), prog="juggler rpc bench"):
        try:
            for c, n in shares:
                parent, child = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(target, max(1, c), n, start_at, stop, child), daemon=True)
                p.start()
                child.close()
                pipes.append(parent)
                children.append(p)
            # the processes start first (imports take a while on a loaded machine),
            # then get one common start time
            for pipe in pipes:
                if pipe.poll(60):
                    pipe.recv()
            start_at.value = time.time() + 1.0
            for pipe in pipes:
                try:
                    merged.merge(pipe.recv())
                except EOFError:
                    merged.merge(BenchResult(errors=1, first_error="a client process died"))
        except BaseException:  # a second Ctrl-C: stop now
            for p in children:
                p.kill()
            raise
        finally:
            for p in children:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
    return merged


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
