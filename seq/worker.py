"""SnowflakeWorker: ``juggler seq snowflake``, a time-ordered ID generator beside a seq cluster.

A worker is a process of its own, not a member: it leases a worker ID from
the cluster (:mod:`seq.lease`, over the members' peer port, as members talk
to each other) and serves IDs of the :mod:`seq.snowflake` layout on the
same APIs as a member:

- gRPC ``pb.RRAPI`` (:mod:`seq.api`, the same native server and wire
  format): ``GRPCNextID(name, n)`` returns ``[from, to)``, n contiguous IDs
  (one millisecond, consecutive sequence numbers), so n is at most
  2**sequence_bits (4096 by default; more is INVALID_ARGUMENT). The name is
  accepted and ignored: one worker has one stream. ``GRPCCurID`` answers a
  value no greater than the next ID; ``GRPCSetID`` always answers false.
- HTTP (:mod:`seq.http`): ``GET /v1/next/{name}?count=N`` →
  ``{"name", "from", "to"}`` (both ends included, every ID between them
  issued), ``/readyz`` (503 until a lease is held), ``/metrics``, and
  ``GET /v1/worker`` (the worker ID, its lease, the layout).

Refusals are typed: no valid lease → gRPC UNAVAILABLE / HTTP 503
``no_lease``; the clock behind the last millisecond used by more than
``max_backward_ms`` → UNAVAILABLE / 503 ``clock_moved_backwards`` (logged
and counted in ``seq_snowflake_clock_backwards_total``); within the bound
the request waits.

The hot path (:meth:`SnowflakeWorker.submit`) runs on the loop, no task or
future per call: a lease check (two comparisons), one
:meth:`Generator.take`, and the answer. Requests that must wait (the
millisecond's sequence is used up, or the clock is a little behind) queue
in arrival order behind one timer.

Test hook: with ``test_clock`` (``--test-clock-control``) the HTTP listener
also takes ``POST /v1/test/clock {"offset_ms": N}``, which shifts this
process's wall clock by N ms (negative: backwards). Never enable it in
production: anyone who can reach the port could stop the worker.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web

from rustext.net import check_hostport
from rustext.service import ServiceBase

from seq._proto import rrpeer_pb2 as peer_pb
from seq.api import ApiServer
from seq.errors import ClockMovedBackwards, NoLease, SeqExhausted, SeqUnavailable
from seq.http import HttpApi
from seq.lease import LeaseConfig, LeaseHolder, QuorumRegister, Tenure
from seq.namestats import NameStats
from seq.peerlink import OK, OP_INFO, PeerLink
from seq.snowflake import (
    DEFAULT_BITS,
    DEFAULT_EPOCH,
    Generator,
    Layout,
    Wait,
    parse_epoch,
)
from seq.wire import CHANNEL_OPTIONS

__all__ = ["Clock", "SnowflakeWorker", "WorkerConfig"]

log = logging.getLogger("seq.snowflake")



@dataclass(kw_only=True)
class WorkerConfig:
    """One snowflake worker. Times in ms unless named otherwise."""

    cluster: tuple[str, ...]  # members' gRPC HOST:PORT as they list each other (the current list is asked from them)
    listen: str  # gRPC HOST:PORT of this worker
    http: str | None = None  # HOST:PORT of its HTTP API (None: none)
    epoch: str = DEFAULT_EPOCH  # ISO 8601: time 0 of the IDs
    bits: tuple[int, int, int] = DEFAULT_BITS  # time, worker, sequence
    max_backward_ms: int = 5  # a clock this far behind the last ms used is waited out; further: refused
    lease_ttl_ms: int = 10_000  # each renewal extends the worker-ID lease this far (renewed every third of it)
    lease_margin_ms: int = 2_000  # stop serving this long before the lease expires when it could not be renewed
    max_clock_skew_ms: int = 1_000  # how far workers' clocks may disagree: an expired lease is taken this long after
    timeout: float = 5.0  # s: request deadline when the client sends none
    peer_timeout: float = 1.0  # s: bound of one call to a member
    drain_timeout: float = 2.0  # s: at shutdown, how long the requests received get to be answered
    test_clock: bool = field(default=False, metadata={"internal": True})  # POST /v1/test/clock (tests only)
    layout: Layout = field(init=False, metadata={"internal": True})  # from epoch and bits
    lease: LeaseConfig = field(init=False, metadata={"internal": True})  # from the lease_* settings

    def __post_init__(self) -> None:
        self.cluster = tuple(check_hostport(a) for a in self.cluster)
        if not self.cluster:
            raise ValueError("--cluster needs the members' addresses")
        if len(set(self.cluster)) != len(self.cluster):
            raise ValueError("duplicate member in --cluster")
        check_hostport(self.listen)
        if self.http is not None:
            check_hostport(self.http)
        t, w, s = self.bits
        self.layout = Layout(epoch_ms=parse_epoch(self.epoch), time_bits=t, worker_bits=w, sequence_bits=s)
        if self.layout.epoch_ms > time.time() * 1000:
            raise ValueError(f"epoch {self.epoch} is in the future")
        if not 0 <= self.max_backward_ms <= 10_000:
            raise ValueError("max clock backward must be from 0 to 10000 ms")
        self.lease = LeaseConfig(ttl_ms=self.lease_ttl_ms, margin_ms=self.lease_margin_ms,
                                 skew_ms=self.max_clock_skew_ms, retry_ms=max(10, min(200, self.lease_ttl_ms // 20)))
        if self.timeout <= 0 or self.peer_timeout <= 0:
            raise ValueError("timeouts must be > 0")

    @property
    def fingerprint(self) -> str:
        """The members' cluster fingerprint (seq.startup.ServerConfig.cluster)."""
        return hashlib.sha256(",".join(sorted(self.cluster)).encode()).hexdigest()[:16]


