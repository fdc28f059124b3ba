"""Redis registry: servers register with a TTL and heartbeat; clients watch.

Two layouts of the keys (``base`` defaults to ``/rpcx``, like rpcx's):

``layout="libkv"`` (the default) is Go rpcx's: what its
``serverplugin.RedisRegisterPlugin`` writes and rpcx-redis's
``RedisDiscovery`` reads, both through github.com/rpcxio/libkv v0.5.1
(keys and values: ``rpc.discovery.libkv``)::

    /{base}                     string  KVPair("rpcx_path"), no TTL
    /{base}/{service}           string  KVPair(service), no TTL
    /{base}/{service}/{address} string  KVPair(metadata), expires after ``ttl``

Registering writes the three keys, as the plugin does; the heartbeat renews
the server key's TTL every ``heartbeat`` seconds, keeping its value (an edit
made in Redis, such as ``state=inactive``, stays, as with the plugin, which
re-reads the value at each update) and re-creating it if it vanished;
unregistering deletes it (the directories stay: Go's discovery needs them).
A client lists the service directory (SCAN + MGET, as libkv's ``List``) and
watches it as libkv's ``WatchTree`` does: keyspace notifications of keys
under it (``PSUBSCRIBE __keyspace@DB__:/{base}/{service}/*``), which needs
``notify-keyspace-events`` to include ``K`` and the ``g$x`` events; like
libkv, the client turns them on if they are off (``CONFIG SET``), and when it
cannot, changes are seen at the next periodic refresh.

``layout="juggler"`` is this package's earlier one, for servers and clients
of that release::

    {base}/{service}/{address}   string  = metadata, expires after ``ttl``
    {base}/{service}             set     of addresses (the index)
    {base}/{service}             channel "add <address>" / "del <address>"

Either way a crashed server's key expires after ``ttl``; a client re-fetches
on every notification and at least every ``refresh_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Literal, get_args

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError, ResponseError

from rpc.discovery import libkv
from rpc.discovery.base import (
    WatchingDiscovery,
    _end_if_cancelled,
    heartbeat_loop,
    stop_heartbeat_and_unregister,
)
from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable
from rustext.tls import ClientTls

log = logging.getLogger("rpc.discovery.redis")

#: how keys are laid out: Go rpcx's (libkv) or this package's earlier one
Layout = Literal["libkv", "juggler"]
LAYOUTS: tuple[str, ...] = get_args(Layout)

#: seconds closing a connection may take
CLOSE_TIMEOUT = 2.0

#: keys asked per SCAN round when listing a service
SCAN_COUNT = 100

_JUGGLER_FETCH = """
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

