"""Server-side subscriptions: channels a connection is subscribed to by the
server, without a SUB from the client.

Two sources decide them, never the client:

- the connection's identity (:attr:`juggler.auth.Identity.channels`: the
  ``channels`` claim of its token, or what a connect proxy answered), made
  when the connection opens: reading the client's messages waits until they
  are in effect, so the answer to its first message comes after them;
- the server API's ``subscribe`` method, which reaches the connections of
  every server sharing the broker through the control plane
  (:mod:`juggler.control`, operation ``subscribe``: :func:`node_subscribe`).

They are ordinary subscriptions once made: the client gets plain EVNTs for
them (the original Go client included), an UNSB ends them as it ends a SUB's,
the API's ``unsubscribe`` too. They count against ``max_subscriptions``; the
SUB grants (``juggler.auth``) do not apply: the server decided. On a channel
with history their EVNTs carry offset and epoch as any other's; nothing is
recovered for them when the client reconnects (the subscription is made again
from the token, and events come from then on): a client that kept the last
position may read what it missed with a HISTORY request
(:mod:`juggler.client_requests`), where the channel allows it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import rustext

from juggler.auth import user_of

__all__ = ["ALREADY", "OVER_LIMIT", "SUBSCRIBED", "node_subscribe", "subscribe", "subscribe_at_connect"]

log = logging.getLogger("juggler.serversubs")

EVNT = rustext.EVNT
_build_evnt = rustext.build_evnt

#: outcomes of :func:`subscribe`
SUBSCRIBED, ALREADY, OVER_LIMIT = "subscribed", "already", "over_limit"


async def subscribe(conn: Any, channel: str) -> str:
    """Subscribe `conn` to `channel` on the server's behalf: :data:`SUBSCRIBED`,
    :data:`ALREADY` (it was, by a SUB or the server) or :data:`OVER_LIMIT`
    (``max_subscriptions``). Raises the broker's error when the subscription
    cannot be made (the connection does not count it then)."""
    subs = conn.context.subscriptions
    if (False, channel) in subs.of(conn):
        return ALREADY
    verdict = conn.session.subscribed_by_server(channel)
    if verdict is None:
        return ALREADY
    if not verdict:
        return OVER_LIMIT
    try:
        joined = await subs.subscribe(conn, channel, False)
    except BaseException:
        conn.session.unsubscribed(channel, False)
        raise
    if joined is not None and not conn.closed:
        # live events that came while the channel's position was read: after it, in order
        stats = conn.stats
        for ev in joined.events:
            stats.events += 1
            conn.send(EVNT, ev.msg_uuid, _build_evnt(ev.msg_uuid, ev.channel, None, ev.args, ev.offset, ev.epoch))
    return SUBSCRIBED


async def subscribe_at_connect(conn: Any, channels: Sequence[str]) -> None:
    """The subscriptions of the connection's identity, made as it opens (see
    the module doc). More channels than ``max_subscriptions`` or a broker that
    refuses one closes the connection (1008 or 1011): a client left without
    the subscriptions the server decided would silently miss their events."""
    try:
        for channel in channels:
            if conn.closed:
                return
            try:
                outcome = await subscribe(conn, channel)
            except Exception as exc:
                log.warning("connection %s: server-side subscription to %r failed: %s", conn.remote, channel, exc)
                conn.session.set_reason("subscription_failed")
                conn.close(1011, "server-side subscription failed")
                return
            if outcome == OVER_LIMIT:
                log.info("connection %s: its token names more channels than max_subscriptions (%d)", conn.remote,
                         conn.config.max_subscriptions)
                conn.session.set_reason("subscription_limit")
                conn.close(1008, "too many server-side subscriptions")
                return
    finally:
        conn.server_subscribed()


def _opt_str(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


async def node_subscribe(server: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """The control operation ``subscribe`` on one server: its connections
    matching ``client`` and/or ``user`` are subscribed to ``channel``.
    ``{"subscribed": n}``, with ``"over_limit": m`` when some were at
    ``max_subscriptions`` and ``"failed": k`` when the broker refused some."""
    from juggler.context import ConnState

    channel = _opt_str(params, "channel")
    client, user = _opt_str(params, "client"), _opt_str(params, "user")
    if not channel:
        raise ValueError("channel must be a non-empty string")
    if client is None and user is None:
        raise ValueError("client or user is required")
    done = over = failed = 0
    for conn in list(server.conns):
        if conn.state is not ConnState.CONNECTED:
            continue
        if (client is not None and conn.id != client) or (user is not None and user_of(conn) != user):
            continue
        try:
            outcome = await subscribe(conn, channel)
        except Exception as exc:
            log.warning("connection %s: server-side subscription to %r failed: %s", conn.remote, channel, exc)
            failed += 1
            continue
        if outcome == SUBSCRIBED:
            done += 1
        elif outcome == OVER_LIMIT:
            over += 1
    if done or over:
        log.info("subscribed %d connection(s) to %s (client=%s user=%s, %d over max_subscriptions)", done, channel,
                 client or "-", user or "-", over)
    out: dict[str, Any] = {"subscribed": done}
    if over:
        out["over_limit"] = over
    if failed:
        out["failed"] = failed
    return out
