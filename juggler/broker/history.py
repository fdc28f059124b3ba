"""Channel history: bounded per-channel logs of publications, for recovery.

A channel with history (``juggler.channels``) numbers its publications:
``offset`` 1, 2, 3, … within an ``epoch``, a random token that changes
whenever the history may have lost something (it expired, Redis restarted
without it, a replica took over from a master that had not replicated
everything). A client that saw (offset N, epoch E) can ask for what came
after; the answer is whole, or it says recovery is impossible.

Publishing with history stores the publication and publishes it in ONE
step (one Lua script on Redis), so the history and the live stream agree on
every offset. The published payload is upstream's ``{"msg_uuid","args"}``
plus ``offset`` and ``epoch``: original Go servers subscribed to the same
channel ignore the extra fields.

Two stores:

- :class:`MemoryHistory` for the in-memory broker;
- :class:`RedisHistory` (standalone and Cluster): a stream
  ``juggler:history:{CHANNEL}`` (entry id ``<offset>-0``, field ``p`` = the
  payload) capped at ``history_size`` entries and expiring ``history_ttl``
  after the last publication, and a hash ``juggler:history:meta:{CHANNEL}``
  (``e`` epoch, ``s`` last offset, ``r`` the Redis replication id the epoch
  was made under) expiring after ``history_meta_ttl``. Both keys share the
  channel's hash slot. A master whose replication id is not the one the
  epoch was made under (a failover, a restart) starts a new epoch: a
  replica may have taken over without the last publications.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import rustext

from juggler.broker.base import BrokerError, Event
from juggler.broker.cluster import hash_tagged
from juggler.broker.resp import RedisReplyError, Script, evalsha
from juggler.channels import ChannelOptions

__all__ = ["HistoryPage", "MemoryHistory", "RedisHistory", "history_key", "history_meta_key", "new_epoch"]


def new_epoch() -> str:
    return secrets.token_hex(4)


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Publications after some offset, in order, and the channel's position."""

    publications: list[Event]
    #: the channel's last offset (0: nothing published in this epoch)
    offset: int
    epoch: str


def history_key(channel: str) -> str:
    return hash_tagged("juggler:history:", channel)


def history_meta_key(channel: str) -> str:
    return hash_tagged("juggler:history:meta:", channel)


@dataclass(slots=True)
class _Log:
    epoch: str
    offset: int = 0
    entries: deque[tuple[Event, float]] = field(default_factory=deque)
    last_publish: float = 0.0


class MemoryHistory:
    """History of the in-memory broker (one process); time from `clock` (seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._logs: dict[str, _Log] = {}

    def _log(self, channel: str, opts: ChannelOptions, now: float) -> _Log:
        log = self._logs.get(channel)
        if log is not None and now - log.last_publish > opts.history_meta_ttl:
            log = None  # the position expired: a new epoch
        if log is None:
            log = self._logs[channel] = _Log(new_epoch(), last_publish=now)
        elif now - log.last_publish > opts.history_ttl:
            log.entries.clear()
        return log

    def append(self, channel: str, msg_uuid: str, args: bytes | None, opts: ChannelOptions) -> Event:
        """Store one publication; returns it as an event with its offset and epoch."""
        now = self._clock()
        log = self._log(channel, opts, now)
        log.offset += 1
        event = Event(channel=channel, pattern=None, msg_uuid=msg_uuid, args=args, offset=log.offset,
                      epoch=log.epoch)
        log.entries.append((event, now))
        while len(log.entries) > opts.history_size:
            log.entries.popleft()
        log.last_publish = now
        return event

    def read(self, channel: str, after: int, limit: int, opts: ChannelOptions) -> HistoryPage:
        """Publications with offset > `after` (at most `limit`, 0 = all kept)."""
        now = self._clock()
        log = self._logs.get(channel)
        if log is None or now - log.last_publish > opts.history_meta_ttl:
            self._logs.pop(channel, None)
            log = self._logs[channel] = _Log(new_epoch(), last_publish=now)
            return HistoryPage([], 0, log.epoch)
        if now - log.last_publish > opts.history_ttl:
            log.entries.clear()
        pubs = [e for e, _ in log.entries if e.offset is not None and e.offset > after]
        if limit:
            pubs = pubs[:limit]
        return HistoryPage(pubs, log.offset, log.epoch)


# The epoch of a channel, made anew when its meta is gone or was made under
# another replication id (a failover or restart may have lost publications).
_EPOCH_LUA = """
local info = redis.call('INFO', 'replication')
local replid = string.match(info, 'master_replid:(%w+)') or ''
local meta = redis.call('HMGET', KEYS[2], 'e', 's', 'r')
local epoch = meta[1]
local offset = tonumber(meta[2]) or 0
if not epoch or meta[3] ~= replid then
    epoch = ARGV[1]
    if not meta[1] then
        redis.call('DEL', KEYS[1])
        offset = 0
    end
    redis.call('HSET', KEYS[2], 'e', epoch, 's', offset, 'r', replid)