# renew a server key's TTL, keeping its value; re-create it when it vanished
_LIBKV_RENEW = """
if redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


def check_layout(layout: str) -> Layout:
    """``layout`` if it names one; else ValueError listing them."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown Redis registry layout {layout!r} (expected {' or '.join(LAYOUTS)})")
    return layout  # type: ignore[return-value]


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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisRegistrar:
    """Server side: register (service, address, metadata) with TTL + heartbeat
    (``heartbeat`` defaults to ``ttl / 3``; Go's plugin renews every
    ``UpdateInterval`` with a TTL of twice that)."""

    def __init__(
        self,
        redis: str | aioredis.Redis,
        *,
        base: str = "/rpcx",
        ttl: float = 10.0,
        heartbeat: float | None = None,
        tls: ClientTls | None = None,
        layout: Layout = "libkv",
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be > 0")
        self.layout = check_layout(layout)
        self._redis, self._owned = _client(redis, tls)
        # libkv: the base as given, as Go's plugin formats it; juggler: without a trailing slash
        self.base = base if layout == "libkv" else base.rstrip("/")
        self.ttl = ttl
        self.heartbeat = heartbeat if heartbeat is not None else ttl / 3
        if not 0 < self.heartbeat < ttl:
            raise ValueError("heartbeat must be in (0, ttl)")
        self._now_ns = now_ns
        self._entries: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._renew = self._redis.register_script(_LIBKV_RENEW)

    # -- libkv ---------------------------------------------------------------

    def _pair(self, path: str, value: bytes) -> bytes:
        return libkv.encode_pair(libkv.KVPair(key=path, value=value, last_index=libkv.sequence_num(self._now_ns())))

    def _put_dirs(self, pipe: Any, service: str) -> None:
        """The base and service "directories", written before each change as Go's plugin does."""
        pipe.set(libkv.normalize(self.base), self._pair(self.base, libkv.BASE_DIR_VALUE))
        path = libkv.service_path(self.base, service)
        pipe.set(libkv.normalize(path), self._pair(path, service.encode()))

    # -- juggler -------------------------------------------------------------

    def _index(self, service: str) -> str:
        return f"{self.base}/{service}"

    async def _put_juggler(self, service: str, address: str, metadata: str, announce: bool) -> None:
        index = self._index(service)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(f"{index}/{address}", metadata, px=int(self.ttl * 1000))
            pipe.sadd(index, address)
            if announce:
                pipe.publish(index, f"add {address}")
            await pipe.execute()

    # -- both ----------------------------------------------------------------

    async def register(self, service: str, address: str, metadata: str = "") -> None:
        if self._closed:
            raise RegistryError("registrar is closed")
        try:
            if self.layout == "libkv":
                path = libkv.server_path(self.base, service, address)
                async with self._redis.pipeline(transaction=True) as pipe:
                    self._put_dirs(pipe, service)
                    pipe.set(libkv.normalize(path), self._pair(path, metadata.encode()), px=int(self.ttl * 1000))
                    await pipe.execute()
            else:
                await self._put_juggler(service, address, metadata, announce=True)
        except RedisError as exc:
            raise _wrap(exc) from exc
        self._entries[(service, address)] = metadata
        if self._task is None:
            self._task = asyncio.create_task(
                heartbeat_loop(self.heartbeat, self._beat_all, "redis heartbeat", log), name="redis-registrar-heartbeat")

    async def unregister(self, service: str, address: str) -> None:
        self._entries.pop((service, address), None)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if self.layout == "libkv":
                    self._put_dirs(pipe, service)
                    pipe.delete(libkv.normalize(libkv.server_path(self.base, service, address)))
                else:
                    index = self._index(service)
                    pipe.delete(f"{index}/{address}")
                    pipe.srem(index, address)
                    pipe.publish(index, f"del {address}")
                await pipe.execute()
        except RedisError as exc:
            raise _wrap(exc) from exc

    async def _beat(self, service: str, address: str, metadata: str) -> None:
        if self.layout == "libkv":
            path = libkv.server_path(self.base, service, address)
            recreated = await self._renew(keys=[libkv.normalize(path)],
                                          args=[self._pair(path, metadata.encode()), int(self.ttl * 1000)])
            if recreated:
                log.info("registry entry of %s %s had vanished: re-created", service, address)
        else:
            # re-adding to the index heals a client's cleanup race; no announce
            await self._put_juggler(service, address, metadata, announce=False)

    async def _beat_all(self) -> None:
        """One heartbeat of every entry; one failing does not skip the others."""
        for (service, address), metadata in list(self._entries.items()):
            try:
                await self._beat(service, address, metadata)
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


async def ensure_keyspace_events(redis: aioredis.Redis) -> str | None:
    """Turn on the keyspace notifications a libkv watch needs (``K`` with
    ``g``, ``$`` and ``x``, or ``A``), adding to the flags already set, as
    libkv's client turns them on (it sets ``KEA``). None when they are on;
    else why Redis refused (CONFIG renamed away, or not allowed to this
    user). A connection error is raised: the watch is retried."""
    try:
        reply = await redis.config_get("notify-keyspace-events")
        current = next((_text(v) for v in reply.values()), "")
        flags = set(current)
        missing = ({"K"} | (set() if "A" in flags else {"g", "$", "x"})) - flags
        if missing:
            await redis.config_set("notify-keyspace-events", current + "".join(sorted(missing)))
    except ResponseError as exc:
        return str(exc)
    return None


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
        layout: Layout = "libkv",
    ) -> None:
        self.layout = check_layout(layout)
        super().__init__(refresh_interval=refresh_interval, cache=cache)
        self._redis, self._owned = _client(redis, tls)
        self.service = service
        self.base = base
        self.index = f"{base.rstrip('/')}/{service}"
        self._prefix = libkv.servers_prefix(base, service)
        self._script = self._redis.register_script(_JUGGLER_FETCH)
        self._warned_events = False

    async def _fetch(self) -> dict[str, str]:
        try:
            if self.layout == "libkv":
                return await self._fetch_libkv()
            flat = await self._script(keys=[self.index])
        except RedisError as exc:
            raise _wrap(exc) from exc
        return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}

    async def _fetch_libkv(self) -> dict[str, str]:
        keys = [key async for key in self._redis.scan_iter(match=libkv.glob_escape(self._prefix) + "*",
                                                            count=SCAN_COUNT)]
        if not keys:
            return {}
        values = await self._redis.mget(keys)
        return libkv.servers_from_keys(self.base, self.service,
                                       ((_text(k), v) for k, v in zip(keys, values, strict=True)))

    async def _subscribe(self, pubsub: PubSub) -> None:
        if self.layout == "juggler":
            await pubsub.subscribe(self.index)
            return
        why = await ensure_keyspace_events(self._redis)
        if why is not None and not self._warned_events:
            self._warned_events = True
            log.warning("Redis keyspace notifications are off and cannot be turned on (%s): "
                        "registry changes are seen every %.1f s instead of at once", why, self.refresh_interval)
        db = self._redis.connection_pool.connection_kwargs.get("db", 0)
        await pubsub.psubscribe(f"__keyspace@{db}__:{libkv.glob_escape(self._prefix)}*")

    async def _watch(self, changed: asyncio.Event) -> None:
        pubsub = self._redis.pubsub()
        try:
            await self._subscribe(pubsub)
            changed.set()  # anything changed before we subscribed is picked up by a fetch
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                _end_if_cancelled()  # redis-py can swallow a cancellation: aclose() must not wait for ever
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
