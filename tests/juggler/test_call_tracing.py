"""OpenTelemetry tracing of CALLs (``juggler.tracing``): a real server and
callee over a real Redis (and over the in-memory broker), a websocket client;
spans recorded by the SDK's in-memory exporter. The callee's span is a child
of the server's CALL span; the trace context rides in the call payload as
``"trace"``, which the original Go callee's decoding (encoding/json, run by
the Go peer of ``tests/rpc/interop/go-otel``) ignores; without the middleware
no span is made and no ``"trace"`` sent."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

import redis.asyncio as aioredis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import rustext
from juggler.broker.memory import MemoryBroker
from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.callee import Callee, CalleeApp
from juggler.client import CALL, NACK, connect
from juggler.config import ServerConfig
from juggler.server import Server
from juggler.tracing import CalleeTracing, CallTracing
from tests.netutil import wait_until
from tests.rpc.test_otel_interop import go_otel_peer  # noqa: F401  (the Go peer's build, a fixture)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def app() -> CalleeApp:
    def fail(args: Any) -> Any:
        raise ValueError(f"no {args}")

    a = CalleeApp()
    a.register("t.echo", lambda args: args)
    a.register("t.fail", fail)
    return a


def named(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def assert_child(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.context.trace_id == parent.context.trace_id
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert child.parent.is_remote  # it came through the broker


@pytest.mark.parametrize("kind", ["redis", "memory"])
async def test_callee_span_is_a_child_of_the_server_call_span(kind: str, spans: Any, redis_url: str) -> None:
    provider, exporter = spans
    if kind == "redis":
        broker: Any = RedisBroker(RedisBrokerConfig(url=redis_url))
        callee_broker: Any = RedisBroker(RedisBrokerConfig(url=redis_url))  # a callee process has its own
    else:
        broker = callee_broker = MemoryBroker()
    await broker.start()
    if callee_broker is not broker:
        await callee_broker.start()
    tracing = CallTracing(tracer_provider=provider)
    server = Server(broker, ServerConfig(port=0), middleware=[tracing])
    callee = Callee(callee_broker, app(), workers=4, tracing=CalleeTracing(tracer_provider=provider))
    try:
        await callee.start()
        await server.start()
        async with connect(server.url) as c:
            assert await c.call("t.echo", {"hello": "world"}, timeout=5) == {"hello": "world"}
            assert await c.call("t.fail", 7, timeout=5) == {"error": {"message": "no 7"}}
            await wait_until(lambda: len(exporter.get_finished_spans()) == 4)
    finally:
        await server.aclose()
        await callee.aclose()
        await broker.aclose()
        if callee_broker is not broker:
            await callee_broker.aclose()
    found = named(exporter)
    call, run = found["juggler.CALL t.echo"], found["juggler.callee t.echo"]
    assert call.kind == SpanKind.SERVER and run.kind == SpanKind.CONSUMER
    assert call.parent is None
    assert_child(run, call)
    assert call.attributes is not None and run.attributes is not None
    assert call.attributes["rpc.system"] == "juggler" and call.attributes["rpc.method"] == "t.echo"
    assert call.attributes["juggler.call.uuid"] == run.attributes["juggler.call.uuid"]
    assert call.attributes["juggler.call.timeout_ms"] == 5000
    assert call.attributes["network.peer.address"] == "127.0.0.1"
    assert run.attributes["rpc.method"] == "t.echo"
    assert call.status.status_code == StatusCode.OK and run.status.status_code == StatusCode.OK
    # the server span runs from the CALL to its RES: the callee's span lies inside it
    assert call.start_time is not None and run.start_time is not None and call.end_time is not None
    assert run.end_time is not None and call.start_time <= run.start_time and run.end_time <= call.end_time
    failed_call, failed_run = found["juggler.CALL t.fail"], found["juggler.callee t.fail"]
    assert_child(failed_run, failed_call)
    assert failed_call.context.trace_id != call.context.trace_id  # one trace per CALL
    for span in (failed_call, failed_run):
        assert span.status.status_code == StatusCode.ERROR and span.status.description == "no 7"
    assert tracing.open_spans == 0


async def test_a_nacked_call_ends_its_span_with_the_error(spans: Any) -> None:
    provider, exporter = spans
    broker = MemoryBroker()
    await broker.start()
    tracing = CallTracing(tracer_provider=provider)
    server = Server(broker, ServerConfig(port=0), middleware=[tracing])
    await server.start()
    try:
        async with connect(server.url) as c:
            got: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            c.on_message = lambda m, _raw: got.set_result(m) if m["meta"]["type"] == NACK else None
            await c.send(CALL, {"uri": "t.any", "timeout": -1_000_000})
            nack = await asyncio.wait_for(got, 5)
            assert nack["payload"]["code"] == 500
            await wait_until(lambda: len(exporter.get_finished_spans()) == 1)
    finally:
        await server.aclose()
        await broker.aclose()
    (span,) = exporter.get_finished_spans()
    assert span.name == "juggler.CALL t.any" and span.status.status_code == StatusCode.ERROR
    assert "invalid call timeout" in (span.status.description or "")
    assert span.attributes is not None and span.attributes["juggler.nack.code"] == 500
    assert tracing.open_spans == 0


async def test_closing_the_server_ends_the_spans_of_unanswered_calls(spans: Any, redis_url: str) -> None:
    """A CALL no callee serves yet (queued in Redis), with a long deadline: its
    span is open until the server stops, which ends it as an error instead of
    dropping it."""
    provider, exporter = spans
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    tracing = CallTracing(tracer_provider=provider)
    server = Server(broker, ServerConfig(port=0), middleware=[tracing])
    await server.start()
    try:
        async with connect(server.url) as c:
            await c.send(CALL, {"uri": "t.nobody", "timeout": 30_000_000_000})
            await wait_until(lambda: tracing.open_spans == 1 or exporter.get_finished_spans(), timeout=5)
            assert exporter.get_finished_spans() == ()
    finally:
        await server.aclose()
        await broker.aclose()
    assert tracing.open_spans == 0
    (span,) = exporter.get_finished_spans()
    assert span.name == "juggler.CALL t.nobody" and span.status.status_code == StatusCode.ERROR


async def _queued_payload(redis_url: str, middleware: list[Any], uri: str) -> bytes:
    """Send a CALL to a server on Redis that no callee serves; the payload it queued."""
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    server = Server(broker, ServerConfig(port=0), middleware=middleware)
    await server.start()
    r = aioredis.Redis.from_url(redis_url)
    try:
        async with connect(server.url) as c:
            await c.send(CALL, {"uri": uri, "timeout": 5_000_000_000}, raw_args='{"x":[1,2]}')
            key = "juggler:calls:{" + uri + "}"
            await wait_until(lambda: r.llen(key), what=f"the call queued in {key}")
            (payload,) = await r.lrange(key, 0, -1)
            return bytes(payload)
    finally:
        await r.aclose()
        await server.aclose()
        await broker.aclose()


async def test_the_trace_member_is_ignored_by_an_original_callee(
    spans: Any, redis_url: str, go_otel_peer: Path  # noqa: F811
) -> None:
    provider, exporter = spans
    tracing = CallTracing(tracer_provider=provider)
    payload = await _queued_payload(redis_url, [tracing], "t.orphan")
    doc = json.loads(payload)
    assert set(doc) == {"conn_uuid", "msg_uuid", "uri", "args", "trace"}
    tracing.close()  # ends the unanswered CALL's span now
    (span,) = exporter.get_finished_spans()
    ctx = span.context
    assert doc["trace"]["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    # our callee reads it back
    assert json.loads(rustext.parse_call_payload(payload).trace) == doc["trace"]
    # the original callee's decoding (Go's encoding/json into its CallPayload) ignores it
    res = subprocess.run([str(go_otel_peer), "decode-call"], input=payload, capture_output=True, timeout=30,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {k: doc[k] for k in ("conn_uuid", "msg_uuid", "uri", "args")}


async def test_without_tracing_no_trace_member_and_no_span(spans: Any, redis_url: str) -> None:
    _, exporter = spans
    payload = await _queued_payload(redis_url, [], "t.plain")
    assert set(json.loads(payload)) == {"conn_uuid", "msg_uuid", "uri", "args"}
    assert rustext.parse_call_payload(payload).trace is None
    assert exporter.get_finished_spans() == ()


def test_the_juggler_cli_modules_do_not_import_opentelemetry() -> None:
    """Tracing off costs nothing: the server, the brokers, the callee and
    their commands load without OpenTelemetry."""
    import sys

    code = (
        "import sys, juggler.server, juggler.callee, juggler.broker.redis, juggler.broker.memory, "
        "juggler.runner, cli.server, cli.callee\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


async def test_server_and_callee_commands_export_one_trace(redis_url: str, tmp_path: Path) -> None:
    """`juggler server` (tracing on by OTEL_TRACES_EXPORTER) and `juggler
    callee --otel` over a real Redis, spans printed by the console exporter."""
    import os
    import signal
    import sys

    from tests.cli.test_otel import console_spans
    from tests.netutil import free_port, wait_for_port

    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "PYTHONUNBUFFERED": "1"}
    port = free_port()
    outs = {name: (tmp_path / f"{name}.out").open("w+") for name in ("server", "callee")}
    procs = {
        "server": subprocess.Popen([sys.executable, "-m", "cli", "server", "--redis", redis_url,
                                    "--listen", f"127.0.0.1:{port}"],
                                   stdout=outs["server"], stderr=subprocess.DEVNULL, env=env),
        "callee": subprocess.Popen([sys.executable, "-m", "cli", "callee", "--redis", redis_url, "--otel"],
                                   stdout=outs["callee"], stderr=subprocess.DEVNULL,
                                   env={**env, "OTEL_SERVICE_NAME": "echo-callee"}),
    }
    try:
        wait_for_port(port, timeout=30, proc=procs["server"])
        async with connect(f"ws://127.0.0.1:{port}/ws") as c:
            assert await c.call("test.echo", "hi", timeout=20) == "hi"
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            assert p.wait(timeout=30) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    found = {}
    for name, f in outs.items():
        f.seek(0)
        (found[name],) = console_spans(f.read())
        f.close()
    server_span, callee_span = found["server"], found["callee"]
    assert server_span["name"] == "juggler.CALL test.echo" and server_span["kind"] == "SpanKind.SERVER"
    assert callee_span["name"] == "juggler.callee test.echo" and callee_span["kind"] == "SpanKind.CONSUMER"
    assert callee_span["context"]["trace_id"] == server_span["context"]["trace_id"]
    assert callee_span["parent_id"] == server_span["context"]["span_id"]
    assert server_span["resource"]["attributes"]["service.name"] == "juggler-server"
    assert callee_span["resource"]["attributes"]["service.name"] == "echo-callee"
