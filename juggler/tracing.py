"""OpenTelemetry tracing of juggler CALLs, from the websocket to the callee.

``CallTracing`` is a server middleware: a SERVER span per CALL, from the
CALL frame to its RES (or NACK, or the call's deadline). Its context goes to
the callee inside the call payload, as the extra member ``"trace"`` (a JSON
object of the propagator's headers: ``traceparent``, ``tracestate``,
``baggage``), which the original Go callee ignores like any unknown JSON
field. ``CalleeTracing`` gives a callee a CONSUMER span per call it runs,
child of that SERVER span.

This module needs the ``otel`` extra (``pip install 'juggler-suite[otel]'``);
nothing else in ``juggler`` imports it. Without the middleware the server
carries no ``"trace"`` member (``juggler.conn.call_trace`` stays None).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import rustext
from juggler.conn import call_trace
from juggler.protocol import Outgoing, call_timeout_ms
from rustext.otel import (
    SpanKind,
    Status,
    StatusCode,
    TextMapPropagator,
    Traced,
    otel_context,
    trace,
)

if TYPE_CHECKING:
    from juggler.broker.base import Call
    from juggler.conn import Conn, Handler

#: the instrumentation scope of the spans
SCOPE = "juggler-suite.juggler"
#: ``rpc.system`` of the spans
RPC_SYSTEM = "juggler"
#: the start of a callee's error result (``juggler.callee.error_result``)
_ERROR_PREFIX = b'{"error":'
#: seconds past a call's deadline before its span ends unanswered (a late RES still ends it first)
GRACE = 1.0


def _error_message(args: bytes | None) -> str | None:
    """The message of an error result ``{"error":{"message":...}}``, else None."""
    if not args or not args.startswith(_ERROR_PREFIX):
        return None
    try:
        return str(json.loads(args)["error"].get("message", "")) or "error"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "error"


class CallTracing(Traced):
    """Server middleware (``Server(middleware=[CallTracing()])``): a SERVER
    span ``juggler.CALL {uri}`` per CALL, carried to the callee in the call
    payload. ``tracer_provider`` and ``propagator`` default to the process's
    global ones."""

    SCOPE = SCOPE

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        super().__init__(tracer_provider=tracer_provider, propagator=propagator)
        #: CALL uuid -> (its span, the timer that ends it unanswered)
        self._spans: dict[str, tuple[trace.Span, asyncio.TimerHandle]] = {}

    @property
    def open_spans(self) -> int:
        """CALLs whose span has not ended yet (waiting for their RES)."""
        return len(self._spans)

    async def __call__(self, conn: Conn, msg: Any, nxt: Handler) -> None:
        if msg.__class__ is Outgoing:
            if msg.type in (rustext.RES, rustext.NACK):
                self._answered(msg)
            await nxt(conn, msg)
            return
        if msg.type != rustext.CALL:
            await nxt(conn, msg)
            return
        uri = msg.uri or ""
        timeout_ms = call_timeout_ms(msg.timeout_ns, conn.config.call_timeout_ms)
        attrs: dict[str, Any] = {
            "rpc.system": RPC_SYSTEM,
            "rpc.method": uri,
            "juggler.call.uuid": msg.uuid,
            "juggler.call.timeout_ms": timeout_ms,
        }
        remote = conn.remote
        if isinstance(remote, tuple) and len(remote) >= 2:
            attrs["network.peer.address"] = str(remote[0])
            attrs["network.peer.port"] = int(remote[1])
        span = self._tracer.start_span(f"juggler.CALL {uri}", kind=SpanKind.SERVER, attributes=attrs)
        ctx = trace.set_span_in_context(span)
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=ctx)
        previous = self._spans.pop(msg.uuid, None)
        if previous is not None:  # a duplicate uuid: the server NACKs it; the first call keeps no span
            previous[1].cancel()
            previous[0].end()
        delay = max(timeout_ms, 0) / 1000.0 + GRACE
        timer = asyncio.get_running_loop().call_later(delay, self._unanswered, msg.uuid)
        self._spans[msg.uuid] = (span, timer)
        token = call_trace.set(json.dumps(carrier, separators=(",", ":")).encode())
        otel_token = otel_context.attach(ctx)
        try:
            await nxt(conn, msg)
        finally:
            otel_context.detach(otel_token)
            call_trace.reset(token)

    def _answered(self, out: Outgoing) -> None:
        entry = self._spans.pop(out.for_uuid, None)
        if entry is None:
            return
        span, timer = entry
        timer.cancel()
        if out.type == rustext.NACK:
            parsed = rustext.parse_server_message(out.frame)
            span.set_attribute("juggler.nack.code", parsed.code or 0)
            span.set_status(Status(StatusCode.ERROR, parsed.message or "NACK"))
        else:
            error = _error_message(rustext.parse_server_message(out.frame).args)
            span.set_status(Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.OK))
        span.end()

    def _unanswered(self, msg_uuid: str) -> None:
        entry = self._spans.pop(msg_uuid, None)
        if entry is not None:
            entry[0].set_status(Status(StatusCode.ERROR, "no result before the call's deadline"))
            entry[0].end()

    def close(self) -> None:
        """End the spans still open (the server is stopping). Idempotent."""
        for msg_uuid in list(self._spans):
            self._unanswered(msg_uuid)


class CalleeTracing(Traced):
    """A callee's spans (``Callee(..., tracing=CalleeTracing())``): a CONSUMER
    span ``juggler.callee {uri}`` per call run, child of the server's CALL
    span when the payload carries one, current while the function runs."""

    SCOPE = SCOPE

    async def invoke(self, call: Call, run: Callable[[Call], Awaitable[bytes]]) -> bytes:
        """``run(call)`` (the callee's invocation, which returns the raw result)
        inside the call's span; an error result sets an error status."""
        parent = None
        if call.trace is not None:
            try:
                carrier = json.loads(call.trace)
            except ValueError:
                carrier = None
            if isinstance(carrier, dict):
                headers = {str(k): str(v) for k, v in carrier.items() if isinstance(v, str)}
                parent = self.propagator.extract(headers)
        attrs = {"rpc.system": RPC_SYSTEM, "rpc.method": call.uri, "juggler.call.uuid": call.msg_uuid}
        span = self._tracer.start_span(f"juggler.callee {call.uri}", context=parent, kind=SpanKind.CONSUMER,
                                       attributes=attrs)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            result = await run(call)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
            raise
        else:
            error = _error_message(result)
            span.set_status(Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.OK))
            return result
        finally:
            otel_context.detach(token)
            span.end()


__all__ = ["GRACE", "RPC_SYSTEM", "SCOPE", "CallTracing", "CalleeTracing"]
