"""Where each key of the Redis broker lives: one Redis, or a Redis Cluster.

The broker talks to Redis through a *router*: ``pool_for(key)`` gives the
command pool of the node serving that key's hash slot, ``address_for(key)``
its address (blocking pops and the pub-sub connection open connections of
their own), and ``run(key, fn)`` runs one operation with the cluster's
retries.

- :class:`SingleRouter` — one Redis: every key maps to one pool; ``run``
  does not retry (the original's behaviour on one Redis).
- :class:`ClusterRouter` — a Redis Cluster. Topology (slot → primary) comes
  from redis-py's asyncio cluster client (``redis.asyncio.cluster.
  RedisCluster``: ``CLUSTER SLOTS``/``SHARDS`` from the seed nodes, its
  node manager's refresh logic). The hot path keeps the pipelined
  hiredis-based connections of ``resp.py``, one small pool per primary:
  redis-py's cluster client costs several times more CPU per command (it
  re-parses every command to find its keys), and every command of ours
  already knows its slot. ``run`` follows ``MOVED`` (updates that slot at
  once, and refreshes the map in the background), ``ASK`` (``ASKING`` + the
  command on the named node, pipelined), and retries ``CLUSTERDOWN``,
  ``TRYAGAIN``, ``LOADING``, ``READONLY`` and connection errors with an
  exponential backoff and a map refresh, for at most ``retry_timeout``
  seconds (then the error goes to the caller: the server's NACK 500).
  Pools of nodes that are no longer primaries are closed at each refresh, so
  a dead master's connections are not kept.

Pub-sub on a cluster is classic pub-sub: ``PUBLISH`` on any node reaches
subscribers on every node, so the broker's one pub-sub connection goes to
one node (``pubsub_address``), and moves to another on failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from juggler.broker.resp import (
    RedisAddress,
    RedisConnectionError,
    RedisOutcomeUnknown,
    RedisReplyError,
    RespConnection,
    RespPool,
)
from rustext.backoff import Backoff, BackoffPolicy
from rustext.tls import ClientTls

__all__ = ["ClusterRouter", "SingleRouter", "cluster_error_kind", "key_slot"]

log = logging.getLogger("juggler.broker.redis")

T = TypeVar("T")

#: how :meth:`ClusterRouter.run` spaces its retries (each delay jittered; the
#: deadline ``retry_timeout`` bounds them all)
RETRY_BACKOFF = BackoffPolicy(initial=0.02, maximum=0.5)

_RETRY_PREFIXES = ("CLUSTERDOWN", "TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN")


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of `key` (hash tags honoured)."""
    k = key.encode() if isinstance(key, str) else key
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1 : end]
    return _crc16(k) % 16384


def hash_tagged(prefix: str, name: str) -> str:
    """The key ``PREFIX{NAME}``: every key of `name` built this way lands in one
    cluster slot. A name whose hash tag would be empty (empty, or starting with
    ``}``) gets the fixed tag ``{!}`` in a key form no other name can produce,
    so its keys still share a slot."""
    if not name or name[0] == "}":
        return prefix + "!{!}" + name
    return prefix + "{" + name + "}"


def cluster_error_kind(exc: BaseException) -> str | None:
    """``"MOVED"``, ``"ASK"``, ``"RETRY"`` (cluster busy/down, connection
    lost) or None (an error of the command itself: not retried)."""
    if isinstance(exc, RedisOutcomeUnknown):
        return None  # it may have run: a push or a PUBLISH retried could happen twice
    if isinstance(exc, RedisConnectionError):
        return "RETRY"
    if isinstance(exc, RedisReplyError):
        msg = str(exc)
        if msg.startswith("MOVED "):
            return "MOVED"
        if msg.startswith("ASK "):
            return "ASK"
        if msg.startswith(_RETRY_PREFIXES):
            return "RETRY"
    return None


def _redirect(msg: str) -> tuple[int, str, int]:
    """``MOVED 3999 127.0.0.1:6381`` → (3999, host, port)."""
    _, slot, addr = msg.split()[:3]
    host, _, port = addr.rpartition(":")
    return int(slot), host.strip("[]") or "127.0.0.1", int(port)


