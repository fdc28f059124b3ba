"""Join/leave notices: their wire format (sans-I/O) and the in-process bus.

A notice reaches the subscribers of a channel that asked for join/leave
notices as an EVNT frame with no ``for`` and no ``args``::

    {"meta":{"type":10,"uuid":"<fresh uuid>"},
     "payload":{"channel":"chat.a","join":{"client":"<conn id>","user":"alice"}}}

(``"leave"`` instead of ``"join"``; ``user`` is null without authentication;
``conn_info`` is there when the token had an ``info`` claim). Only the
connections that asked get them, so an original juggler client never sees
one.

Between servers, a notice travels as its payload (the JSON object above)
on the sharded pub-sub channel ``juggler:presence:notices:{CHANNEL}``
(``SPUBLISH``/``SSUBSCRIBE``, Redis >= 7): see :func:`notice_channel` for
why. In one process (the in-memory broker) :class:`LocalNotices` hands them
over directly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import rustext

from juggler.broker.cluster import hash_tagged

__all__ = [
    "LocalNotices",
    "NoticeHandler",
    "notice_channel",
    "notice_frame",
    "notice_payload",
    "parse_notice",
]

log = logging.getLogger("juggler.presence")

#: (bus channel, payload) for each notice received
NoticeHandler = Callable[[str, bytes], None]

_KINDS = ("join", "leave")


def notice_channel(channel: str) -> str:
    """The sharded pub-sub channel carrying `channel`'s notices between servers.

    Why sharded pub-sub: a message sent with ``SPUBLISH`` reaches only
    ``SSUBSCRIBE`` subscribers. No ``SUBSCRIBE`` of the same name and no
    ``PSUBSCRIBE`` pattern (not even ``*``) ever matches it, so neither a
    client of this server, nor an original juggler server or client sharing
    the Redis, can receive a notice as an ordinary event. A reserved prefix
    in the classic namespace could not promise that: any pattern
    subscription would match it. The channel's name is its hash tag, so on a
    cluster the notices of a channel live on the node of its presence keys.
    """
    return hash_tagged("juggler:presence:notices:", channel)


def notice_payload(channel: str, kind: str, info: Mapping[str, Any]) -> bytes:
    """``{"channel": CHANNEL, kind: info}``, compact and HTML-safe like every server frame."""
    if kind not in _KINDS:
        raise ValueError(f"a notice is a join or a leave, not {kind!r}")
    body = json.dumps({"channel": channel, kind: dict(info)}, ensure_ascii=False, separators=(",", ":"))
    return rustext.normalize_json(body.encode())


def parse_notice(data: bytes) -> tuple[str, str, dict[str, Any]] | None:
    """(channel, "join" or "leave", info) of a notice payload; None when it is not one."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("channel"), str):
        return None
    kinds = [k for k in _KINDS if k in obj]
    if len(kinds) != 1 or len(obj) != 2:
        return None
    info = obj[kinds[0]]
    if not isinstance(info, dict) or not isinstance(info.get("client"), str):
        return None
    return obj["channel"], kinds[0], info


def notice_frame(payload: bytes, uuid: str | None = None) -> bytes:
    """The EVNT frame of a notice payload, with a fresh ``meta.uuid``."""
    meta = (uuid or rustext.new_uuid()).encode()
    return b'{"meta":{"type":%d,"uuid":"%s"},"payload":%s}\n' % (rustext.EVNT, meta, payload)


class LocalNotices:
    """The notice bus of one process (the in-memory broker): a published
    notice goes straight to `handler` when its channel is subscribed."""

    def __init__(self, handler: NoticeHandler) -> None:
        self.handler = handler
        self._channels: set[str] = set()
        self.closed = False

    async def publish(self, channel: str, data: bytes) -> int:
        if self.closed or channel not in self._channels:
            return 0
        try:
            self.handler(channel, data)
        except Exception:
            log.exception("notice handler failed")
        return 1

    async def subscribe(self, channel: str) -> None:
        self._channels.add(channel)

    def unsubscribe(self, channel: str) -> None:
        self._channels.discard(channel)

    def subscribed(self, channel: str) -> bool:
        return channel in self._channels

    async def aclose(self) -> None:
        self.closed = True
        self._channels.clear()
