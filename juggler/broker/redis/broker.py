"""The Redis broker: callers, callees and pub-sub over one Redis (or cluster),
assembled from the parts of this package (see its module doc)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import rustext
from juggler.broker.base import (
    BrokerBase,
    BrokerError,
    Call,
    CapacityExceeded,
    EventHandler,
    Result,
    ResultHandler,
)
from juggler.broker.cluster import ClusterRouter, SingleRouter
from juggler.broker.redis.config import RedisBrokerConfig, RedisBrokerStats
from juggler.broker.redis.keys import (
    CAPACITY_MESSAGE,
    POP_CHECK_MANY_SCRIPT,
    POP_CHECK_SCRIPT,
    PUSH_MANY_SCRIPT,
    PUSH_SCRIPT,
    REQUEUE_SCRIPT,
    call_key,
    call_ttl_key,
    group_by_slot,
    result_key,
    result_ttl_key,
)
from juggler.broker.redis.pops import BlockingPops
from juggler.broker.history import HistoryPage, RedisHistory
from juggler.broker.redis.pubsub import PubSubFanout
from juggler.channels import ChannelOptions
from juggler.broker.redis.pushes import Item, Pusher
from juggler.broker.redis.results import ResultsListener
from juggler.broker.resp import RedisReplyError, RespPool, evalsha

__all__ = ["RedisBroker"]

log = logging.getLogger("juggler.broker.redis")


class RedisBroker(BrokerBase):
    """CallerBroker + CalleeBroker + PubSubBroker over one Redis (see the package doc).

    Lifecycle: ``await start()`` (connects, loads the scripts), then use;
    ``await aclose()`` stops the listeners and closes every connection
    (idempotent). Also an async context manager.
    """

    def __init__(self, config: RedisBrokerConfig | None = None, **kw: Any) -> None:
        self.config = config or RedisBrokerConfig(**kw)
        cfg = self.config
        self.address = cfg.address()
        self._conn_uuid = cfg.conn_uuid or rustext.new_uuid()
        self.stats = RedisBrokerStats()
        self.router: SingleRouter | ClusterRouter
        if cfg.cluster:
            self.router = ClusterRouter(
                cfg.cluster, pool_size=cfg.pool_size, command_timeout=cfg.command_timeout,
                connect_timeout=cfg.connect_timeout, retry_timeout=cfg.cluster_retry_timeout,
                tls=cfg.client_tls(),
            )
            self.pool: RespPool | None = None
        else:
            self.router = SingleRouter(
                self.address, pool_size=cfg.pool_size, command_timeout=cfg.command_timeout,
                connect_timeout=cfg.connect_timeout,
            )
            self.pool = self.router.pool
        # the parts, one concern each
        self._pusher = Pusher(self.router, cap=cfg.call_cap)
        self._pops = BlockingPops(self.router, cfg, self.stats)
        self._results = ResultsListener(self._pops, self._conn_uuid, cfg, self.stats)
        self._fanout = PubSubFanout(self.router, cfg, self.stats)
        self._history = RedisHistory(self.router)
        self._started = False
        self._closed = False

    # lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Connect and load the scripts; starts the results listener if a sink is set."""
        if self._started:
            return
        await self.router.start()
        pools = self.router.primary_pools()
        info = await pools[0].execute("INFO", "server")
        version = _redis_version(info)
        self._pops.has_blmpop = version >= (7, 0)
        if version < (6, 2):
            log.warning("Redis %s: RPOP with a count needs 6.2; batching is off", ".".join(map(str, version)))
        for pool in pools:  # a cluster: every primary (NOSCRIPT falls back to EVAL anyway)
            for script in (PUSH_SCRIPT, PUSH_MANY_SCRIPT, POP_CHECK_SCRIPT, POP_CHECK_MANY_SCRIPT, REQUEUE_SCRIPT):
                await pool.execute("SCRIPT", "LOAD", script.body)
        self._version = version
        self._started = True
        if self._results.handler is not None:
            self._results.start()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pops.closed = True
        await asyncio.gather(self._results.aclose(), self._fanout.aclose())
        await self._pusher.aclose(self.config.command_timeout)
        await self._pops.aclose()
        await self.router.aclose()

    # CallerBroker --------------------------------------------------------------

    @property
    def conn_uuid(self) -> str:
        return self._conn_uuid

    async def call(
        self, msg_uuid: str, uri: str, args: bytes | None, timeout_ms: int, *, trace: bytes | None = None
    ) -> None:
        """Queue a call. Calls made during one event-loop turn are pushed
        together: one script run per URI (upstream's script when alone)."""
        if timeout_ms <= 0:
            self.stats.call_failures += 1
            raise BrokerError(f"invalid call timeout: {timeout_ms} ms")
        if self._closed:
            raise BrokerError("broker closed")
        payload = rustext.build_call_payload(self._conn_uuid, msg_uuid, uri, args, trace)
        try:
            await self._pusher.push(call_key(uri), call_ttl_key(uri, msg_uuid), timeout_ms, payload)
        except BrokerError:
            self.stats.call_failures += 1
            raise
        self.stats.calls += 1

    def lost_since(self, t: float) -> bool:
        """Whether a listener of this broker (the results listener, in a server)
        lost Redis at or after loop time `t`: a result may have been lost with
        it. The server names it in the error RES of a call that got no result."""
        lost = self._pops.lost_at
        return lost is not None and lost >= t

    def on_result(self, handler: ResultHandler) -> None:
        self._results.handler = handler
        if self._started and not self._closed:
            self._results.start()

    # CalleeBroker --------------------------------------------------------------

    def call_groups(self, uris: Iterable[str]) -> list[list[str]]:
        """How a callee splits its URIs into call streams: one stream on one
        Redis; one per hash slot on a cluster (a blocking pop's keys must
        share a slot)."""
        uris = list(uris)
        if not self.router.cluster:
            return [uris]
        return list(group_by_slot(uris).values())

    @property
    def description(self) -> str:
        return self.router.describe()

    async def calls(self, uris: list[str]) -> AsyncIterator[Call]:  # type: ignore[override]
        """Yield unexpired calls for `uris` (one blocking connection).

        Calls are popped up to ``call_batch`` at a time; when the consumer
        closes the stream, the calls popped but not yet yielded are put back
        at the head of their lists with their remaining TTL.
        """
        if not uris:
            raise ValueError("no URI")
        if self.router.cluster and len(group_by_slot(uris)) > 1:
            raise ValueError("in a cluster, one call stream serves URIs of one slot (see call_groups())")
        keys = [call_key(u) for u in uris]
        buffered: deque[tuple[Any, int, float]] = deque()
        leftovers: list[tuple[bytes, bytes]] = []
        pops = self._pops.pops(
            keys, self.config.call_batch, "calls", lambda p: call_ttl_key(p.uri, p.msg_uuid), leftovers
        )
        try:
            async for parsed, pttls in pops:
                now = time.monotonic()
                if None in pttls:
                    pttls = await self._pops.recheck(parsed, pttls)
                for p, pttl in zip(parsed, pttls, strict=True):
                    if isinstance(pttl, Exception) or pttl <= 0:
                        self.stats.expired_calls += 1
                        continue
                    buffered.append((p, pttl, now))
                while buffered:
                    p, pttl, at = buffered[0]
                    left = pttl - int((time.monotonic() - at) * 1000)
                    buffered.popleft()
                    if left <= 0:
                        self.stats.expired_calls += 1
                        continue
                    self.stats.calls_popped += 1
                    yield Call(conn_uuid=p.conn_uuid, msg_uuid=p.msg_uuid, uri=p.uri, args=p.args, ttl_ms=left,
                               trace=p.trace)
        finally:
            await pops.aclose()
            if leftovers and not self.router.closed:
                # popped after the buffered ones: they go back first, the
                # buffered ones after them, so the list's order is kept
                await self._pops.requeue_raw_list(leftovers)
            if buffered and not self.router.closed:
                items = list(buffered)
                buffered.clear()
                await self._pops.requeue(items)

    async def send_result(self, result: Result, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            return
        try:
            payload = rustext.build_call_payload(result.conn_uuid, result.msg_uuid, result.uri, result.args)
        except ValueError as exc:
            raise BrokerError(f"invalid result: {exc}") from exc
        keys = (result_ttl_key(result.conn_uuid, result.msg_uuid), result_key(result.conn_uuid))
        argv = (ttl_ms, payload, self.config.result_cap)
        try:
            await self.router.run(keys[1], lambda c: evalsha(c, PUSH_SCRIPT, keys, argv))
        except RedisReplyError as exc:
            if CAPACITY_MESSAGE in str(exc):
                raise CapacityExceeded(CAPACITY_MESSAGE) from exc
            raise BrokerError(str(exc)) from exc
        self.stats.results_sent += 1

    async def send_results(self, batch: list[tuple[Result, int]]) -> list[BaseException | None]:
        """Store many results at once (one script run per caller's list);
        per-item outcome (None = stored)."""
        loop = asyncio.get_running_loop()
        groups: dict[str, list[Item]] = {}
        futs = []
        for result, ttl_ms in batch:
            fut = loop.create_future()
            futs.append(fut)
            try:
                payload = rustext.build_call_payload(result.conn_uuid, result.msg_uuid, result.uri, result.args)
            except ValueError as exc:  # not JSON, not a UUID: this item only
                fut.set_exception(BrokerError(f"invalid result: {exc}"))
                continue
            groups.setdefault(result_key(result.conn_uuid), []).append(
                (result_ttl_key(result.conn_uuid, result.msg_uuid), max(1, ttl_ms), payload, fut)
            )
        await self._pusher.push_groups(groups, self.config.result_cap)
        out: list[BaseException | None] = []
        for fut in futs:
            exc = fut.exception()
            if exc is None:
                self.stats.results_sent += 1
            out.append(exc)
        return out

    # PubSubBroker --------------------------------------------------------------

    # PubSubBroker --------------------------------------------------------------

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> None:
        await self._fanout.publish(channel, msg_uuid, args)

    async def publish_history(self, channel: str, msg_uuid: str, args: bytes | None,
                              opts: ChannelOptions) -> tuple[int, str]:
        """Store the publication in the channel's history and publish it, in one
        script run; returns its (offset, epoch) (see juggler.broker.history)."""
        if self._closed:
            raise BrokerError("broker closed")
        position = await self._history.publish(channel, msg_uuid, args, opts)
        self.stats.published += 1
        return position

    async def read_history(self, channel: str, after: int, limit: int, opts: ChannelOptions) -> HistoryPage:
        """The channel's publications with offset > `after` (at most `limit`; 0 = all) and its position."""
        if self._closed:
            raise BrokerError("broker closed")
        return await self._history.read(channel, after, limit, opts)

    async def subscribe(self, subscriber: object, channel: str, pattern: bool, handler: EventHandler) -> None:
        """Subscribe `subscriber`; returns once Redis has it subscribed (see
        :meth:`PubSubFanout.subscribe <juggler.broker.redis.pubsub.PubSubFanout.subscribe>`)."""
        if self._closed:
            raise BrokerError("broker closed")
        await self._fanout.subscribe(subscriber, channel, pattern, handler)

    def on_resubscribed(self, callback: Callable[[bool, str], None]) -> None:
        """`callback(pattern, channel)` when a subscription is in effect again
        after the pub-sub connection was lost (what was published meanwhile
        was not delivered)."""
        self._fanout.on_resubscribed = callback

    async def barrier(self, callback: Callable[[], object]) -> None:
        """Run `callback` where the pub-sub stream has delivered everything published
        before this call and nothing after (see PubSubFanout.barrier)."""
        if self._closed:
            raise BrokerError("broker closed")
        await self._fanout.barrier(callback)

    async def unsubscribe(self, subscriber: object, channel: str, pattern: bool) -> None:
        await self._fanout.unsubscribe(subscriber, channel, pattern)

    async def unsubscribe_all(self, subscriber: object) -> None:
        await self._fanout.unsubscribe_all(subscriber)


def _redis_version(info: bytes) -> tuple[int, ...]:
    for line in info.split(b"\r\n"):
        if line.startswith(b"redis_version:"):
            try:
                return tuple(int(x) for x in line.split(b":", 1)[1].split(b".")[:3])
            except ValueError:
                break
    return (0, 0, 0)
