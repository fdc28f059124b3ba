"""Tracing from the command line (``cli/otel.py``): when ``--otel`` and the
``OTEL_*`` variables turn it on, the errors a user gets, and real `juggler
rpc serve` / `juggler rpc call` processes exporting one trace through the
SDK's console exporter (``OTEL_TRACES_EXPORTER=console``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from cli.otel import OtelSetupError, otel_wanted, start_tracing


def test_when_tracing_is_on() -> None:
    assert not otel_wanted(False, {})
    assert otel_wanted(True, {})
    assert otel_wanted(False, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert otel_wanted(False, {"OTEL_TRACES_EXPORTER": "console,otlp"})
    assert not otel_wanted(False, {"OTEL_TRACES_EXPORTER": "none"})
    assert otel_wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert otel_wanted(False, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not otel_wanted(True, {"OTEL_SDK_DISABLED": "true"})
    assert not otel_wanted(False, {"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"})


def test_missing_extra_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if the SDK were not installed
    with pytest.raises(OtelSetupError, match=r"pip install 'juggler-suite\[otel\]'"):
        start_tracing("x", {})


def test_unknown_exporter_and_protocol_are_refused() -> None:
    with pytest.raises(OtelSetupError, match="no exporter 'nope' installed; known: .*console"):
        start_tracing("x", {"OTEL_TRACES_EXPORTER": "nope"})
    with pytest.raises(OtelSetupError, match="expected grpc or http/protobuf"):
        start_tracing("x", {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})


def test_cli_refuses_an_unknown_exporter_in_one_line() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cli", "rpc", "call", "127.0.0.1:1", "Arith.Mul", "{}", "--otel"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "nope"},
    )
    assert res.returncode == 2
    assert res.stderr.startswith("error: OTEL_TRACES_EXPORTER: no exporter 'nope' installed")
    assert len(res.stderr.strip().splitlines()) == 1


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the console exporter printed (pretty JSON objects, one after another) among other lines."""
    decoder = json.JSONDecoder()
    spans, i = [], 0
    while True:
        start = text.find("{\n", i)
        if start < 0:
            return spans
        obj, i = decoder.raw_decode(text, start)
        if isinstance(obj, dict) and "context" in obj:
            spans.append(obj)


def test_rpc_serve_and_call_export_one_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.rpc.test_rpcx_e2e import serve

    with monkeypatch.context() as m:  # serve() starts the server with this process's environment
        m.setenv("OTEL_TRACES_EXPORTER", "console")
        m.setenv("OTEL_SERVICE_NAME", "arith-server")
        served = serve("--example", "arith")
    try:
        call = subprocess.run(
            [sys.executable, "-m", "cli", "rpc", "call", served.address, "Arith.Mul", '{"A":6,"B":7}'],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "OTEL_TRACES_EXPORTER": "console"},
        )
        assert call.returncode == 0, call.stderr
        assert call.stdout.splitlines()[0] == '{"C": 42}'
        served.signal(signal.SIGTERM)
        assert served.wait() == 0
        assert served.proc.stdout is not None
        server_out = served.proc.stdout.read()
    finally:
        served.stop()
    (client_span,) = console_spans(call.stdout)
    (server_span,) = console_spans(server_out)
    assert client_span["name"] == "rpcx.client.Arith.Mul" and client_span["kind"] == "SpanKind.CLIENT"
    assert server_span["name"] == "rpcx.service.Arith.Mul" and server_span["kind"] == "SpanKind.SERVER"
    assert server_span["context"]["trace_id"] == client_span["context"]["trace_id"]
    assert server_span["parent_id"] == client_span["context"]["span_id"]
    assert client_span["resource"]["attributes"]["service.name"] == "juggler-rpc-call"  # the default
    assert server_span["resource"]["attributes"]["service.name"] == "arith-server"  # OTEL_SERVICE_NAME
    assert server_span["attributes"]["rpc.system"] == "rpcx"


def test_rpc_serve_without_otel_prints_no_span(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.rpc.test_rpcx_e2e import serve

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    for k in os.environ:
        if k.startswith("OTEL_"):
            monkeypatch.delenv(k)
    served = serve("--example", "arith")
    try:
        call = subprocess.run(
            [sys.executable, "-m", "cli", "rpc", "call", served.address, "Arith.Mul", '{"A":6,"B":7}'],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )
        assert call.returncode == 0 and call.stdout == '{"C": 42}\n', call.stderr
        served.signal(signal.SIGTERM)
        assert served.wait() == 0
        assert served.proc.stdout is not None
        assert console_spans(served.proc.stdout.read()) == []
    finally:
        served.stop()


@pytest.mark.parametrize("processes", [1, 2])
def test_rpc_bench_traces_every_call(processes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`juggler rpc bench --otel`: a CLIENT span per call (the warm-up call
    of each client process's connection included), each the parent of the
    server's span; with several client processes, each sets tracing up."""
    from tests.rpc.test_rpcx_e2e import serve

    with monkeypatch.context() as m:
        m.setenv("OTEL_TRACES_EXPORTER", "console")
        served = serve("--example", "arith")
    try:
        bench = subprocess.run(
            [sys.executable, "-m", "cli", "rpc", "bench", served.address, "--example", "arith", "-n", "4", "-c", "2",
             "--pool", "1", "--processes", str(processes), "--otel"],
            capture_output=True, text=True, timeout=120, check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
                "OTEL_TRACES_EXPORTER": "console"},
        )
        assert bench.returncode == 0, bench.stderr + bench.stdout
        served.signal(signal.SIGTERM)
        assert served.wait() == 0
        assert served.proc.stdout is not None
        server_out = served.proc.stdout.read()
    finally:
        served.stop()
    clients = console_spans(bench.stdout)
    servers = console_spans(server_out)
    assert len(clients) == 4 + processes  # the calls and one warm-up call per client process
    assert {s["name"] for s in clients} == {"rpcx.client.Arith.Mul"}
    assert {s["resource"]["attributes"]["service.name"] for s in clients} == {"juggler-rpc-bench"}
    assert sorted(s["parent_id"] for s in servers) == sorted(s["context"]["span_id"] for s in clients)