class SingleRouter:
    """One Redis: every key is served by one pool."""

    cluster = False

    def __init__(self, address: RedisAddress, *, pool_size: int, command_timeout: float,
                 connect_timeout: float) -> None:
        self.address = address
        self.pool = RespPool(address, size=pool_size, command_timeout=command_timeout,
                             connect_timeout=connect_timeout)

    async def start(self) -> None:
        pass

    def pool_for(self, key: str | None) -> RespPool:
        return self.pool

    def address_for(self, key: str | None) -> RedisAddress:
        return self.address

    def primary_pools(self) -> list[RespPool]:
        return [self.pool]

    def pubsub_address(self) -> RedisAddress:
        return self.address

    def request_refresh(self) -> None:
        pass

    def note_error(self, exc: BaseException) -> None:
        pass

    async def run(self, key: str | None, fn: Callable[[RespConnection], Awaitable[T]]) -> T:
        return await fn(await self.pool.connection())

    @property
    def closed(self) -> bool:
        return self.pool.closed

    @property
    def connections(self) -> int:
        return sum(1 for c in self.pool._conns if not c.closed)

    def describe(self) -> str:
        return str(self.address)

    async def aclose(self) -> None:
        await self.pool.aclose()


class ClusterRouter:
    """A Redis Cluster (see the module doc)."""

    cluster = True

    def __init__(self, seeds: Sequence[str], *, pool_size: int, command_timeout: float,
                 connect_timeout: float, retry_timeout: float = 10.0, tls: ClientTls | None = None) -> None:
        if not seeds:
            raise ValueError("no cluster seed node")
        self.seeds = [RedisAddress.from_url(u, tls=tls) for u in seeds]
        tmpl = self.seeds[0]
        self._tmpl = tmpl
        self.pool_size = pool_size
        self.command_timeout = command_timeout
        self.connect_timeout = connect_timeout
        self.retry_timeout = retry_timeout
        self._slots: list[RedisAddress | None] = [None] * 16384
        self._primaries: list[RedisAddress] = []
        self._pools: dict[tuple[str, int], RespPool] = {}
        self._client: Any = None
        self._refreshing: asyncio.Task[None] | None = None
        self._last_refresh = 0.0
        self._pubsub_index = random.randrange(1 << 16)
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        self.refreshes = 0  # topology refreshes done (a metric)
        self.redirects = 0  # MOVED/ASK followed
        self.retries = 0  # operations retried (CLUSTERDOWN, connection errors, …)

    # topology -----------------------------------------------------------------

    async def start(self) -> None:
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        t = self._tmpl
        tls: dict[str, Any] = {}
        if t.tls is not None:  # the topology client reaches the nodes as ours do
            tls = dict(ssl=True, **t.tls.redis_kwargs())
        self._client = RedisCluster(
            startup_nodes=[ClusterNode(a.host, a.port) for a in self.seeds],
            username=t.username, password=t.password,
            socket_connect_timeout=self.connect_timeout, socket_timeout=self.command_timeout,
            require_full_coverage=False, **tls,
        )
        try:
            await self._client.initialize()
        except Exception as exc:
            await self._client.aclose()
            raise RedisConnectionError(f"cannot reach the Redis Cluster at {self.describe()}: {exc}") from exc
        self._snapshot()

    def _addr(self, host: str, port: int) -> RedisAddress:
        return self._tmpl.at(host, port)

    def _snapshot(self) -> None:
        nm = self._client.nodes_manager
        slots: list[RedisAddress | None] = [None] * 16384
        primaries: dict[tuple[str, int], RedisAddress] = {}
        for slot, nodes in nm.slots_cache.items():
            if nodes:
                n = nodes[0]
                a = primaries.get((n.host, n.port))
                if a is None:
                    a = primaries[(n.host, n.port)] = self._addr(n.host, n.port)
                slots[slot] = a
        self._slots = slots
        self._primaries = list(primaries.values())
        self._last_refresh = time.monotonic()
        for hp in list(self._pools):
            if hp not in primaries:
                pool = self._pools.pop(hp)
                task = asyncio.get_running_loop().create_task(pool.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def refresh(self) -> None:
        """Re-read the slot map (single flight: concurrent callers share one)."""
        if self._closed:
            return
        if self._refreshing is None:
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        task = self._refreshing
        await asyncio.shield(task)

    async def _refresh(self) -> None:
        try:
            async with asyncio.timeout(self.command_timeout):  # not wait_for (3.11)
                await self._client.nodes_manager.initialize()
            self.refreshes += 1
            self._snapshot()
        except Exception as exc:
            log.warning("cluster: slot map refresh failed: %s", exc)
        finally:
            self._refreshing = None

    def request_refresh(self) -> None:
        """Refresh in the background (at most one at a time, and not more than 10/s)."""
        if self._closed or self._refreshing is not None or time.monotonic() - self._last_refresh < 0.1:
            return
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    def note_error(self, exc: BaseException) -> None:
        """An error seen outside :meth:`run` (e.g. by a blocking pop): learn
        from a MOVED at once, refresh the map for any cluster error."""
        kind = cluster_error_kind(exc)
        if kind == "MOVED":
            self.redirects += 1
            slot, host, port = _redirect(str(exc))
            self._slots[slot] = self._addr(host, port)
        if kind is not None:
            self.request_refresh()

    # routing ------------------------------------------------------------------

    def address_for(self, key: str | None) -> RedisAddress:
        if key is None:
            if not self._primaries:
                raise RedisConnectionError("no Redis Cluster primary known")
            return self._primaries[0]
        a = self._slots[key_slot(key)]
        if a is None:
            raise RedisConnectionError(f"CLUSTERDOWN no node serves the slot of {key}")
        return a

    def _pool(self, a: RedisAddress) -> RespPool:
        pool = self._pools.get((a.host, a.port))
        if pool is None:
            if self._closed:
                raise RedisConnectionError("broker closed")
            pool = self._pools[(a.host, a.port)] = RespPool(
                a, size=self.pool_size, command_timeout=self.command_timeout, connect_timeout=self.connect_timeout
            )
        return pool

    def pool_for(self, key: str | None) -> RespPool:
        return self._pool(self.address_for(key))

    def primary_pools(self) -> list[RespPool]:
        return [self._pool(a) for a in self._primaries]

    def pubsub_address(self) -> RedisAddress:
        """A node for the pub-sub connection; the next one at each call (after a failure)."""
        if not self._primaries:
            raise RedisConnectionError("no Redis Cluster primary known")
        self._pubsub_index += 1
        return self._primaries[self._pubsub_index % len(self._primaries)]

    async def run(self, key: str | None, fn: Callable[[RespConnection], Awaitable[T]]) -> T:
        """``fn(conn)`` on the node of `key`, following redirections and
        retrying cluster/connection errors for up to ``retry_timeout`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_timeout
        backoff = Backoff(RETRY_BACKOFF)
        ask: RedisAddress | None = None
        redirects = 0
        while True:
            try:
                if ask is not None:
                    conn = await self._pool(ask).connection()
                    asking = conn.execute("ASKING")
                    asking.add_done_callback(_quiet)
                    ask = None
                else:
                    conn = await self.pool_for(key).connection()
                return await fn(conn)
            except (RedisReplyError, RedisConnectionError) as exc:
                kind = cluster_error_kind(exc)
                if kind is None or self._closed:
                    raise
                # redirections are followed at once, a few times in a row; then
                # (nodes that disagree during a failover) with the backoff
                redirects += 1
                if kind == "MOVED":
                    self.redirects += 1
                    slot, host, port = _redirect(str(exc))
                    self._slots[slot] = self._addr(host, port)
                    self.request_refresh()
                    if redirects <= 4 and loop.time() < deadline:
                        continue
                elif kind == "ASK":
                    self.redirects += 1
                    _, host, port = _redirect(str(exc))
                    ask = self._addr(host, port)
                    if redirects <= 4 and loop.time() < deadline:
                        continue
                else:
                    self.request_refresh()
                self.retries += 1
                delay = backoff.next_delay()
                if loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connections(self) -> int:
        return sum(1 for p in self._pools.values() for c in p._conns if not c.closed)

    def describe(self) -> str:
        return "cluster " + ",".join(f"{a.host}:{a.port}" for a in self.seeds)

    async def aclose(self) -> None:
        self._closed = True
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.wait([self._refreshing])
        for pool in self._pools.values():
            await pool.aclose()
        self._pools.clear()
        if self._client is not None:
            await self._client.aclose()


def _quiet(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
