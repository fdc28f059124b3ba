"""What each juggler.0 message does, once the session has admitted it.

The final handler of a connection's incoming messages (after the middleware):
an extension request goes to its handler, the application's proxies
(:mod:`juggler.proxy`) may refuse, change or answer a message first, and then
a CALL is queued for its callee, a PUB published, a SUB or UNSB made; the
ACK or NACK goes back through the connection. The connection
(:class:`juggler.conn.Conn`) is the I/O driver and passes itself in; this
module holds no state.
"""

from __future__ import annotations

import contextvars
from typing import Any

import rustext
from juggler.extensions import EXTENSION_MIN

__all__ = ["call_trace", "handle"]

CALL, PUB, SUB, UNSB = rustext.CALL, rustext.PUB, rustext.SUB, rustext.UNSB

#: the trace context of the CALL being handled (juggler.tracing sets it; Go callees ignore it)
call_trace: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("juggler_call_trace", default=None)


async def handle(conn: Any, msg: Any) -> None:
    """The final handler of incoming messages: what the session admits goes
    to the broker (or the subscriptions), then the ACK or NACK."""
    session = conn.session
    subs = conn.context.subscriptions
    t = msg.type
    if t >= EXTENSION_MIN:
        await conn.context.extensions[t](conn, msg)  # type: ignore[arg-type]
        return
    verdict = session.admit(msg, conn.context.listener.draining, conn.inflight, subs, len(conn.context.pending))
    if verdict.__class__ is tuple:
        conn.nack(msg, *verdict)  # type: ignore[misc]
        return
    args = msg.args
    proxies = conn.context.proxies
    if proxies is not None and t != UNSB:
        # the application's backend first (juggler.proxy): it may refuse, replace a PUB's
        # args, or answer a CALL itself
        args = await proxies.vet(conn, msg, verdict)
        if args is proxies.HANDLED:
            return
    if t == CALL:
        pending = conn.context.pending
        if not pending.add(msg.uuid, conn, verdict, conn.loop.time(), msg.uri):  # type: ignore[arg-type]
            # results route by msg_uuid: another connection's live call keeps it
            conn.nack(msg, 500, "duplicate message uuid")
            return
        try:
            trace = call_trace.get()
            if trace is None:
                await conn.broker.call(msg.uuid, msg.uri, msg.args, verdict)  # type: ignore[arg-type]
            else:
                await conn.broker.call(msg.uuid, msg.uri, msg.args, verdict, trace=trace)  # type: ignore[arg-type]
        except Exception as exc:
            code = getattr(exc, "code", 500)
            if code != 504:
                pending.pop(msg.uuid)
            # 504: the call may have been queued (Redis lost after the push was sent); its
            # entry stays, so a RES that comes is still delivered, as the error RES of its expiry
            conn.nack(msg, code, str(exc) or type(exc).__name__)
            return
        conn.reply(msg, session.ack(msg))
    elif t == PUB:
        try:
            await subs.publish(msg.channel, msg.uuid, args)
        except Exception as exc:
            # 504: it may have been published (Redis lost after the PUBLISH was sent)
            conn.nack(msg, getattr(exc, "code", 500), str(exc) or type(exc).__name__)
            return
        conn.reply(msg, session.ack(msg))
    elif t == SUB:
        expiry = conn.expiry
        if expiry is not None and expiry.private:
            refusal = await expiry.admit_sub(msg)  # private channels need a subscription token
            if refusal is not None:
                conn.nack(msg, *refusal)
                return
        try:
            joined = await subs.subscribe(conn, msg.channel, msg.pattern, msg.since, msg.join_leave)
        except Exception as exc:
            conn.nack(msg, 500, str(exc) or type(exc).__name__)
            return
        if expiry is not None:
            expiry.subscribed(msg)
        for frame in session.subscribed(msg, joined):
            conn.reply(msg, frame)
    elif t == UNSB:
        session.unsubscribed(msg.channel, msg.pattern)  # counts as gone even if Redis fails
        if conn.expiry is not None:
            conn.expiry.unsubscribed(msg.channel, msg.pattern)
        try:
            await subs.unsubscribe(conn, msg.channel, msg.pattern)
        except Exception as exc:
            conn.nack(msg, 500, str(exc) or type(exc).__name__)
            return
        conn.reply(msg, session.ack(msg))
