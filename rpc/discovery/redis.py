"""Redis registry: servers register with a TTL and heartbeat; clients watch.

Layout (``base`` defaults to ``/rpcx``, like rpcx's registry plugins)::

    {base}/{service}/{address}   string  = metadata, expires after ``ttl`` (PX)
    {base}/{service}             set     of addresses (the index)
    {base}/{service}             channel "add <address>" / "del <address>"

A server's registrar SETs its key with a TTL, adds it to the index and
publishes "add"; a heartbeat renews the TTL every ``ttl / 3``; unregistering
(at shutdown, before the server stops accepting) deletes the key, removes it
from the index and publishes "del". A crashed server's key expires after
``ttl``.

A client's ``RedisDiscovery`` fetches the index and the keys in one Lua
script (which also drops index entries whose key expired), re-fetches at
once on every message of the channel, and at least every
``refresh_interval`` seconds (which is how expiries are seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from rustext.tls import ClientTls

from rpc.discovery.base import WatchingDiscovery, stop_heartbeat_and_unregister
from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable

log = logging.getLogger("rpc.discovery.redis")

_FETCH = """
local members = redis.call('SMEMBERS', KEYS[1])
local out = {}
for _, addr in ipairs(members) do
  local meta = redis.call('GET', KEYS[1] .. '/' .. addr)
  if meta then
    table.insert(out, addr)
    table.insert(out, meta)
  else
    redis.call('SREM', KEYS[1], addr)
  end
end
return out
"""


#: seconds closing a connection may take
CLOSE_TIMEOUT = 2.0


def _client(url_or_client: str | aioredis.Redis, tls: ClientTls | None = None) -> tuple[aioredis.Redis, bool]:
    """A client of its own for a URL (``rediss://`` for TLS, checked as
    ``tls`` says: its CA, a client certificate), or the caller's client."""
    if isinstance(url_or_client, str):
        extra: dict[str, Any] = {}
        if tls is not None:
            if not url_or_client.startswith("rediss://"):
                raise ValueError("TLS options need a rediss:// Redis URL")
            tls.context()  # a bad file is reported now, naming it
            extra = tls.redis_kwargs()
        return aioredis.Redis.from_url(url_or_client, socket_timeout=5.0, socket_connect_timeout=5.0, **extra), True
    if tls is not None:
        raise ValueError("TLS options apply to a Redis URL, not to a client given ready-made")
    return url_or_client, False


def _wrap(exc: Exception) -> RegistryError:
    if isinstance(exc, (ConnectionError, OSError)) or type(exc).__name__ in ("ConnectionError", "TimeoutError"):
        return RegistryUnavailable(f"redis: {exc}")
    return RegistryError(f"redis: {exc}")


class RedisRegistrar:
    """Server side: register (service, address, metadata) with TTL + heartbeat."""

    def __init__(
        self,
        redis: str | aioredis.Redis,
        *,
        base: str = "/rpcx",
        ttl: float = 10.0,
        heartbeat: float | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be > 0")
        self._redis, self._owned = _client(redis, tls)
        self.base = base.rstrip("/")
        self.ttl = ttl
        self.heartbeat = heartbeat if heartbeat is not None else ttl / 3
        if not 0 < self.heartbeat < ttl:
            raise ValueError("heartbeat must be in (0, ttl)")
        self._entries: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def _index(self, service: str) -> str:
        return f"{self.base}/{service}"

    async def _put(self, service: str, address: str, metadata: str, announce: bool) -> None:
        index = self._index(service)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(f"{index}/{address}", metadata, px=int(self.ttl * 1000))
            pipe.sadd(index, address)
            if announce:
                pipe.publish(index, f"add {address}")
            await pipe.execute()

    async def register(self, service: str, address: str, metadata: str = "") -> None:
        if self._closed:
            raise RegistryError("registrar is closed")
        try:
            await self._put(service, address, metadata, announce=True)
        except RedisError as exc:
            raise _wrap(exc) from exc
        self._entries[(service, address)] = metadata
        if self._task is None:
            self._task = asyncio.create_task(self._heartbeat_loop(), name="redis-registrar-heartbeat")

    async def unregister(self, service: str, address: str) -> None:
        self._entries.pop((service, address), None)
        index = self._index(service)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(f"{index}/{address}")
                pipe.srem(index, address)
                pipe.publish(index, f"del {address}")
                await pipe.execute()
        except RedisError as exc:
            raise _wrap(exc) from exc

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            for (service, address), metadata in list(self._entries.items()):
                try:
                    # re-adding to the index heals a client's cleanup race; no announce
                    await self._put(service, address, metadata, announce=False)
                except RedisError as exc:
                    log.warning("heartbeat of %s %s failed: %s", service, address, exc)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        await stop_heartbeat_and_unregister(self, task, list(self._entries), log)
        if self._owned:
            await self._redis.aclose()


class RedisDiscovery(WatchingDiscovery):
    """Client side: the servers of ``service``, kept current (see module doc)."""

    def __init__(
        self,
        redis: str | aioredis.Redis,
        service: str,
        *,
        base: str = "/rpcx",
        refresh_interval: float = 0.5,
        cache: FileCache | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        super().__init__(refresh_interval=refresh_interval, cache=cache)
        self._redis, self._owned = _client(redis, tls)
        self.service = service
        self.index = f"{base.rstrip('/')}/{service}"
        self._script = self._redis.register_script(_FETCH)

    async def _fetch(self) -> dict[str, str]:
        try:
            flat = await self._script(keys=[self.index])
        except RedisError as exc:
            raise _wrap(exc) from exc
        out: dict[str, str] = {}
        for i in range(0, len(flat) - 1, 2):
            addr, meta = flat[i], flat[i + 1]
            out[addr.decode() if isinstance(addr, bytes) else addr] = (
                meta.decode() if isinstance(meta, bytes) else meta
            )
        return out

    async def _watch(self, changed: asyncio.Event) -> None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self.index)
            changed.set()  # anything published before we subscribed is picked up by a fetch
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None:
                    changed.set()
        finally:
            # bounded: closing a TLS connection can wait for a close_notify that never comes
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await pubsub.aclose()

    async def _close_backend(self) -> None:
        if self._owned:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._redis.aclose()
