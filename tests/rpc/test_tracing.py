"""OpenTelemetry tracing of rpc calls (``rpc.tracing``) between our own client
and a real ``RpcxServer`` on 127.0.0.1, spans recorded by the SDK's in-memory
exporter: parentage through the request metadata, kinds, names, attributes,
error statuses, an unknown method, nesting inside a handler, and the
disabled path."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rpc.client import Client
from rpc.client_plugins import CallInfo
from rpc.discovery.base import StaticDiscovery
from rpc.errors import ServiceError
from rpc.examples import register_example
from rpc.rpcx_client import RpcxCaller
from rpc.rpcx_server import RpcxServer
from rpc.server import Server
from rpc.service import Context
from rpc.tracing import TracingClientPlugin, TracingPlugin, address_attributes
from rpc.xclient import XClient
from tests.netutil import wait_until


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in finished}


class Seen:
    """A server plugin that keeps each request's metadata (what went over the wire)."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    def pre_call(self, ctx: Context, args: Any) -> None:
        self.metadata.append(dict(ctx.metadata))


async def test_client_span_is_parent_of_server_span_through_traceparent(spans: Any) -> None:
    provider, exporter = spans
    seen = Seen()
    server = Server(plugins=[seen, TracingPlugin(tracer_provider=provider)])
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        port = int(rpcx.address.rpartition(":")[2])
        async with Client(rpcx.address, RpcxCaller(), close_caller=True,
                          plugins=[TracingClientPlugin(tracer_provider=provider)]) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            await wait_until(lambda: len(exporter.get_finished_spans()) == 2)
    found = by_name(exporter.get_finished_spans())
    cspan, sspan = found["rpcx.client.Arith.Mul"], found["rpcx.service.Arith.Mul"]
    assert cspan.kind == SpanKind.CLIENT and sspan.kind == SpanKind.SERVER
    assert sspan.context.trace_id == cspan.context.trace_id
    assert sspan.parent is not None and sspan.parent.span_id == cspan.context.span_id and sspan.parent.is_remote
    assert cspan.parent is None  # no current span: the client span starts the trace
    # W3C trace context in the rpcx metadata, as rpcx-plugins carries it
    traceparent = seen.metadata[0]["traceparent"]
    assert traceparent.startswith(f"00-{cspan.context.trace_id:032x}-{cspan.context.span_id:016x}-")
    assert int(traceparent[-2:], 16) & 1  # sampled
    for span in (cspan, sspan):
        assert span.attributes is not None
        assert span.attributes["rpc.system"] == "rpcx"
        assert span.attributes["rpc.service"] == "Arith"
        assert span.attributes["rpc.method"] == "Mul"
        assert span.attributes["server.address"] == "127.0.0.1"
        assert span.attributes["server.port"] == port
        assert span.status.status_code == StatusCode.OK
    assert sspan.attributes is not None and sspan.attributes["network.peer.address"] == "127.0.0.1"
    assert sspan.instrumentation_scope is not None and sspan.instrumentation_scope.name == "juggler-suite.rpc"


async def test_errors_set_an_error_status_on_both_sides(spans: Any) -> None:
    provider, exporter = spans
    server = Server(plugins=[TracingPlugin(tracer_provider=provider)])
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        async with Client(rpcx.address, RpcxCaller(), close_caller=True,
                          plugins=[TracingClientPlugin(tracer_provider=provider)]) as client:
            with pytest.raises(ServiceError, match="can't find method Nope"):
                await client.call("Arith", "Nope", {}, timeout=5)
            await wait_until(lambda: len(exporter.get_finished_spans()) == 2)
    found = by_name(exporter.get_finished_spans())
    # the unknown method never reached pre_call: the server span is made when the request failed
    sspan, cspan = found["rpcx.service.Arith.Nope"], found["rpcx.client.Arith.Nope"]
    assert sspan.parent is not None and sspan.parent.span_id == cspan.context.span_id
    for span in (sspan, cspan):
        assert span.status.status_code == StatusCode.ERROR
        assert "can't find method Nope" in (span.status.description or "")
        assert span.attributes is not None and span.attributes["error.type"]
    assert sspan.start_time is not None and cspan.start_time is not None and sspan.start_time >= cspan.start_time


