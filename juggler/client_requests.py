"""Clients reading a channel's history and presence themselves: the HISTORY
(260) and PRESENCE (261) extension requests (:mod:`juggler.extensions`).

A channel answers them only when its ``[[channels]]`` rule says so
(``client_history = true``, ``client_presence = true``; off by default), and
only to a connection that may SUB to it (its grants, :mod:`juggler.auth`).
Refusals are NACKs: 400 for a malformed request or a channel without history
(presence), 403 when the channel does not allow the request or the
connection may not subscribe to it (401 for an anonymous connection or an
expired token), the broker's code (500, 504) when Redis fails.

HISTORY ``{"channel": C, "limit"?: N, "since"?: {"offset": O, "epoch": E}}``
is answered with ``{"events": [...], "offset": O, "epoch": E}``: the kept
publications, oldest first, each shaped as an EVNT's payload (``for``,
``channel``, ``args``, ``offset``, ``epoch``), and the channel's current
position. Without ``limit`` every publication kept; ``limit`` 0 none (the
position only, and with ``since`` whether it is still recoverable); N at
most the N oldest. With ``since``, only the publications
after that position, and ``"recovered"`` says whether they are all of them:
false (no events) when the epoch changed or the history no longer reaches
back to it.

PRESENCE ``{"channel": C}`` is answered with ``{"presence": {client id:
{"client", "user"[, "conn_info"]}}}``, as the server API's ``presence``.

:func:`install` registers the handlers on a server whose rules enable them.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import rustext
from juggler.extensions import HISTORY, PRESENCE, REPLY, ExtensionMessage

if TYPE_CHECKING:
    from juggler.conn import Conn

__all__ = ["MAX_LIMIT", "history_request", "install", "presence_request"]

log = logging.getLogger("juggler.client_requests")

#: the largest ``limit`` or ``offset`` taken (a JSON integer beyond it is a 400)
MAX_LIMIT = 1 << 53
_POSITION_ONLY = 1 << 62  # read no publications, only the position (as juggler.recovery)


def install(server: Any) -> None:
    """Register the HISTORY and PRESENCE handlers on `server` (a
    :class:`juggler.server.Server`) when some channel rule enables them:
    other servers keep refusing those types as unknown."""
    rules = server.channels.rules
    if any(rule.client_history for rule in rules):
        server.extensions[HISTORY] = history_request
    if any(rule.client_presence for rule in rules):
        server.extensions[PRESENCE] = presence_request


def _channel(conn: Conn, msg: ExtensionMessage) -> str | None:
    """The request's channel once the connection may ask it, else None (NACKed)."""
    channel = msg.payload.get("channel")
    if not isinstance(channel, str) or not channel:
        conn.nack(msg, 400, "channel: expected a non-empty string")
        return None
    identity = conn.identity
    if identity is not None:
        refusal = identity.check("sub", channel)
        if refusal is not None:
            conn.context.listener.reject("unauthorized" if refusal[0] == 401 else "forbidden")
            conn.nack(msg, *refusal)
            return None
    return channel


def _int(value: Any) -> int | None:
    """A JSON integer within 0..MAX_LIMIT, else None."""
    if value.__class__ is not int or not 0 <= value <= MAX_LIMIT:
        return None
    return int(value)


