"""The Redis broker: the exact key layout and scripts of upstream juggler.

Keys (protocols/juggler.md; hash tags keep a list and its TTL keys in one
cluster slot):

- ``juggler:calls:{URI}``                           LIST of call payloads
- ``juggler:calls:timeout:{URI}:<msg_uuid>``        TTL key of one call
- ``juggler:results:{CONN_UUID}``                   LIST of result payloads
- ``juggler:results:timeout:{CONN_UUID}:<msg_uuid>`` TTL key of one result

The push and pop-check Lua scripts are byte-identical to upstream's, so their
EVALSHA hashes (``b0cdecc8…``, ``f17b6ff7…``) are the same and a Go server,
Go callee or Go client of the original works through the same Redis.

Resources, per process (upstream used two Redis connections per websocket):

- a small pool of command connections (``pool_size``, default 2) with
  implicit pipelining: every push, pop check and PUBLISH issued during one
  event-loop turn goes out in one write;
- ONE results listener for the process-wide routing key ``conn_uuid``:
  ``BLMPOP`` (Redis >= 7; ``BRPOP`` + ``RPOP count`` before) takes up to
  ``result_batch`` results at once, their pop checks are pipelined, and each
  unexpired result goes to the ``on_result`` sink, which routes it by
  ``msg_uuid``;
- ONE pub-sub connection fanning events out to every local subscriber, with
  reference-counted ``SUBSCRIBE``/``PSUBSCRIBE`` (a channel is subscribed in
  Redis while at least one local subscriber wants it); it reconnects and
  re-subscribes by itself;
- one blocking connection per ``calls()`` stream of a callee, popping up to
  ``call_batch`` calls at once.

TTL semantics: a call's TTL key lives ``timeout_ms``; a popped call or result
whose TTL key is gone (PTTL <= 0) has expired and is dropped (counted in
``stats``). A callee stores its result with the call's remaining time.

Call lists nobody serves: upstream lets them grow forever (the TTL keys
expire, the entries stay). Here each URI's list holds at most ``call_cap``
calls (default 10,000): past that, CALLs to that URI are refused with
"list capacity exceeded" (the server's NACK 500), so a caller learns nobody
consumes them instead of filling Redis. Stale entries cost nothing more: a
callee that comes later pops them, finds their TTL keys gone and drops them
without running them. ``call_cap=0`` restores upstream's unbounded lists.
Results lists are bounded the same way by ``result_cap``.

Redis Cluster (``cluster`` seeds): every key of one call shares the URI's
slot and every key of one result the routing key's slot, so each script runs
on one node; :func:`group_by_slot` / :meth:`RedisBroker.call_groups` split a
callee's URIs into one blocking pop per slot. Routing, redirections and
retries are the router's (``juggler.broker.cluster``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from juggler.broker.base import (
    BrokerError,
    Call,
    CapacityExceeded,
    Event,
    EventHandler,
    Result,
    ResultHandler,
)
from juggler.broker.cluster import ClusterRouter, SingleRouter, cluster_error_kind, key_slot
from juggler.broker.resp import (
    RedisAddress,
    RedisReplyError,
    RespConnection,
    RespPool,
    Script,
)

__all__ = [
    "POP_CHECK_SCRIPT",
    "PUSH_SCRIPT",
    "RedisBroker",
    "RedisBrokerConfig",
    "RedisBrokerStats",
    "call_key",
    "call_ttl_key",
    "group_by_slot",
    "key_slot",
    "result_key",
    "result_ttl_key",
]

log = logging.getLogger("juggler.broker.redis")

# Upstream's scripts, byte for byte (same SHA1, so EVALSHA is shared with Go peers).
PUSH_SCRIPT = Script(
    "\n\tredis.call(\"SET\", KEYS[1], ARGV[1], \"PX\", tonumber(ARGV[1]))\n"
    "\tlocal res = redis.call(\"LPUSH\", KEYS[2], ARGV[2])\n"
    "\tlocal limit = tonumber(ARGV[3])\n"
    "\tif res > limit and limit > 0 then\n"
    "\t\tlocal diff = res - limit\n"
    "\t\tredis.call(\"LTRIM\", KEYS[2], diff, limit + diff)\n"
    "\t\treturn redis.error_reply(\"list capacity exceeded\")\n"
    "\tend\n"
    "\treturn res\n"
)
POP_CHECK_SCRIPT = Script(
    "\n\tlocal res = redis.call(\"PTTL\", KEYS[1])\n"
    "\tredis.call(\"DEL\", KEYS[1])\n"
    "\treturn res\n"
)
# The pop check of a whole popped batch in one script run: upstream's
# PTTL + DEL for each key (all keys of one list share its hash slot).
POP_CHECK_MANY_SCRIPT = Script(
    "local res = {}\n"
    "for i, k in ipairs(KEYS) do\n"
    "\tres[i] = redis.call(\"PTTL\", k)\n"
    "end\n"
    "redis.call(\"DEL\", unpack(KEYS))\n"
    "return res\n"
)
# Upstream's push (SET PX + LPUSH + capacity check) for several items of one
# list in one script run: KEYS = list, ttl keys; ARGV = cap, then ms and
# payload per item. Per item: the list length, or 0 when the list was full
# (that item is trimmed away again, as upstream does).
PUSH_MANY_SCRIPT = Script(
    "local limit = tonumber(ARGV[1])\n"
    "local res = {}\n"
    "for i = 2, #KEYS do\n"
    "\tlocal ms = ARGV[2 * i - 2]\n"
    "\tredis.call(\"SET\", KEYS[i], ms, \"PX\", tonumber(ms))\n"
    "\tlocal n = redis.call(\"LPUSH\", KEYS[1], ARGV[2 * i - 1])\n"
    "\tif n > limit and limit > 0 then\n"
    "\t\tredis.call(\"LTRIM\", KEYS[1], 1, limit)\n"
    "\t\tres[i - 1] = 0\n"
    "\telse\n"
    "\t\tres[i - 1] = n\n"
    "\tend\n"
    "end\n"
    "return res\n"
)
# Puts calls a stopping callee had popped but not started back at the head of
# their list, with their TTL keys restored to the time they have left.
REQUEUE_SCRIPT = Script(
    "redis.call(\"SET\", KEYS[1], ARGV[1], \"PX\", tonumber(ARGV[1]))\n"
    "return redis.call(\"RPUSH\", KEYS[2], ARGV[2])\n"
)

CAPACITY_MESSAGE = "list capacity exceeded"


def call_key(uri: str) -> str:
    return "juggler:calls:{" + uri + "}"


def call_ttl_key(uri: str, msg_uuid: str) -> str:
    return "juggler:calls:timeout:{" + uri + "}:" + msg_uuid


def result_key(conn_uuid: str) -> str:
    return "juggler:results:{" + conn_uuid + "}"


def result_ttl_key(conn_uuid: str, msg_uuid: str) -> str:
    return "juggler:results:timeout:{" + conn_uuid + "}:" + msg_uuid


def group_by_slot(uris: Iterable[str]) -> dict[int, list[str]]:
    """URIs grouped by the slot of their call list: one blocking pop per group
    in a cluster (all keys of one BRPOP/BLMPOP must share a slot)."""
    groups: dict[int, list[str]] = {}
    for uri in uris:
        groups.setdefault(key_slot(call_key(uri)), []).append(uri)
    return groups


def _codec() -> Any:
    import rustext

    return rustext


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisBrokerConfig:
    """Redis broker options: where Redis is, queue capacities, batching, timeouts."""

    #: ``redis://[user:password@]host:port/db`` or ``unix:///path?db=N`` (unused when ``cluster`` is set)
    url: str = "redis://127.0.0.1:6379/0"
    #: max calls queued per URI (more: NACK 500 "list capacity exceeded"); 0 = unbounded, as the original
    call_cap: int = 10_000
    #: max results queued per routing key; 0 = unbounded
    result_cap: int = 100_000
    #: calls a callee stream pops at once
    call_batch: int = 32
    #: results the listener pops at once
    result_batch: int = 512
    #: seconds one blocking pop waits before it is re-issued
    block_timeout: float = 2.0
    #: seconds without a reply before a connection is declared dead (its commands fail)
    command_timeout: float = 10.0
    #: seconds to open a connection to Redis
    connect_timeout: float = 5.0
    #: command connections shared by the process (per node on a cluster)
    pool_size: int = 2
    #: seconds between health PINGs on the pub-sub connection (no answer by the next: reconnect)
    pubsub_health_interval: float = 15.0
    #: the routing key of this process's calls (a fresh UUID when None)
    conn_uuid: str | None = None
    #: Redis Cluster seed node URLs; non-empty = cluster mode (``url`` is then unused)
    cluster: tuple[str, ...] = ()
    #: cluster mode: seconds an operation keeps retrying MOVED/ASK/CLUSTERDOWN/connection errors
    cluster_retry_timeout: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.cluster, str):
            object.__setattr__(self, "cluster", tuple(u for u in self.cluster.split(",") if u))
        else:
            object.__setattr__(self, "cluster", tuple(self.cluster))
        for u in self.cluster:
            RedisAddress.from_url(u)
        if self.cluster_retry_timeout <= 0:
            raise ValueError("cluster_retry_timeout must be > 0")
        if self.call_cap < 0 or self.result_cap < 0:
            raise ValueError("capacities must be >= 0")
        if self.call_batch < 1 or self.result_batch < 1:
            raise ValueError("batches must be >= 1")
        if self.block_timeout <= 0 or self.pubsub_health_interval <= 0:
            raise ValueError("block_timeout and pubsub_health_interval must be > 0")
        if self.pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        RedisAddress.from_url(self.url)


@dataclass(slots=True)
class RedisBrokerStats:
    calls: int = 0  # calls pushed
    call_failures: int = 0  # pushes refused (capacity, Redis errors)
    results_received: int = 0  # results popped and routed
    expired_results: int = 0  # results popped with their TTL gone
    calls_popped: int = 0  # calls handed to callees
    expired_calls: int = 0  # calls popped with their TTL gone
    results_sent: int = 0  # results pushed by callees
    published: int = 0
    events: int = 0  # events delivered to local subscribers
    redis_subscriptions: int = 0  # channels + patterns subscribed in Redis now


@dataclass(slots=True)
class _Barrier:
    """A SUBSCRIBE (or a PING) sent on the pub-sub connection, and the local
    subscribers that become active when Redis answers it."""

    fut: asyncio.Future[None]
    activate: list[tuple[tuple[bool, str], object]] = field(default_factory=list)


@dataclass(slots=True)
class _Sub:
    """One channel or pattern: its active local handlers, the ones waiting for
    their barrier, and where its Redis subscription stands."""

    handlers: dict[object, EventHandler] = field(default_factory=dict)
    pending: dict[object, EventHandler] = field(default_factory=dict)
    confirms: deque[_Barrier] = field(default_factory=deque)  # one per SUBSCRIBE in flight
    state: str = "idle"  # idle (not subscribed / UNSUBSCRIBE sent) | subscribing | subscribed


class RedisBroker:
    """CallerBroker + CalleeBroker + PubSubBroker over one Redis (see module doc).

    Lifecycle: ``await start()`` (connects, loads the scripts), then use;
    ``await aclose()`` stops the listeners and closes every connection
    (idempotent). Also an async context manager.
    """

    def __init__(self, config: RedisBrokerConfig | None = None, **kw: Any) -> None:
        self.config = config or RedisBrokerConfig(**kw)
        cfg = self.config
        self.address = RedisAddress.from_url(cfg.cluster[0] if cfg.cluster else cfg.url)
        self._conn_uuid = cfg.conn_uuid or _codec().new_uuid()
        self.stats = RedisBrokerStats()
        self.router: SingleRouter | ClusterRouter
        if cfg.cluster:
            self.router = ClusterRouter(
                cfg.cluster, pool_size=cfg.pool_size, command_timeout=cfg.command_timeout,
                connect_timeout=cfg.connect_timeout, retry_timeout=cfg.cluster_retry_timeout,
            )
            self.pool: RespPool | None = None
        else:
            self.router = SingleRouter(
                self.address, pool_size=cfg.pool_size, command_timeout=cfg.command_timeout,
                connect_timeout=cfg.connect_timeout,
            )
            self.pool = self.router.pool
        self._result_handler: ResultHandler | None = None
        self._results_task: asyncio.Task[None] | None = None
        self._pubsub: RespConnection | None = None
        self._pubsub_task: asyncio.Task[None] | None = None
        self._pubsub_ready: asyncio.Event | None = None
        self._subs: dict[tuple[bool, str], _Sub] = {}
        self._pings: deque[_Barrier] = deque()  # PINGs in flight on the pub-sub connection
        self._by_subscriber: dict[object, set[tuple[bool, str]]] = {}
        self._blocking: set[RespConnection] = set()
        self._orphans: set[asyncio.Future[Any]] = set()
        self._call_batch: dict[str, list[tuple[str, int, bytes, asyncio.Future[Any]]]] = {}
        self._call_flush_scheduled = False
        self._requeues: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._has_blmpop = True
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
        self._has_blmpop = version >= (7, 0)
        if version < (6, 2):
            log.warning("Redis %s: RPOP with a count needs 6.2; batching is off", ".".join(map(str, version)))
        for pool in pools:  # a cluster: every primary (NOSCRIPT falls back to EVAL anyway)
            for script in (PUSH_SCRIPT, PUSH_MANY_SCRIPT, POP_CHECK_SCRIPT, POP_CHECK_MANY_SCRIPT, REQUEUE_SCRIPT):
                await pool.execute("SCRIPT", "LOAD", script.body)
        self._version = version
        self._started = True
        if self._result_handler is not None:
            self._start_results()

    async def __aenter__(self) -> RedisBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        listeners = [t for t in (self._results_task, self._pubsub_task) if t is not None]
        for t in listeners:
            t.cancel()
        if listeners:
            await asyncio.wait(listeners, timeout=5.0)
        if self._tasks:
            # pushes in flight are short: let them answer their callers
            _, late = await asyncio.wait(set(self._tasks), timeout=self.config.command_timeout)
            for t in late:
                t.cancel()
        if self._orphans:
            # blocking pops still in flight may hold calls: let them answer
            await asyncio.wait(set(self._orphans), timeout=self.config.block_timeout + 1.0)
        if self._requeues:
            await asyncio.wait(set(self._requeues), timeout=self.config.command_timeout)
        for conn in list(self._blocking):
            conn.close()
        if self._pubsub is not None:
            self._pubsub.close()
        for sub in self._subs.values():
            for b in sub.confirms:
                _fail_future(b.fut, BrokerError("broker closed"))
        for b in self._pings:
            _fail_future(b.fut, BrokerError("broker closed"))
        await self.router.aclose()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # CallerBroker --------------------------------------------------------------

    @property
    def conn_uuid(self) -> str:
        return self._conn_uuid

    async def call(self, msg_uuid: str, uri: str, args: bytes | None, timeout_ms: int) -> None:
        """Queue a call. Calls made during one event-loop turn are pushed
        together: one script run per URI (upstream's script when alone)."""
        if timeout_ms <= 0:
            self.stats.call_failures += 1
            raise BrokerError(f"invalid call timeout: {timeout_ms} ms")
        if self._closed:
            raise BrokerError("broker closed")
        payload = _codec().build_call_payload(self._conn_uuid, msg_uuid, uri, args)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._call_batch.setdefault(call_key(uri), []).append((call_ttl_key(uri, msg_uuid), timeout_ms, payload, fut))
        if not self._call_flush_scheduled:
            self._call_flush_scheduled = True
            loop.call_soon(self._flush_calls)
        try:
            await fut
        except BrokerError:
            self.stats.call_failures += 1
            raise
        self.stats.calls += 1

    def _flush_calls(self) -> None:
        self._call_flush_scheduled = False
        groups, self._call_batch = self._call_batch, {}
        if groups:
            self._spawn(self._push_groups(groups, self.config.call_cap))

    async def _push_groups(
        self, groups: dict[str, list[tuple[str, int, bytes, asyncio.Future[Any]]]], cap: int
    ) -> None:
        """Push each list's items with one script run; settle each item's future."""
        try:
            await self._push_groups_now(groups, cap)
        finally:
            for items in groups.values():
                for *_, fut in items:
                    if not fut.done():
                        fut.set_exception(BrokerError("broker closed"))
                        fut.exception()

    async def _push_groups_now(
        self, groups: dict[str, list[tuple[str, int, bytes, asyncio.Future[Any]]]], cap: int
    ) -> None:
        if self.router.cluster:
            await asyncio.gather(*(self._push_group_cluster(k, items, cap) for k, items in groups.items()))
            return
        try:
            conn = await self.router.pool.connection()  # type: ignore[union-attr]
        except BaseException as exc:
            err = exc if isinstance(exc, BrokerError) else BrokerError(str(exc))
            for items in groups.values():
                for *_, fut in items:
                    if not fut.done():
                        fut.set_exception(err)
            if not isinstance(exc, Exception):
                raise
            return
        sent: list[tuple[Script, tuple[Any, ...], tuple[Any, ...], list[Any], asyncio.Future[Any]]] = []
        for list_key, items in groups.items():
            script, keys, argv = _push_script_run(list_key, items, cap)
            (f,) = conn.execute_packed(script.pack(keys, argv))
            sent.append((script, keys, argv, items, f))
        for script, keys, argv, items, f in sent:
            try:
                try:
                    reply = await f
                except RedisReplyError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        raise
                    (f2,) = conn.execute_packed(script.pack_eval(keys, argv))
                    reply = await f2
            except BrokerError as exc:  # RedisReplyError included
                _fail_pushes(items, exc)
                continue
            _settle_pushes(items, reply)

    async def _push_group_cluster(
        self, list_key: str, items: list[tuple[str, int, bytes, asyncio.Future[Any]]], cap: int
    ) -> None:
        """One list's items in one script run on the node of its slot, with
        the cluster's retries (MOVED/ASK/CLUSTERDOWN/connection errors).
        Scripts of one loop turn to one node still go out in one write."""
        script, keys, argv = _push_script_run(list_key, items, cap)
        try:
            reply = await self.router.run(list_key, lambda c: _evalsha(c, script, keys, argv))
        except BrokerError as exc:  # RedisReplyError included
            _fail_pushes(items, exc)
            return
        _settle_pushes(items, reply)

    def on_result(self, handler: ResultHandler) -> None:
        self._result_handler = handler
        if self._started and not self._closed:
            self._start_results()

    def _start_results(self) -> None:
        if self._results_task is None:
            self._results_task = asyncio.get_running_loop().create_task(
                self._results_loop(), name="juggler-redis-results"
            )

    async def _results_loop(self) -> None:
        key = result_key(self._conn_uuid)
        pops = self._blocking_pops(
            [key], self.config.result_batch, "results", lambda p: result_ttl_key(p.conn_uuid, p.msg_uuid)
        )
        try:
            async for parsed, pttls in pops:
                self._route_results(parsed, pttls)
        finally:
            await pops.aclose()

    def _route_results(self, parsed: list[Any], pttls: list[Any]) -> None:
        handler = self._result_handler
        for p, pttl in zip(parsed, pttls, strict=True):
            if isinstance(pttl, Exception) or pttl <= 0:
                self.stats.expired_results += 1
                continue
            self.stats.results_received += 1
            if handler is not None:
                try:
                    handler(Result(conn_uuid=p.conn_uuid, msg_uuid=p.msg_uuid, uri=p.uri, args=p.args))
                except Exception:
                    log.exception("result handler failed")

    async def _blocking_pops(
        self, keys: list[str], batch: int, what: str, ttl_key: Any, leftovers: list[tuple[bytes, bytes]] | None = None
    ) -> AsyncIterator[tuple[list[Any], list[Any]]]:
        """Yield (parsed payloads, their pop-check PTTLs) popped from `keys`, forever.

        One dedicated connection. With Redis >= 7 each batch's pop check and
        the next ``BLMPOP`` go out in one write on that connection (Redis
        runs the check, then blocks), so a batch costs one round trip. On
        failure it reconnects with a backoff. A pop whose reply is still in
        flight when the stream is cancelled or closed is not lost: with
        `leftovers` given, the pop is cut short with ``CLIENT UNBLOCK`` and
        whatever it popped (unchecked, TTL keys intact) is appended there;
        otherwise the reply goes to :meth:`_orphaned` when it comes.
        """
        backoff = 0.05
        conn: RespConnection | None = None
        block = self.config.block_timeout
        timeout = block + self.config.command_timeout
        fut: asyncio.Future[Any] | None = None

        keys = list(keys)

        def blocking_pop(c: RespConnection) -> asyncio.Future[Any]:
            # BLMPOP/BRPOP serve the first non-empty key: rotating the order
            # keeps one busy URI from starving the others
            if len(keys) > 1:
                keys.append(keys.pop(0))
            if self._has_blmpop:
                return c.execute("BLMPOP", block, len(keys), *keys, "RIGHT", "COUNT", batch, timeout=timeout)
            return c.execute("BRPOP", *keys, block, timeout=timeout)

        try:
            while not self._closed:
                if conn is None or conn.closed:
                    fut = None
                    if conn is not None:
                        self._blocking.discard(conn)
                        conn = None
                    try:
                        # a cluster: the node serving these keys' slot (they share one)
                        conn = await RespConnection.open(
                            self.router.address_for(keys[0]), connect_timeout=self.config.connect_timeout,
                            command_timeout=self.config.command_timeout,
                        )
                        self._blocking.add(conn)
                        client_id = await conn.execute("CLIENT", "ID")
                        backoff = 0.05
                    except BrokerError as exc:
                        if conn is not None:
                            self._blocking.discard(conn)
                            conn.close()
                            conn = None
                        self.router.request_refresh()
                        log.warning("%s listener: %s; retrying in %.2fs", what, exc, backoff)
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 2.0)
                        continue
                if fut is None:
                    fut = blocking_pop(conn)
                try:
                    reply = await asyncio.shield(fut)
                    fut = None
                except RedisReplyError as exc:
                    fut = None
                    if self._has_blmpop and "unknown command" in str(exc).lower():
                        self._has_blmpop = False
                        continue
                    if cluster_error_kind(exc) is not None:
                        # MOVED (failover, resharding), CLUSTERDOWN, …: reconnect
                        # where the slot map says (MOVED names the node)
                        self.router.note_error(exc)
                        conn.close()
                    log.warning("%s listener: %s", what, exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                except BrokerError as exc:
                    fut = None
                    self.router.request_refresh()
                    log.warning("%s listener lost its connection: %s", what, exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                if reply is None:
                    continue
                key, items = reply
                if self._has_blmpop:
                    payloads = list(items)
                else:
                    payloads = [items]
                    if batch > 1:
                        try:
                            more = await conn.execute("RPOP", key, batch - 1)
                        except BrokerError:
                            more = None
                        if more:
                            payloads.extend(more)
                parsed = _parse_payloads(payloads, what)
                if not parsed:
                    continue
                ttl_keys = [ttl_key(p) for p in parsed]
                script = POP_CHECK_MANY_SCRIPT if len(ttl_keys) > 1 else POP_CHECK_SCRIPT
                (check,) = conn.execute_packed(script.pack(ttl_keys, ()))
                if self._has_blmpop:
                    fut = blocking_pop(conn)  # same write as the check
                try:
                    pttls = await asyncio.shield(check)
                except asyncio.CancelledError:
                    if what == "calls":
                        # popped and being checked: put them back once the check answers
                        check.add_done_callback(lambda f, ps=parsed: self._requeue_checked(ps, f))
                    raise
                except RedisReplyError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        log.warning("pop check of %d %s failed, dropping them: %s", len(parsed), what, exc)
                        continue
                    try:
                        pttls = await self.router.pool_for(ttl_keys[0]).evalsha(script, ttl_keys, ())
                    except BrokerError as exc2:
                        log.warning("pop check of %d %s failed, dropping them: %s", len(parsed), what, exc2)
                        continue
                except BrokerError as exc:
                    log.warning("pop check of %d %s failed, dropping them: %s", len(parsed), what, exc)
                    continue
                if not isinstance(pttls, list):
                    pttls = [pttls]
                yield parsed, pttls
        finally:
            if conn is not None and fut is not None and leftovers is not None and not self.router.closed:
                # a pop is in flight: cut it short, keep what it popped
                try:
                    if not fut.done():
                        unblock = self.router.pool_for(keys[0]).execute("CLIENT", "UNBLOCK", client_id)
                        await asyncio.wait_for(unblock, 2.0)
                    reply = await asyncio.wait_for(asyncio.shield(fut), 2.0)
                    if reply:
                        k, items = reply
                        leftovers.extend((k, item) for item in (items if isinstance(items, list) else [items]))
                    fut = None
                except (BrokerError, TimeoutError):
                    pass  # the orphan path below
            if conn is not None:
                if fut is not None and what == "calls":
                    # a pop is in flight: the calls it may bring must not be lost
                    if fut.done():
                        self._orphaned(fut, conn)
                    else:
                        self._orphans.add(fut)
                        fut.add_done_callback(lambda f, c=conn: self._orphaned(f, c))
                else:
                    self._blocking.discard(conn)
                    conn.close()

    def _requeue_checked(self, parsed: list[Any], check: asyncio.Future[Any]) -> None:
        if self.router.closed or check.cancelled() or check.exception() is not None:
            return
        pttls = check.result()
        pttls = pttls if isinstance(pttls, list) else [pttls]
        now = time.monotonic()
        items = [(p, t, now) for p, t in zip(parsed, pttls, strict=True) if isinstance(t, int) and t > 0]
        if items:
            task = asyncio.get_running_loop().create_task(self._requeue(items))
            self._requeues.add(task)
            task.add_done_callback(self._requeues.discard)

    def _orphaned(self, fut: asyncio.Future[Any], conn: RespConnection) -> None:
        """The reply of a cancelled blocking pop: put calls back, drop results."""
        self._orphans.discard(fut)
        self._blocking.discard(conn)
        conn.close()
        if fut.cancelled() or fut.exception() is not None:
            return
        reply = fut.result()
        if not reply:
            return
        key, items = reply
        payloads = list(items) if isinstance(items, list) else [items]
        key_s = key.decode() if isinstance(key, bytes) else key
        if key_s.startswith("juggler:calls:") and not self.router.closed:
            task = asyncio.get_running_loop().create_task(self._requeue_raw(key_s, payloads))
            self._requeues.add(task)
            task.add_done_callback(self._requeues.discard)
        else:
            log.info("dropping %d popped payloads of %s after cancellation", len(payloads), key_s)

    async def _requeue_raw_list(self, popped: list[tuple[bytes, bytes]]) -> None:
        """Calls popped but never pop-checked (TTL keys intact), back to their lists as they were."""
        by_key: dict[str, list[bytes]] = {}
        for key, payload in popped:
            by_key.setdefault(key.decode(), []).append(payload)
        for key, items in by_key.items():
            await asyncio.shield(self._requeue_raw(key, items))

    async def _requeue_raw(self, list_key: str, payloads: list[bytes]) -> None:
        """Calls popped without a pop check yet: their TTL keys are intact, so
        they go back as they were (RPUSH: next to be popped)."""
        async def push(conn: RespConnection) -> None:
            await asyncio.gather(*[conn.execute("RPUSH", list_key, p) for p in reversed(payloads)])

        try:
            await self.router.run(list_key, push)
        except BrokerError as exc:
            log.warning("could not requeue %d calls on %s: %s", len(payloads), list_key, exc)

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
        pops = self._blocking_pops(
            keys, self.config.call_batch, "calls", lambda p: call_ttl_key(p.uri, p.msg_uuid), leftovers
        )
        try:
            async for parsed, pttls in pops:
                now = time.monotonic()
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
                    yield Call(conn_uuid=p.conn_uuid, msg_uuid=p.msg_uuid, uri=p.uri, args=p.args, ttl_ms=left)
        finally:
            await pops.aclose()
            if leftovers and not self.router.closed:
                # popped after the buffered ones: they go back first, the
                # buffered ones after them, so the list's order is kept
                await self._requeue_raw_list(leftovers)
            if buffered and not self.router.closed:
                items = list(buffered)
                buffered.clear()
                await self._requeue(items)

    async def _requeue(self, items: list[tuple[Any, int, float]]) -> None:
        codec = _codec()
        calls = []
        for p, pttl, at in reversed(items):
            left = pttl - int((time.monotonic() - at) * 1000)
            if left <= 0:
                self.stats.expired_calls += 1
                continue
            payload = codec.build_call_payload(p.conn_uuid, p.msg_uuid, p.uri, p.args)
            calls.append(((call_ttl_key(p.uri, p.msg_uuid), call_key(p.uri)), (left, payload)))
        if not calls:
            return
        try:
            if self.router.cluster:
                by_key: dict[str, list[Any]] = {}
                for c in calls:
                    by_key.setdefault(c[0][1], []).append(c)
                for list_key, cs in by_key.items():
                    await asyncio.shield(self.router.pool_for(list_key).evalsha_many(REQUEUE_SCRIPT, cs))
            else:
                await asyncio.shield(self.router.pool.evalsha_many(REQUEUE_SCRIPT, calls))  # type: ignore[union-attr]
        except BrokerError as exc:
            log.warning("could not requeue %d calls: %s", len(calls), exc)

    async def send_result(self, result: Result, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            return
        try:
            payload = _codec().build_call_payload(result.conn_uuid, result.msg_uuid, result.uri, result.args)
        except ValueError as exc:
            raise BrokerError(f"invalid result: {exc}") from exc
        keys = (result_ttl_key(result.conn_uuid, result.msg_uuid), result_key(result.conn_uuid))
        argv = (ttl_ms, payload, self.config.result_cap)
        try:
            await self.router.run(keys[1], lambda c: _evalsha(c, PUSH_SCRIPT, keys, argv))
        except RedisReplyError as exc:
            if CAPACITY_MESSAGE in str(exc):
                raise CapacityExceeded(CAPACITY_MESSAGE) from exc
            raise BrokerError(str(exc)) from exc
        self.stats.results_sent += 1

    async def send_results(self, batch: list[tuple[Result, int]]) -> list[BaseException | None]:
        """Store many results at once (one script run per caller's list);
        per-item outcome (None = stored)."""
        codec = _codec()
        loop = asyncio.get_running_loop()
        groups: dict[str, list[tuple[str, int, bytes, asyncio.Future[Any]]]] = {}
        futs = []
        for result, ttl_ms in batch:
            fut = loop.create_future()
            futs.append(fut)
            try:
                payload = codec.build_call_payload(result.conn_uuid, result.msg_uuid, result.uri, result.args)
            except ValueError as exc:  # not JSON, not a UUID: this item only
                fut.set_exception(BrokerError(f"invalid result: {exc}"))
                continue
            groups.setdefault(result_key(result.conn_uuid), []).append(
                (result_ttl_key(result.conn_uuid, result.msg_uuid), max(1, ttl_ms), payload, fut)
            )
        await self._push_groups(groups, self.config.result_cap)
        out: list[BaseException | None] = []
        for fut in futs:
            exc = fut.exception()
            if exc is None:
                self.stats.results_sent += 1
            out.append(exc)
        return out

    # PubSubBroker --------------------------------------------------------------

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> None:
        payload = _codec().build_pub_payload(msg_uuid, args)
        try:
            # a cluster: PUBLISH on any node reaches subscribers on every node
            await self.router.run(None, lambda c: c.execute("PUBLISH", channel, payload))
        except RedisReplyError as exc:
            raise BrokerError(str(exc)) from exc
        self.stats.published += 1

    async def subscribe(self, subscriber: object, channel: str, pattern: bool, handler: EventHandler) -> None:
        """Subscribe `subscriber`; returns once Redis has it subscribed.

        Sharing one Redis connection keeps Redis' own semantics: a new local
        subscriber gets exactly the messages published after its
        subscription took effect, as it would on a connection of its own. A
        first subscriber waits for Redis' SUBSCRIBE confirmation; joining a
        channel already subscribed waits for a PING sent behind it. Either
        barrier activates the subscriber in the same step that reads the
        reply, so no message slips between them.
        """
        key = (bool(pattern), channel)
        by = self._by_subscriber.setdefault(subscriber, set())
        sub = self._subs.get(key)
        if sub is not None and subscriber in sub.handlers:
            sub.handlers[subscriber] = handler  # subscribing twice counts once
            by.add(key)
            return
        by.add(key)
        try:
            conn = await self._pubsub_conn()
        except BrokerError:
            await self.unsubscribe(subscriber, channel, pattern)
            raise
        if key not in self._by_subscriber.get(subscriber, ()):
            return  # unsubscribed while we waited for the connection
        sub = self._subs.get(key)
        if sub is None:
            sub = self._subs[key] = _Sub()
        if subscriber in sub.handlers:
            sub.handlers[subscriber] = handler
            return
        sub.pending[subscriber] = handler
        loop = asyncio.get_running_loop()
        if sub.state == "subscribed":
            barrier = _Barrier(loop.create_future(), [(key, subscriber)])
            self._pings.append(barrier)
            conn.send_push("PING")
        elif sub.state == "subscribing" and sub.confirms:
            barrier = sub.confirms[-1]
            barrier.activate.append((key, subscriber))
        else:
            barrier = _Barrier(loop.create_future(), [(key, subscriber)])
            sub.confirms.append(barrier)
            sub.state = "subscribing"
            conn.send_push("PSUBSCRIBE" if pattern else "SUBSCRIBE", channel)
        try:
            await asyncio.wait_for(asyncio.shield(barrier.fut), self.config.command_timeout)
        except (BrokerError, TimeoutError) as exc:
            await self.unsubscribe(subscriber, channel, pattern)
            raise BrokerError(f"subscribe failed: {exc or 'no answer from Redis'}") from exc

    async def unsubscribe(self, subscriber: object, channel: str, pattern: bool) -> None:
        """Remove one subscription (a no-op when absent); no event reaches it afterwards."""
        key = (bool(pattern), channel)
        keys = self._by_subscriber.get(subscriber)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_subscriber[subscriber]
        sub = self._subs.get(key)
        if sub is None:
            return
        sub.handlers.pop(subscriber, None)
        sub.pending.pop(subscriber, None)
        if sub.handlers or sub.pending:
            return
        if sub.state != "idle":
            sub.state = "idle"
            conn = self._pubsub
            if conn is not None and not conn.closed:
                conn.send_push("PUNSUBSCRIBE" if pattern else "UNSUBSCRIBE", channel)
        if not sub.confirms:
            del self._subs[key]

    async def unsubscribe_all(self, subscriber: object) -> None:
        for pattern, channel in list(self._by_subscriber.get(subscriber, ())):
            await self.unsubscribe(subscriber, channel, pattern)

    async def _pubsub_conn(self) -> RespConnection:
        if self._closed:
            raise BrokerError("broker closed")
        if self._pubsub_task is None:
            self._pubsub_ready = asyncio.Event()
            self._pubsub_task = asyncio.get_running_loop().create_task(self._pubsub_loop(), name="juggler-redis-pubsub")
        assert self._pubsub_ready is not None
        if not (self._pubsub is not None and not self._pubsub.closed):
            try:
                await asyncio.wait_for(self._pubsub_ready.wait(), self.config.connect_timeout)
            except TimeoutError:
                raise BrokerError("no pub-sub connection to Redis") from None
        assert self._pubsub is not None
        if self._pubsub.closed:
            raise BrokerError("the pub-sub connection to Redis is down")
        return self._pubsub

    async def _pubsub_loop(self) -> None:
        """Keep the one pub-sub connection up; re-subscribe after a reconnect."""
        backoff = 0.05
        assert self._pubsub_ready is not None
        loop = asyncio.get_running_loop()
        while not self._closed:
            lost = loop.create_future()
            try:
                conn = await RespConnection.open(
                    self.router.pubsub_address(), connect_timeout=self.config.connect_timeout, command_timeout=None,
                    on_push=self._on_push,
                    on_close=lambda c, exc: lost.done() or lost.set_result(exc),
                )
            except BrokerError as exc:
                self.router.request_refresh()
                log.warning("pub-sub connection: %s; retrying in %.2fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            self._pubsub = conn
            # re-subscribe what local subscribers still want (after a reconnect)
            for (pattern, channel), sub in list(self._subs.items()):
                if sub.handlers:
                    sub.confirms.append(_Barrier(loop.create_future()))
                    sub.state = "subscribing"
                    conn.send_push("PSUBSCRIBE" if pattern else "SUBSCRIBE", channel)
            self._pubsub_ready.set()
            try:
                exc = await self._watch_pubsub(conn, lost)
            finally:
                conn.close()
            self._pubsub_ready.clear()
            self.stats.redis_subscriptions = 0
            # what was in flight will never be answered: subscribers waiting
            # for it fail (their SUB gets NACK 500); active ones are
            # re-subscribed by the reconnect
            err = BrokerError("pub-sub connection lost")
            pings, self._pings = self._pings, deque()
            for b in pings:
                _fail_future(b.fut, err)
            for key, sub in list(self._subs.items()):
                while sub.confirms:
                    _fail_future(sub.confirms.popleft().fut, err)
                sub.state = "idle"
                if not sub.handlers and not sub.pending:
                    del self._subs[key]
            if not self._closed:
                self.router.request_refresh()
                log.warning("pub-sub connection lost (%s); reconnecting", exc)

    async def _watch_pubsub(self, conn: RespConnection, lost: asyncio.Future[Any]) -> Any:
        """Wait until the pub-sub connection is lost; a PING every
        ``pubsub_health_interval`` s that gets no answer by the next one
        declares a silently dead connection lost (then it reconnects)."""
        loop = asyncio.get_running_loop()
        probe: _Barrier | None = None
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(lost), self.config.pubsub_health_interval)
            except TimeoutError:
                pass
            if probe is not None and not probe.fut.done():
                log.warning("pub-sub connection: no answer to PING; reconnecting")
                conn.close()
                return await lost
            probe = _Barrier(loop.create_future())
            self._pings.append(probe)
            conn.send_push("PING")

    def _activate(self, barrier: _Barrier) -> None:
        for key, subscriber in barrier.activate:
            sub = self._subs.get(key)
            if sub is not None:
                handler = sub.pending.pop(subscriber, None)
                if handler is not None:
                    sub.handlers[subscriber] = handler
        if not barrier.fut.done():
            barrier.fut.set_result(None)

    def _on_push(self, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            if reply == b"PONG" and self._pings:  # PING outside subscribed mode
                self._activate(self._pings.popleft())
            return
        kind = reply[0]
        if kind == b"message":
            ch = reply[1].decode("utf-8", "replace")
            self._deliver(ch, None, ch, reply[2])
            return
        if kind == b"pmessage":
            pat = reply[1].decode("utf-8", "replace")
            self._deliver(reply[2].decode("utf-8", "replace"), pat, pat, reply[3])
            return
        if kind in (b"subscribe", b"psubscribe"):
            key = (kind == b"psubscribe", reply[1].decode("utf-8", "replace"))
            self.stats.redis_subscriptions = int(reply[2])
            sub = self._subs.get(key)
            if sub is not None and sub.confirms:
                self._activate(sub.confirms.popleft())
                if not sub.confirms and sub.state == "subscribing":
                    sub.state = "subscribed"
                if not sub.confirms and not sub.handlers and not sub.pending and sub.state == "idle":
                    del self._subs[key]
            return
        if kind in (b"unsubscribe", b"punsubscribe"):
            self.stats.redis_subscriptions = int(reply[2])
            return
        if kind == b"pong" and self._pings:
            self._activate(self._pings.popleft())

    def _deliver(self, channel: str, pattern: str | None, sub_name: str, data: bytes) -> None:
        sub = self._subs.get((pattern is not None, sub_name))
        if sub is None or not sub.handlers:
            return
        try:
            msg_uuid, args = _codec().parse_pub_payload(data)
        except ValueError as exc:
            log.debug("dropping an invalid pub-sub payload on %s: %s", channel, exc)
            return
        event = Event(channel=channel, pattern=pattern, msg_uuid=msg_uuid, args=args)
        for handler in list(sub.handlers.values()):
            self.stats.events += 1
            try:
                handler(event)
            except Exception:
                log.exception("event handler failed")


async def _evalsha(conn: RespConnection, script: Script, keys: Any, argv: Any) -> Any:
    """EVALSHA on `conn`, EVAL on NOSCRIPT (a promoted replica may not have the script)."""
    (f,) = conn.execute_packed(script.pack(keys, argv))
    try:
        return await f
    except RedisReplyError as exc:
        if not str(exc).startswith("NOSCRIPT"):
            raise
    (f,) = conn.execute_packed(script.pack_eval(keys, argv))
    return await f


def _parse_payloads(payloads: list[bytes], what: str) -> list[Any]:
    """Parse call/result payloads in one crossing into Rust; invalid ones are logged and dropped."""
    parsed = _codec().parse_call_payloads(payloads)
    good = [p for p in parsed if p is not None]
    if len(good) != len(parsed):
        log.warning("dropping %d invalid %s payloads", len(parsed) - len(good), what)
    return good


def _fail_future(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()  # retrieved: nobody may be waiting any more


def _redis_version(info: bytes) -> tuple[int, ...]:
    for line in info.split(b"\r\n"):
        if line.startswith(b"redis_version:"):
            try:
                return tuple(int(x) for x in line.split(b":", 1)[1].split(b".")[:3])
            except ValueError:
                break
    return (0, 0, 0)


def _push_script_run(
    list_key: str, items: list[tuple[str, int, bytes, asyncio.Future[Any]]], cap: int
) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
    """The script, keys and argv that push ``items`` (ttl key, ms, payload,
    future) onto one calls list: the upstream single-call script for one
    item, the batch script for more (one round trip either way)."""
    if len(items) == 1:
        ttl_key, ms, payload, _ = items[0]
        return PUSH_SCRIPT, (ttl_key, list_key), (ms, payload, cap)
    keys = (list_key, *(it[0] for it in items))
    argv = (cap, *(x for it in items for x in (it[1], it[2])))
    return PUSH_MANY_SCRIPT, keys, argv


def _fail_pushes(items: list[Any], exc: BrokerError) -> None:
    """Fail every call of one push script run: a Redis error reply becomes
    CapacityExceeded ("list capacity exceeded") or BrokerError (NACK 500)."""
    err: BrokerError
    if not isinstance(exc, RedisReplyError):
        err = exc  # already a BrokerError (e.g. the connection failed)
    elif CAPACITY_MESSAGE in str(exc):
        err = CapacityExceeded(CAPACITY_MESSAGE)
    else:
        err = BrokerError(str(exc))
    for *_, fut in items:
        if not fut.done():
            fut.set_exception(err)


def _settle_pushes(items: list[Any], reply: Any) -> None:
    """Resolve each call of one push script run from its reply: the list
    length, or 0 when that entry was trimmed for capacity."""
    replies = reply if isinstance(reply, list) else [reply]
    for (*_, fut), n in zip(items, replies, strict=True):
        if fut.done():
            continue
        if n == 0:
            fut.set_exception(CapacityExceeded(CAPACITY_MESSAGE))
        else:
            fut.set_result(n)