async def test_a_handler_calling_on_continues_the_trace(spans: Any) -> None:
    """A handler's call through an XClient with the client plugin is a child
    of the handler's server span (the server span is current in the handler),
    and the next server's span a child of that: one trace, four spans."""
    provider, exporter = spans
    backend = Server(plugins=[TracingPlugin(tracer_provider=provider)])
    register_example(backend.registry, "arith")
    async with RpcxServer(backend, "tcp@127.0.0.1:0") as back:
        downstream = XClient("Arith", StaticDiscovery([back.address]), RpcxCaller(),
                             plugins=[TracingClientPlugin(tracer_provider=provider)])

        class Relay:
            async def Mul(self, ctx: Context, args: Any) -> Any:
                return await downstream.call("Mul", args, timeout=5)

        front = Server(plugins=[TracingPlugin(tracer_provider=provider)])
        front.register(Relay(), "Relay")
        async with downstream, RpcxServer(front, "tcp@127.0.0.1:0") as rpcx:
            async with Client(rpcx.address, RpcxCaller(), close_caller=True,
                              plugins=[TracingClientPlugin(tracer_provider=provider)]) as client:
                assert await client.call("Relay", "Mul", {"A": 3, "B": 5}, timeout=5) == {"C": 15}
                await wait_until(lambda: len(exporter.get_finished_spans()) == 4)
        await downstream.caller.aclose()
    found = by_name(exporter.get_finished_spans())
    chain = [found[n] for n in ("rpcx.client.Relay.Mul", "rpcx.service.Relay.Mul",
                                "rpcx.client.Arith.Mul", "rpcx.service.Arith.Mul")]
    assert len({s.context.trace_id for s in chain}) == 1
    assert chain[0].parent is None
    for parent, child in itertools.pairwise(chain):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert [s.kind for s in chain] == [SpanKind.CLIENT, SpanKind.SERVER, SpanKind.CLIENT, SpanKind.SERVER]


async def test_client_plugin_takes_the_parent_from_the_metadata_without_a_current_span(spans: Any) -> None:
    """rpcx's way: a traceparent already in the call's metadata is the parent
    when no span is current; a current span wins over it."""
    provider, exporter = spans
    plugin = TracingClientPlugin(tracer_provider=provider)
    remote = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    call = CallInfo(service="S", method="M", address="unix@/tmp/x.sock", metadata={"traceparent": remote})
    plugin.pre_call(call, None)
    assert call.metadata["traceparent"] != remote
    plugin.post_call(call, None, None, None)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("app") as app:
        call2 = CallInfo(service="S", method="M", address="tcp@[::1]:8972", metadata={"traceparent": remote})
        plugin.pre_call(call2, None)
        plugin.post_call(call2, None, None, RuntimeError("boom"))
    finished = [s for s in exporter.get_finished_spans() if s.name == "rpcx.client.S.M"]
    assert finished[0].context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert finished[0].parent is not None and finished[0].parent.span_id == 0xB7AD6B7169203331
    assert finished[0].attributes is not None and finished[0].attributes["network.transport"] == "unix"
    assert finished[1].parent is not None and finished[1].parent.span_id == app.get_span_context().span_id
    assert finished[1].attributes is not None
    assert finished[1].attributes["server.address"] == "::1" and finished[1].attributes["server.port"] == 8972
    assert finished[1].status.status_code == StatusCode.ERROR and finished[1].attributes["error.type"] == "RuntimeError"


def test_address_attributes() -> None:
    assert address_attributes("tcp@10.0.0.5:8972", "server") == {
        "network.transport": "tcp", "server.address": "10.0.0.5", "server.port": 8972}
    assert address_attributes("127.0.0.1:1", "server") == {
        "network.transport": "tcp", "server.address": "127.0.0.1", "server.port": 1}
    assert address_attributes("unix@/run/a.sock", "server") == {
        "network.transport": "unix", "server.address": "/run/a.sock"}
    assert address_attributes("quic@h:9", "server")["network.transport"] == "udp"


async def test_without_the_plugins_no_span_is_made_and_no_traceparent_sent(spans: Any) -> None:
    """Tracing is off unless the plugins are added: even with a global SDK
    provider, a plain client and server make no span and add no metadata."""
    provider, exporter = spans
    seen = Seen()
    server = Server(plugins=[seen])
    register_example(server.registry, "arith")
    previous = trace._TRACER_PROVIDER  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = provider  # type: ignore[attr-defined]
    try:
        async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
            async with Client(rpcx.address, RpcxCaller(), close_caller=True) as client:
                assert not client.plugins.call_hooks
                assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
    finally:
        trace._TRACER_PROVIDER = previous  # type: ignore[attr-defined]
    assert exporter.get_finished_spans() == ()
    assert "traceparent" not in seen.metadata[0]
    assert not server.plugins.has("pre_call") or server.plugins.hooks("pre_call") == (seen.pre_call,)


def test_rpc_and_the_cli_do_not_import_opentelemetry_unless_tracing_is_on() -> None:
    """The disabled path costs nothing: the rpc package and the rpc CLI
    modules load without importing OpenTelemetry at all."""
    code = (
        "import sys, rpc.server, rpc.xclient, rpc.client, rpc.rpcx_server, rpc.rpcx_client, "
        "cli.rpc_serve, cli.rpc_call, cli.main\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
