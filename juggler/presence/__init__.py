"""Presence and join/leave notices for juggler channels (an extension of juggler.0).

For the channels whose ``[[channels]]`` rule has ``presence = true``, a
server keeps one entry per subscribed connection (who: client id, user),
readable with :meth:`Presence.members` / :meth:`Presence.stats` on every
server sharing the broker; with ``join_leave = true`` too, the subscribers
that ask for it get a notice when someone joins or leaves. Original juggler
clients never ask, so they never see one.

- service.py  :class:`Presence`: what the server calls (``joined``, ``left``),
              the refresh loop, notices to the local subscribers that asked
- store.py    the stores: in memory, or Redis / Redis Cluster (Centrifugo's
              layout: a hash and a sorted set of expiry times per channel, Lua scripts)
- notices.py  the notice wire format (an EVNT without ``for``/``args``), the
              sharded pub-sub channel carrying them, the in-process bus
- ``juggler.broker.redis.sharded`` the SSUBSCRIBE/SPUBLISH connections they travel on
"""

from juggler.presence.notices import (
    notice_channel,
    notice_frame,
    notice_payload,
    parse_notice,
)
from juggler.presence.service import Presence, PresenceCounters, PresenceDisabled
from juggler.presence.store import (
    MemoryPresenceStore,
    PresenceStore,
    RedisPresenceStore,
    presence_expire_key,
    presence_key,
)

__all__ = [
    "MemoryPresenceStore",
    "Presence",
    "PresenceCounters",
    "PresenceDisabled",
    "PresenceStore",
    "RedisPresenceStore",
    "notice_channel",
    "notice_frame",
    "notice_payload",
    "parse_notice",
    "presence_expire_key",
    "presence_key",
]