async def history_request(conn: Conn, msg: ExtensionMessage) -> None:
    """HISTORY: the channel's kept publications (see the module doc)."""
    payload = msg.payload
    unknown = sorted(set(payload) - {"channel", "limit", "since"})
    if unknown:
        conn.nack(msg, 400, f"unknown field {unknown[0][:40]!r} (expected channel, limit, since)")
        return
    channel = _channel(conn, msg)
    if channel is None:
        return
    limit: int | None = None
    if "limit" in payload:
        limit = _int(payload["limit"])
        if limit is None:
            conn.nack(msg, 400, "limit: expected an integer >= 0")
            return
    since: tuple[int, str] | None = None
    if "since" in payload:
        raw = payload["since"]
        offset = _int(raw.get("offset")) if isinstance(raw, dict) else None
        epoch = raw.get("epoch") if isinstance(raw, dict) else None
        if offset is None or not isinstance(epoch, str) or not epoch or set(raw) - {"offset", "epoch"}:
            conn.nack(msg, 400, 'since: expected {"offset": integer >= 0, "epoch": non-empty string}')
            return
        since = (offset, epoch)
    recovery = conn.context.subscriptions.recovery
    opts = recovery.history_of(channel) if recovery is not None else None
    if opts is None:
        conn.nack(msg, 400, f"channel {channel[:80]!r} keeps no history")
        return
    if not opts.client_history:
        conn.context.listener.reject("forbidden")
        conn.nack(msg, 403, f"channel {channel[:80]!r} does not let clients read its history (client_history)")
        return
    after = since[0] if since is not None else 0
    read = limit or 0
    if limit == 0:
        # the position only; with since, one publication tells whether the history reaches back to it
        after, read = (after, 1) if since is not None else (_POSITION_ONLY, 0)
    try:
        page = await recovery.pubsub.read_history(channel, after, read, opts)
    except Exception as exc:
        conn.nack(msg, getattr(exc, "code", 500), str(exc) or type(exc).__name__)
        return
    events = page.publications
    recovered: bool | None = None
    if since is not None:
        offset, epoch = since
        recovered = page.epoch == epoch and offset <= page.offset and (
            offset == page.offset or (bool(events) and events[0].offset == offset + 1))
        if not recovered or limit == 0:
            events = []
    conn.reply(msg, (REPLY, msg.uuid, _history_reply(msg.uuid, channel, events, page.offset, page.epoch, recovered)))


def _history_reply(for_uuid: str, channel: str, events: list[Any], offset: int, epoch: str,
                   recovered: bool | None) -> bytes:
    """The REPLY of a HISTORY request, each event's ``args`` spliced in as it
    was published (numbers as written), not decoded and encoded again."""
    ch = json.dumps(channel, ensure_ascii=False)
    items = ",".join(
        f'{{"for":{json.dumps(e.msg_uuid)},"channel":{ch},'
        f'"args":{e.args.decode() if e.args is not None else "null"},"offset":{int(e.offset)},'
        f'"epoch":{json.dumps(e.epoch or epoch, ensure_ascii=False)}}}'
        for e in events
    )
    tail = "" if recovered is None else f',"recovered":{json.dumps(recovered)}'
    result = f'{{"events":[{items}],"offset":{int(offset)},"epoch":{json.dumps(epoch, ensure_ascii=False)}{tail}}}'
    meta = f'{{"type":{REPLY},"uuid":"{rustext.new_uuid()}"}}'
    frame = f'{{"meta":{meta},"payload":{{"for":"{for_uuid}","for_type":{HISTORY},"result":{result}}}}}\n'
    return frame.encode()


async def presence_request(conn: Conn, msg: ExtensionMessage) -> None:
    """PRESENCE: who is subscribed to the channel (see the module doc)."""
    from juggler.extensions import reply_frame

    unknown = sorted(set(msg.payload) - {"channel"})
    if unknown:
        conn.nack(msg, 400, f"unknown field {unknown[0][:40]!r} (expected channel)")
        return
    channel = _channel(conn, msg)
    if channel is None:
        return
    service = conn.context.subscriptions.presence
    if service is None or not service.enabled(channel):
        conn.nack(msg, 400, f"channel {channel[:80]!r} keeps no presence")
        return
    if not service.rules.lookup(channel).client_presence:
        conn.context.listener.reject("forbidden")
        conn.nack(msg, 403, f"channel {channel[:80]!r} does not let clients ask for its presence (client_presence)")
        return
    try:
        members = await service.members(channel)
    except Exception as exc:
        conn.nack(msg, getattr(exc, "code", 500), str(exc) or type(exc).__name__)
        return
    conn.reply(msg, (REPLY, msg.uuid, reply_frame(PRESENCE, msg.uuid, {"presence": members})))
