"""OpenTelemetry tracing of rpc calls, interoperable with Go rpcx's plugins.

``TracingPlugin`` (server) and ``TracingClientPlugin`` (client) make one span
per call and carry the span context in the request's rpcx metadata, exactly
as github.com/rpcxio/rpcx-plugins (``server/otel``, ``client/otel``) does:
the text-map propagator (by default the process's global one: W3C
``traceparent``/``tracestate`` and ``baggage``) injects into and extracts
from the metadata map, so a trace crosses Go and Python services in either
direction. Span names are rpcx-plugins' (``rpcx.service.S.M`` on the server,
``rpcx.client.S.M`` on the client); the attributes are its ``rpc.system``,
``rpc.service``, ``rpc.method`` plus the OpenTelemetry RPC conventions
(server/peer address and port, ``error.type`` and an error status).

This module needs the ``otel`` extra (``pip install 'juggler-suite[otel]'``);
nothing else in ``rpc`` imports it, so a server or client without these
plugins pays nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rustext.otel import (
    SpanKind,
    Status,
    StatusCode,
    Traced,
    otel_context,
    trace,
)

if TYPE_CHECKING:
    from rpc.client_plugins import CallInfo
    from rpc.message import Message
    from rpc.service import Context

#: the instrumentation scope of the spans (what a backend shows as the library)
SCOPE = "juggler-suite.rpc"
#: ``rpc.system`` of every span, as rpcx-plugins sets it
RPC_SYSTEM = "rpcx"

_SPAN_KEY = "otel.span"
_TOKEN_KEY = "otel.token"


def _split_hostport(text: str) -> tuple[str, int | None]:
    """``host:port`` / ``[v6]:port`` → (host, port); a text without a port → (text, None)."""
    from rustext.net import parse_hostport

    try:
        return parse_hostport(text)
    except ValueError:
        return text, None


def address_attributes(address: str, prefix: str) -> dict[str, Any]:
    """``{prefix}.address``/``.port`` and ``network.transport`` of an rpcx
    address (``tcp@host:port``, ``unix@/path``, bare ``host:port``)."""
    network, at, rest = address.partition("@")
    if not at:
        network, rest = "tcp", address
    attrs: dict[str, Any] = {}
    if network == "unix":
        attrs["network.transport"] = "unix"
        if rest:
            attrs[f"{prefix}.address"] = rest
        return attrs
    if network in ("tcp", "tcp4", "tcp6", "http"):
        attrs["network.transport"] = "tcp"
    elif network in ("kcp", "quic", "utp"):
        attrs["network.transport"] = "udp"
    host, port = _split_hostport(rest)
    if host:
        attrs[f"{prefix}.address"] = host
    if port is not None:
        attrs[f"{prefix}.port"] = port
    return attrs


def _end(span: trace.Span, error: BaseException | None) -> None:
    if error is None:
        # rpcx-plugins sets Ok on success (its "success" description is dropped
        # by every SDK: only an error status has one)
        span.set_status(Status(StatusCode.OK))
    else:
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))
    span.end()


class TracingPlugin(Traced):
    """Server plugin: a SERVER span per request, child of the caller's span
    found in the request metadata (rpcx-plugins' ``PreHandleRequest``).

    The span is the current span while an ``async`` or ``@fast`` handler
    runs, so the handler's own spans and its calls through a
    ``TracingClientPlugin`` are its children. It starts before the handler
    and ends after it (a request that fails before the handler, such as an
    unknown method, still gets a span with the error). ``tracer_provider`` and
    ``propagator`` default to the process's global ones.
    """

    SCOPE = SCOPE

    def _start(self, ctx: Context, start_time: int | None = None) -> trace.Span:
        propagator = self.propagator
        parent = propagator.extract(ctx.metadata)
        attrs: dict[str, Any] = {
            "rpc.system": RPC_SYSTEM,
            "rpc.service": ctx.service,
            "rpc.method": ctx.method,
        }
        peer = ctx.peer
        if peer is not None:
            if peer.local_address:
                attrs.update(address_attributes(peer.local_address, "server"))
            if peer.address:
                host, port = _split_hostport(peer.address)
                attrs["network.peer.address"] = host
                if port is not None:
                    attrs["network.peer.port"] = port
        return self._tracer.start_span(
            f"rpcx.service.{ctx.service}.{ctx.method}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attrs,
            start_time=start_time,
        )

    def pre_call(self, ctx: Context, args: Any) -> None:
        span = self._start(ctx)
        if ctx.values is None:
            ctx.values = {}
        ctx.values[_SPAN_KEY] = span
        ctx.values[_TOKEN_KEY] = otel_context.attach(trace.set_span_in_context(span))

    def post_call(self, ctx: Context, args: Any, reply: Any, error: BaseException | None) -> None:
        values = ctx.values
        span = values.pop(_SPAN_KEY, None) if values is not None else None
        if span is None:
            # the request failed before pre_call (unknown method, undecodable
            # args): its span starts when the request was read
            ago = time.perf_counter() - ctx.started
            span = self._start(ctx, start_time=time.time_ns() - int(ago * 1e9))
        else:
            assert values is not None
            otel_context.detach(values.pop(_TOKEN_KEY))
        _end(span, error)


class TracingClientPlugin(Traced):
    """Client plugin: a CLIENT span per try of a call, its context injected
    into the request metadata (rpcx-plugins' client ``PreCall``/``PostCall``).

    The parent is the current span (a ``TracingPlugin``'s server span inside
    a handler, or the application's own); without one, a span context
    already in the call's metadata (rpcx's way: a handler passing its
    request's metadata on), else the span starts a new trace. Each try of an
    ``XClient`` call (failover, retries, broadcast) gets its own span.
    """

    SCOPE = SCOPE

    def pre_call(self, call: CallInfo, args: Any) -> None:
        propagator = self.propagator
        parent = otel_context.get_current()
        if not trace.get_current_span(parent).get_span_context().is_valid:
            from_metadata = propagator.extract(call.metadata)
            if trace.get_current_span(from_metadata).get_span_context().is_valid:
                parent = from_metadata
        attrs: dict[str, Any] = {
            "rpc.system": RPC_SYSTEM,
            "rpc.service": call.service,
            "rpc.method": call.method,
            **address_attributes(call.address, "server"),
        }
        span = self._tracer.start_span(
            f"rpcx.client.{call.service}.{call.method}", context=parent, kind=SpanKind.CLIENT, attributes=attrs
        )
        propagator.inject(call.metadata, context=trace.set_span_in_context(span, parent))
        call.values[_SPAN_KEY] = span

    def post_call(self, call: CallInfo, args: Any, reply: Message | None, error: BaseException | None) -> None:
        span = call.values.pop(_SPAN_KEY, None)
        if span is not None:
            _end(span, error)


__all__ = ["RPC_SYSTEM", "SCOPE", "TracingClientPlugin", "TracingPlugin", "address_attributes"]