end
"""

# KEYS: stream, meta. ARGV: new epoch, payload without its closing brace,
# size, ttl ms, meta ttl ms, channel. Returns {offset, epoch}.
PUBLISH_SCRIPT = Script(_EPOCH_LUA + """
offset = redis.call('HINCRBY', KEYS[2], 's', 1)
local payload = ARGV[2] .. ',"offset":' .. offset .. ',"epoch":"' .. epoch .. '"}'
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], offset .. '-0', 'p', payload)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PUBLISH', ARGV[6], payload)
return {offset, epoch}
""")

# KEYS: stream, meta. ARGV: new epoch, after (offset), count (0 = all), meta ttl ms.
# Returns {offset, epoch, payloads...}.
READ_SCRIPT = Script(_EPOCH_LUA + """
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local res = {offset, epoch}
local start = '(' .. ARGV[2] .. '-0'
local entries
if tonumber(ARGV[3]) > 0 then
    entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[3])
else
    entries = redis.call('XRANGE', KEYS[1], start, '+')
end
for _, e in ipairs(entries) do
    res[#res + 1] = e[2][2]
end
return res
""")


class RedisHistory:
    """History in Redis streams (see module doc); `router` runs a command on the node of a key."""

    def __init__(self, router: Any) -> None:
        self.router = router

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None, opts: ChannelOptions) -> tuple[int, str]:
        payload = rustext.build_pub_payload(msg_uuid, args)
        keys = (history_key(channel), history_meta_key(channel))
        argv = (new_epoch(), payload[:-1], opts.history_size, int(opts.history_ttl * 1000),
                int(opts.history_meta_ttl * 1000), channel)
        try:
            reply = await self.router.run(keys[0], lambda c: evalsha(c, PUBLISH_SCRIPT, keys, argv))
        except RedisReplyError as exc:
            raise BrokerError(str(exc)) from exc
        return int(reply[0]), _text(reply[1])

    async def read(self, channel: str, after: int, limit: int, opts: ChannelOptions) -> HistoryPage:
        keys = (history_key(channel), history_meta_key(channel))
        argv = (new_epoch(), max(0, after), max(0, limit), int(opts.history_meta_ttl * 1000))
        try:
            reply = await self.router.run(keys[0], lambda c: evalsha(c, READ_SCRIPT, keys, argv))
        except RedisReplyError as exc:
            raise BrokerError(str(exc)) from exc
        offset, epoch = int(reply[0]), _text(reply[1])
        pubs = []
        for raw in reply[2:]:
            try:
                msg_uuid, args, off, ep = rustext.parse_pub_payload_at(raw)
            except ValueError:
                continue
            pubs.append(Event(channel=channel, pattern=None, msg_uuid=msg_uuid, args=args, offset=off, epoch=ep))
        return HistoryPage(pubs, offset, epoch)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