class Clock:
    """Wall clock in Unix ms, plus an offset that only the test hook sets."""

    __slots__ = ("offset_ms",)

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


@dataclass
class WorkerStats:
    requests: int = 0
    ids: int = 0
    waits: int = 0  # requests that waited (sequence full or clock a little behind)
    clock_backwards: int = 0  # requests refused: clock behind beyond the bound
    no_lease: int = 0  # requests refused: no valid lease


class _StoreView:
    """What the shared APIs read of a store: CurID → a value ≤ the next ID; SetID refused."""

    def __init__(self, worker: SnowflakeWorker) -> None:
        self._w = worker

    def get(self, name: str) -> int:
        return self._w.floor_id()

    def advance(self, name: str, new: int) -> tuple[bool, asyncio.Future[None] | None]:
        return False, None

    def names_page(self, after: str | None, limit: int) -> list[str]:
        return []

    def __len__(self) -> int:
        return 0


class SnowflakeWorker(ServiceBase):
    """One worker (see the module doc). ``await start()``, ``await wait_ready()``, ``await aclose()``."""

    def __init__(self, config: WorkerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock()
        self.layout = config.layout
        self.gen = Generator(config.layout, max_backward_ms=config.max_backward_ms)
        self.stats = WorkerStats()
        self.names = NameStats(max_tracked=100)
        self._tenure: Tenure | None = None
        self._waiting: deque[tuple[int, float, Any]] = deque()
        self._timer: asyncio.Handle | None = None
        self._backwards_episode = False
        self._channels: list[grpc.aio.Channel] = []
        self._links: list[PeerLink] = []
        self._by_addr: dict[str, PeerLink] = {}
        self._register: QuorumRegister | None = None
        self._learning: asyncio.Task[None] | None = None
        self._api: ApiServer | None = None
        self._http: HttpApi | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self._closed = False
        self.holder: LeaseHolder | None = None
        self.port = 0
        self.http_port = 0

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        # --cluster as bootstrapped (epoch 1) until the members tell their configuration (seq.membership)
        register = QuorumRegister([self._link(a) for a in cfg.cluster], cfg.fingerprint, timeout=cfg.peer_timeout,
                                  on_stale=self._stale_configuration)
        self._register = register
        await self._learn_configuration()
        self.holder = LeaseHolder(register, workers=self.layout.workers, config=cfg.lease,
                                  now_ms=self.clock.now_ms, on_change=self._on_lease)
        host, _, port = cfg.listen.rpartition(":")
        self._api = ApiServer(
            host, int(port), coordinator=self, store=_StoreView(self),  # type: ignore[arg-type]
            snapshot=lambda _req: peer_pb.SnapshotReply(status=peer_pb.WRONG_CLUSTER),
            on_store_failure=lambda _exc: None, max_range=self.layout.per_ms,
            default_timeout=cfg.timeout, names=self.names,
        )
        from rustext.net import listen_error

        try:
            self.port = self._api.bind()
        except OSError as exc:
            raise listen_error(host, port, exc) from exc
        self._api.start()
        if cfg.http is not None:
            routes: list[Any] = [("GET", "/v1/worker", self._worker_info)]
            if cfg.test_clock:
                routes.append(("POST", "/v1/test/clock", self._test_clock))
            h, _, p = cfg.http.rpartition(":")
            self._http = HttpApi(
                h, int(p), acquire=self.acquire, store=_StoreView(self),
                state=lambda: "ready" if self.serving() else "no_lease", names=self.names,
                on_store_failure=lambda _exc: None, max_count=self.layout.per_ms, timeout=cfg.timeout,
                member=cfg.listen, metrics=self._metrics, routes=routes,
                not_ready=lambda _state: "this worker holds no valid worker-ID lease yet (or could not renew it)",
            )
            self.http_port = await self._http.start()
        self._keeper = self._loop.create_task(self._keep(), name="snowflake-lease")
        log.info("snowflake worker listening on %s%s; taking a worker-ID lease from %s (layout %d/%d/%d bits, "
                 "epoch %s)", cfg.listen, f", HTTP on {h}:{self.http_port}" if self._http else "",
                 ",".join(cfg.cluster), *cfg.bits, cfg.epoch)

    def _link(self, addr: str) -> PeerLink:
        link = self._by_addr.get(addr)
        if link is None:
            ch = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
            link = PeerLink(addr, ch, self.config.fingerprint)
            self._channels.append(ch)
            self._links.append(link)
            self._by_addr[addr] = link
        return link

    def _stale_configuration(self) -> None:
        """A member answered in a newer configuration epoch (or another cluster id): learn it."""
        if self._closed or (self._learning is not None and not self._learning.done()):
            return
        self._learning = asyncio.get_running_loop().create_task(self._learn_configuration(), name="snowflake-conf")

    async def _learn_configuration(self) -> None:
        """Use the newest configuration the members report (their cluster id, epoch and members):
        after membership changes, --cluster may name members that left and miss new ones."""
        assert self._register is not None
        reg = self._register
        addrs = list(dict.fromkeys((*self.config.cluster, *(p.addr for p in reg._links))))
        t = self.config.peer_timeout
        replies = await asyncio.gather(*(self._link(a).call([OP_INFO, "", ""], t) for a in addrs),
                                       return_exceptions=True)
        infos = [r[1] for r in replies if not isinstance(r, BaseException) and r[0] == OK and isinstance(r[1], dict)
                 and int(r[1].get("epoch", 0)) > 0 and r[1].get("state") != "joining"]
        if not infos:
            return
        best = max(infos, key=lambda i: int(i["epoch"]))
        epoch, cluster, members = int(best["epoch"]), str(best["cluster"]), [str(m) for m in best["members"]]
        if (epoch, cluster, sorted(p.addr for p in reg._links)) == (reg._epoch, reg._cluster, sorted(members)):
            return
        reg.configure([self._link(a) for a in members], cluster, epoch)
        log.info("cluster configuration epoch %d: members %s", epoch, ",".join(members))

    async def _keep(self) -> None:
        assert self.holder is not None
        try:
            await self.holder.keep(lambda: self._closed)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: stop serving rather than serve without renewing
            log.exception("the lease keeper failed; this worker stops serving")
            self._on_lease(None)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until the first lease is held."""
        async with asyncio.timeout(timeout):
            await self._ready.wait()

    def draining(self) -> str:
        """What a drain waits for, in words (empty: nothing in flight)."""
        n = self.pending()
        return f"answering {n} call{'s' if n != 1 else ''} for up to {self.config.drain_timeout:g} s" if n else ""

    def pending(self) -> int:
        return len(self._waiting) + (self._api.pending() if self._api is not None else 0)

    def abort(self) -> None:
        """End a drain in progress at once (a second Ctrl-C)."""
        if self._api is not None:
            self._api.abort_drain()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, answer what waits within `timeout` s (None:
        ``drain_timeout``), release nothing (the lease expires by itself).
        Idempotent."""
        grace = self.config.drain_timeout if timeout is None else timeout
        if self._closed:
            return
        self._closed = True
        if self._api is not None:
            self._api.drain()
        if self._http is not None:
            await self._http.aclose()
        if self._api is not None:
            await self._api.wait_drained(grace)
        if self._timer is not None:
            self._timer.cancel()
        while self._waiting:
            _, _, sink = self._waiting.popleft()
            if not sink.done():
                sink.set_exception(NoLease("this worker is shutting down"))
        for task in (self._keeper, self._learning):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._api is not None:
            await self._api.aclose()
        for p in self._links:
            await p.aclose()
        for c in self._channels:
            await c.close()

    # -- lease ----------------------------------------------------------------

    def _on_lease(self, t: Tenure | None) -> None:
        old = self._tenure
        self._tenure = t
        if t is None:
            return
        if old is None or old.worker != t.worker or old.floor_ms != t.floor_ms:
            self.gen.rebase(t.worker, t.floor_ms)  # a new tenure: IDs start above its floor
            log.info("serving as worker ID %d", t.worker)
        self._ready.set()
        if self._waiting:
            self._drain()

    def serving(self) -> bool:
        t = self._tenure
        return t is not None and self._loop is not None and self._loop.time() < t.serve_until

    def floor_id(self) -> int:
        """No greater than the next ID this worker issues (0 before its first lease)."""
        if self.gen.worker < 0:
            return 0
        return self.layout.compose(max(self.gen.last_ms, 0), self.gen.worker, min(self.gen.seq, self.layout.per_ms - 1))

    # -- the hot path -----------------------------------------------------------

    def submit(self, name: str, n: int, deadline: float, sink: Any) -> None:
        """``n`` contiguous IDs to `sink` as ``(from, to)``, or a typed error (module doc)."""
        self.stats.requests += 1
        if self._waiting:
            self._waiting.append((n, deadline, sink))
            return
        self._issue(n, deadline, sink)

    async def acquire(self, name: str, n: int, deadline: float) -> tuple[int, int] | None:
        fut: asyncio.Future[tuple[int, int] | None] = asyncio.get_running_loop().create_future()
        self.submit(name, n, deadline, fut)
        return await fut

    def _issue(self, n: int, deadline: float, sink: Any) -> bool:
        """Answer `sink`, or queue it (False) when it must wait."""
        t = self._tenure
        loop = self._loop
        assert loop is not None
        now = self.clock.now_ms()
        if t is None or self._closed or loop.time() >= t.serve_until or now >= t.expiry_ms:
            self.stats.no_lease += 1
            sink.set_exception(NoLease("this worker holds no valid worker-ID lease (starting, or the cluster "
                                       "did not renew it in time); ask another worker or retry"))
            return True
        if n > self.layout.per_ms:
            sink.set_exception(ValueError(f"count above {self.layout.per_ms}"))
            return True
        try:
            r = self.gen.take(n, now)
        except ClockMovedBackwards as exc:
            self.stats.clock_backwards += 1
            if not self._backwards_episode:
                self._backwards_episode = True
                log.error("%s", exc)
            sink.set_exception(exc)
            return True
        except SeqExhausted as exc:
            sink.set_exception(exc)
            return True
        if type(r) is int:
            self._backwards_episode = False
            self.stats.ids += n
            sink.set_result((r, r + n))
            return True
        assert isinstance(r, Wait)
        if loop.time() >= deadline:
            sink.set_exception(SeqUnavailable("the deadline passed while waiting for the clock"))
            return True
        self.stats.waits += 1
        self._waiting.appendleft((n, deadline, sink))
        if self._timer is None:
            # The millisecond's sequence used up: look again on the next loop turn (the loop's
            # timers round up to a whole millisecond or more, which would idle a saturated worker
            # for a third of the time; a turn lets other I/O through, where Leaf spins). A clock
            # behind: a timer.
            self._timer = loop.call_later(r.ms / 1000, self._on_timer) if r.backwards else loop.call_soon(
                self._on_timer)
        return False

    def _on_timer(self) -> None:
        self._timer = None
        self._drain()

    def _drain(self) -> None:
        w = self._waiting
        while w and self._timer is None:
            n, deadline, sink = w.popleft()
            if sink.done():
                continue
            if not self._issue(n, deadline, sink):
                return

    # -- HTTP extras ----------------------------------------------------------

    async def _worker_info(self, request: web.Request) -> web.Response:
        t = self._tenure
        lay = self.layout
        body: dict[str, Any] = {
            "serving": self.serving(), "worker": t.worker if t else None,
            "lease_expiry_ms": t.expiry_ms if t else None, "floor_ms": t.floor_ms if t else None,
            "epoch_ms": lay.epoch_ms, "bits": [lay.time_bits, lay.worker_bits, lay.sequence_bits],
            "max_count": lay.per_ms, "clock_offset_ms": self.clock.offset_ms,
        }
        if t is not None:
            body["lease_expiry"] = datetime.datetime.fromtimestamp(t.expiry_ms / 1000, datetime.UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z")
        return web.json_response(body)

    async def _test_clock(self, request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
            off = doc["offset_ms"]
            if type(off) is not int or abs(off) > 86_400_000:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": {"code": "bad_request",
                                                "message": 'expected {"offset_ms": N}, |N| <= 86400000'}}, status=400)
        self.clock.offset_ms = off
        log.warning("test hook: wall clock shifted by %d ms", off)
        return web.json_response({"offset_ms": off})

    def _metrics(self) -> tuple[bytes, str]:
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            generate_latest,
        )
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.registry import Collector

        w = self

        class _C(Collector):
            def collect(self) -> Iterator[Any]:
                s = w.stats
                yield CounterMetricFamily("seq_snowflake_requests", "NextID requests", value=s.requests)
                yield CounterMetricFamily("seq_snowflake_waits", "Requests that waited for the clock", value=s.waits)
                yield CounterMetricFamily("seq_snowflake_clock_backwards", "Requests refused: clock moved backwards "
                                          "beyond the bound", value=s.clock_backwards)
                yield CounterMetricFamily("seq_snowflake_no_lease", "Requests refused: no valid lease",
                                          value=s.no_lease)
                h = w.holder
                yield CounterMetricFamily("seq_snowflake_lease_renewals", "Lease renewals won",
                                          value=h.renewals if h else 0)
                yield CounterMetricFamily("seq_snowflake_lease_losses", "Leases given up (not renewed in time)",
                                          value=h.losses if h else 0)
                t = w._tenure
                yield GaugeMetricFamily("seq_snowflake_worker_id", "Worker ID held (-1: none)",
                                        value=t.worker if t else -1)
                yield GaugeMetricFamily("seq_snowflake_serving", "1 while a valid lease is held",
                                        value=1 if w.serving() else 0)

        reg = CollectorRegistry(auto_describe=True)
        reg.register(_C())
        return generate_latest(reg), CONTENT_TYPE_LATEST
