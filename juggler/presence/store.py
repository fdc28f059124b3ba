"""Presence stores: who is subscribed to a channel, in this process or in Redis.

An entry is one subscribed connection: its client id (the connection's id)
and its info, a JSON object ``{"client": ID, "user": USER or null}`` plus
``"conn_info"`` when the connection's token carries an ``info`` claim. Each
entry expires ``ttl`` seconds after it was last added, so the entries of a
server that died without removing them go away by themselves; a live server
adds its entries again before that (the presence service's refresh).

Redis layout (Centrifugo's), both keys in the channel's hash slot (the
channel is the hash tag), so every script runs on one node of a cluster:

- ``juggler:presence:{CHANNEL}``        HASH  client id -> info (JSON)
- ``juggler:presence:expire:{CHANNEL}`` ZSET  client id, score = expiry (ms, Redis's clock)

Scripts (KEYS = the hash, the sorted set):

- add: ``ZADD`` each client with now + ttl, ``HSET`` its info, then
  ``PEXPIRE`` both keys by ttl (a channel nobody refreshes disappears whole);
- read: drop the entries whose expiry has passed (``ZRANGEBYSCORE`` +
  ``HDEL`` + ``ZREMRANGEBYSCORE``), then ``HGETALL``;
- remove: ``HDEL`` + ``ZREM``.

Expiry is measured on Redis's clock (``TIME`` inside the scripts), so the
clocks of the servers sharing the Redis do not matter.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from juggler.broker.cluster import ClusterRouter, SingleRouter, hash_tagged
from juggler.broker.resp import Script, evalsha

__all__ = [
    "PRESENCE_ADD_SCRIPT",
    "PRESENCE_READ_SCRIPT",
    "PRESENCE_REMOVE_SCRIPT",
    "MemoryPresenceStore",
    "PresenceStore",
    "RedisPresenceStore",
    "count_stats",
    "presence_expire_key",
    "presence_key",
]

log = logging.getLogger("juggler.presence")

Info = dict[str, Any]

# ARGV = ttl in ms, then client id and info (JSON) for each entry.
PRESENCE_ADD_SCRIPT = Script(
    "local t = redis.call(\"TIME\")\n"
    "local ttl = tonumber(ARGV[1])\n"
    "local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ttl\n"
    "for i = 2, #ARGV, 2 do\n"
    "\tredis.call(\"ZADD\", KEYS[2], exp, ARGV[i])\n"
    "\tredis.call(\"HSET\", KEYS[1], ARGV[i], ARGV[i + 1])\n"
    "end\n"
    "redis.call(\"PEXPIRE\", KEYS[1], ttl)\n"
    "redis.call(\"PEXPIRE\", KEYS[2], ttl)\n"
    "return (#ARGV - 1) / 2\n"
)
# No ARGV. Removes what has expired, returns HGETALL of the rest.
PRESENCE_READ_SCRIPT = Script(
    "local t = redis.call(\"TIME\")\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local expired = redis.call(\"ZRANGEBYSCORE\", KEYS[2], \"-inf\", now)\n"
    "if #expired > 0 then\n"
    "\tfor i = 1, #expired, 1000 do\n"
    "\t\tredis.call(\"HDEL\", KEYS[1], unpack(expired, i, math.min(i + 999, #expired)))\n"
    "\tend\n"
    "\tredis.call(\"ZREMRANGEBYSCORE\", KEYS[2], \"-inf\", now)\n"
    "end\n"
    "return redis.call(\"HGETALL\", KEYS[1])\n"
)
# ARGV = the client ids to remove.
PRESENCE_REMOVE_SCRIPT = Script(
    "redis.call(\"HDEL\", KEYS[1], unpack(ARGV))\n"
    "return redis.call(\"ZREM\", KEYS[2], unpack(ARGV))\n"
)

#: entries per script run (Lua's unpack and one command's size stay small)
BATCH = 500


def presence_key(channel: str) -> str:
    return hash_tagged("juggler:presence:", channel)


def presence_expire_key(channel: str) -> str:
    return hash_tagged("juggler:presence:expire:", channel)


def count_stats(members: Mapping[str, Info]) -> dict[str, int]:
    """``{"clients": entries, "users": distinct user ids}`` (entries without a user are not users)."""
    users = {info.get("user") for info in members.values()}
    users.discard(None)
    return {"clients": len(members), "users": len(users)}


def encode_info(info: Mapping[str, Any]) -> bytes:
    return json.dumps(info, ensure_ascii=False, separators=(",", ":")).encode()


class PresenceStore(Protocol):
    """Where presence entries live. Every method may raise
    :class:`juggler.broker.base.BrokerError` (Redis unreachable, …)."""

    async def add(self, channel: str, client_id: str, info: Mapping[str, Any], ttl: float) -> None:
        """Add (or refresh) one entry, alive `ttl` seconds from now."""

    async def add_many(self, channel: str, entries: Mapping[str, Mapping[str, Any]], ttl: float) -> None:
        """Add (or refresh) several entries of one channel at once."""

    async def remove(self, channel: str, client_id: str) -> None:
        """Remove one entry; a no-op when absent."""

    async def remove_many(self, channel: str, client_ids: Iterable[str]) -> None: ...

    async def members(self, channel: str) -> dict[str, Info]:
        """The live entries: client id -> info."""

    async def stats(self, channel: str) -> dict[str, int]:
        """``{"clients": n, "users": distinct users}`` of the live entries."""


class MemoryPresenceStore:
    """Entries of this process only (the in-memory broker's). Time comes from
    `clock` (seconds, monotonic) so tests control expiry."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # channel -> client id -> (expiry, info)
        self._channels: dict[str, dict[str, tuple[float, Info]]] = {}

    async def add(self, channel: str, client_id: str, info: Mapping[str, Any], ttl: float) -> None:
        await self.add_many(channel, {client_id: info}, ttl)

    async def add_many(self, channel: str, entries: Mapping[str, Mapping[str, Any]], ttl: float) -> None:
        if not entries:
            return
        exp = self._clock() + ttl
        table = self._channels.setdefault(channel, {})
        for client_id, info in entries.items():
            table[client_id] = (exp, dict(info))

    async def remove(self, channel: str, client_id: str) -> None:
        await self.remove_many(channel, (client_id,))

    async def remove_many(self, channel: str, client_ids: Iterable[str]) -> None:
        table = self._channels.get(channel)
        if table is None:
            return
        for client_id in client_ids:
            table.pop(client_id, None)
        if not table:
            del self._channels[channel]

    async def members(self, channel: str) -> dict[str, Info]:
        table = self._channels.get(channel)
        if table is None:
            return {}
        now = self._clock()
        expired = [c for c, (exp, _) in table.items() if exp <= now]
        for c in expired:
            del table[c]
        if not table:
            del self._channels[channel]
            return {}
        return {c: dict(info) for c, (_, info) in table.items()}

    async def stats(self, channel: str) -> dict[str, int]:
        return count_stats(await self.members(channel))


class RedisPresenceStore:
    """Entries in Redis or a Redis Cluster (the layout and scripts of the
    module doc), through a broker's router: its command connections, its
    redirections and retries."""

    def __init__(self, router: SingleRouter | ClusterRouter) -> None:
        self.router = router

    async def _run(self, channel: str, script: Script, argv: list[Any]) -> Any:
        keys = (presence_key(channel), presence_expire_key(channel))
        return await self.router.run(keys[0], lambda c: evalsha(c, script, keys, argv))

    async def add(self, channel: str, client_id: str, info: Mapping[str, Any], ttl: float) -> None:
        await self.add_many(channel, {client_id: info}, ttl)

    async def add_many(self, channel: str, entries: Mapping[str, Mapping[str, Any]], ttl: float) -> None:
        ttl_ms = max(1, int(ttl * 1000))
        items = list(entries.items())
        for i in range(0, len(items), BATCH):
            argv: list[Any] = [ttl_ms]
            for client_id, info in items[i : i + BATCH]:
                argv += (client_id, encode_info(info))
            await self._run(channel, PRESENCE_ADD_SCRIPT, argv)

    async def remove(self, channel: str, client_id: str) -> None:
        await self.remove_many(channel, (client_id,))

    async def remove_many(self, channel: str, client_ids: Iterable[str]) -> None:
        ids = list(client_ids)
        for i in range(0, len(ids), BATCH):
            await self._run(channel, PRESENCE_REMOVE_SCRIPT, ids[i : i + BATCH])

    async def members(self, channel: str) -> dict[str, Info]:
        flat = await self._run(channel, PRESENCE_READ_SCRIPT, [])
        out: dict[str, Info] = {}
        for i in range(0, len(flat) - 1, 2):
            client_id = flat[i].decode("utf-8", "replace")
            try:
                info = json.loads(flat[i + 1])
            except ValueError:
                log.debug("presence of %s: ignoring an entry that is not JSON (%s)", channel, client_id)
                continue
            if isinstance(info, dict):
                out[client_id] = info
        return out

    async def stats(self, channel: str) -> dict[str, int]:
        return count_stats(await self.members(channel))
