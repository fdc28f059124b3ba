"""HTTP/2 and gRPC through the balancer: h2c from clients (found by its
preface), HTTP/2 to backends (``proto = "h2"``), gRPC calls balanced one by
one over real grpcio servers, gRPC statuses for the balancer's own errors,
protocol translation both ways, reload from h1 to h2 under load, and hostile
HTTP/2 input."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from balancer import BalancerConfigError, load
from balancer.config import from_dict
from balancer.runner import BalancerProcess
from tests.balancer.balancer_helpers import BackendProc
from tests.netutil import free_port

pytestmark = [pytest.mark.timeout(60)]

GRPC_BACKEND = str(Path(__file__).with_name("grpc_backend.py"))
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class GrpcBackend(BackendProc):
    """A grpcio server (grpc_backend.py) in a process of its own."""


def start_grpc_backends(names: list[str], tls: tuple[str, str] | None = None,
                        max_streams: int | None = None) -> list[GrpcBackend]:
    """grpcio servers (tests/balancer/grpc_backend.py), started together;
    ``tls`` = (certificate chain, key) serves TLS; ``max_streams`` sets their
    SETTINGS_MAX_CONCURRENT_STREAMS."""
    started = []
    env = {**os.environ, **({"GRPC_MAX_STREAMS": str(max_streams)} if max_streams else {})}
    for name in names:
        port = free_port()
        proc = subprocess.Popen([sys.executable, GRPC_BACKEND, str(port), name, *(tls or ())], stdout=subprocess.PIPE,
                                env=env)
        started.append(GrpcBackend(name, port, proc))
    for b in started:
        assert b.proc.stdout is not None
        if b.proc.stdout.readline().strip() != b"ready":
            for x in started:
                x.kill()
            raise RuntimeError(f"grpc backend {b.name} did not start")
    return started


@pytest.fixture(scope="module")
def grpc_backends() -> Iterator[list[GrpcBackend]]:
    """Three grpcio backends (g0, g1, g2) shared by the module's tests."""
    bks = start_grpc_backends(["g0", "g1", "g2"])
    yield bks
    for b in bks:
        b.kill()


@pytest.fixture
def channel() -> Iterator:
    """``channel(port)``: an insecure grpcio channel (h2c), closed after the test."""
    opened: list[grpc.Channel] = []

    def make(port: int) -> grpc.Channel:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        opened.append(ch)
        return ch

    yield make
    for ch in opened:
        ch.close()


def unary(ch: grpc.Channel, method: str = "Unary"):
    return ch.unary_unary(f"/test.Echo/{method}")


# --- gRPC calls, balanced per call -----------------------------------------


def test_calls_over_one_channel_go_round_robin_with_metadata_and_trailers(grpc_backends, proxy, channel):
    lb = proxy(grpc_backends, proto="h2")
    ch = channel(lb.address[1])
    served = []
    for i in range(9):
        reply, call = unary(ch).with_call(b"m%d" % i, metadata=(("x-tag", "v1"),), timeout=5)
        name, _, echoed = reply.partition(b":")
        assert echoed == b"m%d" % i
        served.append(name.decode())
        assert dict(call.initial_metadata())["x-tag"] == "v1"
        assert dict(call.trailing_metadata())["x-backend"] == served[-1]
        assert call.code() == grpc.StatusCode.OK
    # one channel (one HTTP/2 connection) and yet every backend got its share
    assert Counter(served) == {"g0": 3, "g1": 3, "g2": 3}
    assert [b["requests"] for b in lb.backends()] == [3, 3, 3]


def test_streaming_calls_stream_without_buffering(grpc_backends, proxy, channel):
    lb = proxy(grpc_backends[:1], proto="h2")
    ch = channel(lb.address[1])
    assert list(ch.unary_stream("/test.Echo/ServerStream")(b"200", timeout=10)) == [
        b"g0:%d" % i for i in range(200)]
    parts = [b"p%d" % i for i in range(50)]
    assert ch.stream_unary("/test.Echo/ClientStream")(iter(parts), timeout=10) == b"g0:" + b",".join(parts)
    # lockstep: each message goes only once the previous reply came back, so a
    # balancer that held a message (or a reply) back would never see the next
    outbox: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (m := outbox.get(timeout=5)) is not None:
            yield m

    replies = ch.stream_stream("/test.Echo/Bidi")(requests(), timeout=10)
    for i in range(20):
        outbox.put(b"q%d" % i)
        assert next(replies) == b"g0:q%d" % i
    outbox.put(None)
    assert list(replies) == []


def test_backend_statuses_pass_through(grpc_backends, proxy, channel):
    lb = proxy(grpc_backends, proto="h2")
    ch = channel(lb.address[1])
    with pytest.raises(grpc.RpcError) as e:
        unary(ch, "Fail")(b"widget 7", timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "no such thing: widget 7"
    with pytest.raises(grpc.RpcError) as e:
        unary(ch, "NoSuchMethod")(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert lb.stats()["responses"]["5xx"] == 0


def test_balancer_errors_reach_grpc_clients_as_statuses(grpc_backends, proxy, channel):
    dead = f"127.0.0.1:{free_port()}"
    lb = proxy([dead], proto="h2", retries=0)
    with pytest.raises(grpc.RpcError) as e:
        unary(channel(lb.address[1]))(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert e.value.details() == "backend unavailable"  # the balancer's words, not an HTTP 502 seen by grpc

    slow = proxy(grpc_backends[:1], proto="h2", timeouts={"response": 0.3})
    ch = channel(slow.address[1])
    with pytest.raises(grpc.RpcError) as e:
        unary(ch, "Slow")(b"2", timeout=5)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert e.value.details() == "backend timeout"
    # the client's own deadline, shorter than the balancer's: the call is cancelled end to end
    with pytest.raises(grpc.RpcError) as e:
        unary(ch, "Slow")(b"0.25", timeout=0.1)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert unary(ch)(b"still", timeout=5) == b"g0:still"

    slow.set_backend_state(grpc_backends[0].address, "down")
    with pytest.raises(grpc.RpcError) as e:
        unary(ch)(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert e.value.details() == "no backend available"
    # on the wire: a Trailers-Only answer, HTTP 200 with the status in its headers
    out = subprocess.run(
        ["curl", "-s", "-i", "--http2-prior-knowledge", "--max-time", "5", "-X", "POST", "-H",
         "content-type: application/grpc", "-H", "te: trailers", f"http://127.0.0.1:{slow.address[1]}/test.Echo/Unary"],
        capture_output=True, check=True).stdout.decode()
    assert out.startswith("HTTP/2 200")
    assert "grpc-status: 14" in out and "content-type: application/grpc" in out


def test_a_killed_backend_fails_its_calls_and_the_next_go_to_the_others(proxy, channel):
    victim, survivor = start_grpc_backends(["victim", "survivor"])
    try:
        lb = proxy([victim, survivor], proto="h2", passive={"eject_after": 1}, retries=1)
        ch = channel(lb.address[1])
        calls = [unary(ch, "Slow").future(b"1", timeout=10) for _ in range(2)]
        deadline = time.monotonic() + 5
        while sum(b["active"] for b in lb.backends()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        victim.kill()
        outcomes = sorted(str(c.code()) if c.exception() else c.result().decode() for c in calls)
        assert outcomes == ["StatusCode.UNAVAILABLE", "survivor"]
        # a new call never reaches the dead backend: refused connection, next backend
        assert [unary(ch)(b"x", timeout=5) for _ in range(6)] == [b"survivor:x"] * 6
    finally:
        victim.kill()
        survivor.kill()


def test_grpc_over_tls_on_both_sides(proxy, channel, pki):
    leaf = pki.leaf("localhost", "127.0.0.1")
    bks = start_grpc_backends(["t0", "t1"], tls=(str(leaf.cert), str(leaf.key)))
    try:
        # TLS to the backends (ALPN h2, verified against the CA); clients in clear (h2c) or over TLS (ALPN h2)
        lb = proxy(bks, proto="h2",
                   listeners=[{"address": "127.0.0.1:0", "default_backend": "default"},
                              {"address": "127.0.0.1:0", "tls": True, "default_backend": "default"}],
                   tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}], "backend": True,
                        "backend_ca": str(pki.ca)})
        plain, tls = (a[1] for a in lb.addresses)
        assert sorted(unary(channel(plain))(b"c", timeout=5) for _ in range(2)) == [b"t0:c", b"t1:c"]
        creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        with grpc.secure_channel(f"localhost:{tls}", creds) as ch:
            assert list(ch.unary_stream("/test.Echo/ServerStream")(b"3", timeout=5))[-1].endswith(b":2")
            with pytest.raises(grpc.RpcError) as e:
                unary(ch, "Fail")(b"tls", timeout=5)
            assert (e.value.code(), e.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such thing: tls")
    finally:
        for b in bks:
            b.kill()


def test_a_backend_stream_limit_is_respected_by_opening_connections(proxy, channel):
    (limited,) = start_grpc_backends(["limited"], max_streams=2)
    try:
        lb = proxy([limited], proto="h2", workers=1)
        ch = channel(lb.address[1])
        calls = [unary(ch, "Slow").future(b"0.3", timeout=10) for _ in range(6)]
        assert [c.result() for c in calls] == [b"limited"] * 6
        # six at once although a connection takes two streams: three connections, none refused a stream
        assert unary(ch, "MaxInFlight")(b"", timeout=5) == b"6"
    finally:
        limited.kill()


def test_a_backend_going_away_finishes_its_calls_and_gets_no_new_ones(proxy, channel):
    leaving, staying = start_grpc_backends(["leaving", "staying"])
    try:
        lb = proxy([leaving, staying], proto="h2", workers=1)
        ch = channel(lb.address[1])
        assert sorted(unary(ch)(b"", timeout=5) for _ in range(2)) == [b"leaving:", b"staying:"]
        slow = [unary(ch, "Slow").future(b"0.5", timeout=10) for _ in range(2)]
        deadline = time.monotonic() + 5
        while sum(b["active"] for b in lb.backends()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        leaving.proc.send_signal(signal.SIGTERM)  # GOAWAY, then its call in flight finishes
        assert leaving.proc.stdout is not None and leaving.proc.stdout.readline() == b"stopping\n"
        assert [unary(ch)(b"n", timeout=5) for _ in range(4)] == [b"staying:n"] * 4
        assert sorted(c.result() for c in slow) == [b"leaving", b"staying"]
        leaving.proc.wait(timeout=10)
        assert [unary(ch)(b"m", timeout=5) for _ in range(2)] == [b"staying:m"] * 2
    finally:
        leaving.kill()
        staying.kill()


# --- protocol translation ---------------------------------------------------


def curl_h2c(url: str, *args: str) -> tuple[str, str]:
    """``curl --http2-prior-knowledge``: (HTTP version, body)."""
    out = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "--max-time", "5", "-w", "\n%{http_version}",
                          *args, url], capture_output=True, check=True, text=True).stdout
    body, _, version = out.rpartition("\n")
    return version, body


def test_h2c_clients_reach_http1_backends(backends, proxy):
    b = backends(1)
    lb = proxy(b)
    port = lb.address[1]
    version, body = curl_h2c(f"http://127.0.0.1:{port}/headers")
    seen = json.loads(body)
    assert version == "2" and seen["version"] == "HTTP/1.1"
    assert dict(seen["headers"])["host"] == f"127.0.0.1:{port}"  # :authority becomes Host
    assert curl_h2c(f"http://127.0.0.1:{port}/echo", "--data-binary", "x" * 100_000)[1] == "x" * 100_000
    # HTTP/1 on the same listener still takes the fast path
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/whoami")
    assert c.getresponse().read() == b"b0"
    c.close()


def test_http1_clients_reach_http2_backends(backends, proxy, tmp_path):
    b = backends(1)
    log = tmp_path / "inner.log"
    inner = proxy(b, workers=1, access_log={"path": str(log), "format": "%HV %HM %HP %ST"})
    outer = proxy([f"127.0.0.1:{inner.address[1]}"], proto="h2", workers=1)
    c = http.client.HTTPConnection("127.0.0.1", outer.address[1], timeout=5)
    c.request("GET", "/size/300000")
    r = c.getresponse()
    assert r.status == 200 and len(r.read()) == 300_000
    c.request("POST", "/echo", body=b"y" * 200_000)
    assert c.getresponse().read() == b"y" * 200_000
    c.request("GET", "/headers", headers={"Host": "app.example"})
    seen = json.loads(c.getresponse().read())
    assert dict(seen["headers"])["host"] == "app.example"
    c.close()
    # HTTP/2 on both sides: :authority passes as it came
    version, body = curl_h2c(f"http://127.0.0.1:{outer.address[1]}/headers")
    assert version == "2" and dict(json.loads(body)["headers"])["host"] == f"127.0.0.1:{outer.address[1]}"
    inner.close()  # flushes its log
    assert log.read_text().splitlines() == [
        "HTTP/2.0 GET /size/300000 200", "HTTP/2.0 POST /echo 200", "HTTP/2.0 GET /headers 200",
        "HTTP/2.0 GET /headers 200"]


def test_idle_http2_backend_connections_are_closed(backends, proxy):
    inner = proxy(backends(1), workers=1)
    outer = proxy([f"127.0.0.1:{inner.address[1]}"], proto="h2", workers=1, limits={"pool_idle_timeout": 0.2})
    for _ in range(3):  # one multiplexed connection, reused
        assert curl_h2c(f"http://127.0.0.1:{outer.address[1]}/whoami")[1] == "b0"
    assert inner.stats()["connections_total"] == 1
    deadline = time.monotonic() + 5
    while inner.stats()["connections_active"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert inner.stats()["connections_active"] == 0


# --- routing, header rules, access log, config ------------------------------

ROUTED = """
listen = "127.0.0.1:0"
workers = 1

[access_log]
path = "{log}"
format = "%HV %b %HP %ST %ts %[res.hdr(grpc-status)] %[res.hdr(x-backend)]"

[backends.web]
servers = ["{web}"]

[backends.rpc]
servers = [{rpc}]
proto = "h2"
[backends.rpc.request_headers]
set = {{ "x-route" = "rpc" }}
[backends.rpc.response_headers]
set = {{ "x-served-by" = "lb" }}

[[routes]]
path_prefix = "/test.Echo/"
backend = "rpc"

[[routes]]
backend = "web"
"""


async def test_routes_header_rules_and_access_log_apply_to_http2(grpc_backends, backends, tmp_path, channel):
    web = backends(1)[0]
    log = tmp_path / "access.log"
    cfg = from_dict(tomllib.loads(ROUTED.format(
        log=log, web=web.address, rpc=", ".join(f'"{g.address}"' for g in grpc_backends[:2]))))
    assert [p.proto for p in cfg.pools().values()] == ["h1", "h2"]
    async with BalancerProcess(cfg) as process:
        port = process.lb.address[1]
        ch = channel(port)
        reply, call = await asyncio.to_thread(unary(ch).with_call, b"r", timeout=5)
        initial = dict(call.initial_metadata())
        assert reply.endswith(b":r") and initial["x-route"] == "rpc" and initial["x-served-by"] == "lb"
        with pytest.raises(grpc.RpcError) as failed:
            await asyncio.to_thread(unary(ch, "Fail"), b"x", timeout=5)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        version, body = await asyncio.to_thread(curl_h2c, f"http://127.0.0.1:{port}/whoami")
        assert (version, body) == ("2", "b0")
    lines = log.read_text().splitlines()
    # the call's status and trailing metadata come in trailers: logged as response headers
    backend = lines[0].rsplit(" ", 1)[1]
    assert lines == [f"HTTP/2.0 rpc /test.Echo/Unary 200 -- 0 {backend}", "HTTP/2.0 rpc /test.Echo/Fail 200 -- 5 -",
                     f"HTTP/2.0 web /whoami 200 -- - {web.name}"]


def test_proto_is_checked_and_inherited(tmp_path):
    base = 'listen = "127.0.0.1:0"\nproto = "h2"\n[backends.a]\nservers = ["127.0.0.1:1"]\n'
    cfg = from_dict(tomllib.loads(base + '[backends.b]\nservers = ["127.0.0.1:2"]\nproto = "h1"\n'))
    assert {n: p.proto for n, p in cfg.pools().items()} == {"a": "h2", "b": "h1"}
    assert [p.config.proto for p in cfg.backend_pools()] == ["h2", "h1"]  # as the data plane reads them
    path = tmp_path / "bad.toml"
    path.write_text('listen = "127.0.0.1:0"\n\n[backends.a]\nservers = ["127.0.0.1:1"]\nproto = "h3"\n')
    with pytest.raises(BalancerConfigError, match=r'bad.toml:5: .*proto must be "h1" or "h2", got \'h3\''):
        load(path)


def test_cli_flag_sets_the_backends_protocol(tmp_path):
    from cli.balancer import build_config
    from cli.main import build_parser

    args = build_parser().parse_args(
        ["balancer", "--listen", "127.0.0.1:0", "--backends", "127.0.0.1:1", "--backend-proto", "h2"])
    assert [p.config.proto for p in build_config(args).backend_pools()] == ["h2"]
    out = subprocess.run([sys.executable, "-m", "cli", "balancer", "--listen", "127.0.0.1:0", "--backends",
                          "127.0.0.1:1", "--backend-proto", "h3"], check=False, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "--backend-proto: invalid choice: 'h3'" in out.stderr


# --- reload -----------------------------------------------------------------

SWITCH = """
listen = "127.0.0.1:{port}"
workers = 2
proto = "{proto}"
[[backends]]
address = "{inner}"
"""


async def test_reload_switches_a_pool_from_h1_to_h2_under_load(backends, proxy, tmp_path):
    b = backends(1)
    log = tmp_path / "inner.log"
    inner = proxy(b, workers=1, access_log={"path": str(log), "format": "%HV"})
    path = tmp_path / "lb.toml"
    port = free_port()
    path.write_text(SWITCH.format(port=port, proto="h1", inner=f"127.0.0.1:{inner.address[1]}"))
    stop = threading.Event()
    errors: list[object] = []
    done = [0]

    def client() -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while not stop.is_set():
            try:
                c.request("POST", "/echo", body=b"z" * 1000)
                r = c.getresponse()
                if r.status != 200 or r.read() != b"z" * 1000:
                    errors.append(r.status)
                done[0] += 1
            except (OSError, http.client.HTTPException) as exc:
                errors.append(exc)
                return
        c.close()

    async with BalancerProcess(load(path), config_path=str(path)) as process:
        tasks = [asyncio.create_task(asyncio.to_thread(client)) for _ in range(4)]
        while done[0] < 50:
            await asyncio.sleep(0.01)
        path.write_text(SWITCH.format(port=port, proto="h2", inner=f"127.0.0.1:{inner.address[1]}"))
        await process.lb.reload()
        at_reload = done[0]
        while done[0] < at_reload + 100:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*tasks)
    assert errors == []
    inner.close()
    versions = log.read_text().split()
    assert versions[0] == "HTTP/1.1" and versions[-1] == "HTTP/2.0"
    # once switched, never back: requests in flight finished on HTTP/1, later ones all went over HTTP/2
    first_h2 = versions.index("HTTP/2.0")
    assert set(versions[first_h2 + 8:]) == {"HTTP/2.0"}


# --- hostile HTTP/2 input ----------------------------------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_int(value: int, prefix: int, first: int = 0) -> bytes:
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes(out + [value])


def literal(name: bytes, value: bytes) -> bytes:
    """A header field, literal name and value, not indexed (RFC 7541 §6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


GET = b"\x82\x86\x84" + literal(b":authority", b"lb")  # GET http://lb/
SETTINGS = frame(4, 0, 0)
HEADERS, RST_STREAM, CONTINUATION = 1, 3, 9
END_STREAM, END_HEADERS = 1, 4


def hostile(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; whatever comes back before the
    balancer closes it (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # closed on us while sending: that is an answer too
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    while len(data) >= 9:
        n = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + n]))
        data = data[9 + n:]
    return out


def goaway_code(data: bytes) -> int | None:
    for kind, _, _, payload in frames_of(data):
        if kind == 7:
            return int.from_bytes(payload[4:8], "big")
    return None


def test_hostile_http2_input_costs_only_its_connection(grpc_backends, proxy, channel):
    lb = proxy(grpc_backends[:1], proto="h2", workers=1)
    port = lb.address[1]
    ch = channel(port)
    assert unary(ch)(b"before", timeout=5) == b"g0:before"

    # garbage after the preface: a connection error (here FRAME_SIZE_ERROR), nothing forwarded
    assert goaway_code(hostile(port, PREFACE + b"\xff" * 64)) == 6
    # a frame the preface does not allow first (DATA on stream 0): PROTOCOL_ERROR
    assert goaway_code(hostile(port, PREFACE + frame(0, 0, 0, b"x"))) == 1
    # a header block far over the limit, in CONTINUATION frames: refused before it reaches a backend
    big = GET + literal(b"x-big", b"a" * 200_000)
    chunks = [big[i:i + 16384] for i in range(0, len(big), 16384)]
    data = PREFACE + SETTINGS + frame(HEADERS, END_STREAM, 1, chunks[0])
    for i, c in enumerate(chunks[1:], 1):
        data += frame(CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, 1, c)
    answer = frames_of(hostile(port, data))
    assert any(k == 7 or k == RST_STREAM or (k == HEADERS and sid == 1) for k, _, sid, _ in answer)
    assert lb.backends()[0]["requests"] == 1  # none of it reached the backend
    # rapid reset: streams opened and cancelled at once, by the thousand
    flood = b"".join(frame(HEADERS, END_STREAM | END_HEADERS, sid, GET) + frame(RST_STREAM, 0, sid, b"\0\0\0\x08")
                     for sid in range(1, 4001, 2))
    assert goaway_code(hostile(port, PREFACE + SETTINGS + flood)) == 0xB  # ENHANCE_YOUR_CALM
    # an HTTP/1 request that merely starts like the preface is served as HTTP/1
    assert hostile(port, b"PRI * HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 ")

    # the channel that was there all along still works, on the same connection
    assert unary(ch)(b"after", timeout=5) == b"g0:after"


@pytest.mark.parametrize(("settings", "connections"), [
    ({"h2_max_streams": 2}, 3),  # six at once, two per connection
    ({"h2_max_streams": 2, "h2_connections": 1}, 1),  # one connection at most: it carries all six
    ({}, 1),  # the defaults: up to 100 streams on one connection
])
def test_http2_connection_limits_of_a_pool(backends, proxy, settings, connections):
    """h2_max_streams / h2_connections: how many connections six concurrent requests open to an
    HTTP/2 server that allows many streams (another balancer, counting its connections)."""
    inner = proxy(backends(1), workers=1)
    outer = proxy([f"127.0.0.1:{inner.address[1]}"], proto="h2", workers=1, **settings)

    def slow() -> int:
        c = http.client.HTTPConnection("127.0.0.1", outer.address[1], timeout=10)
        try:
            c.request("GET", "/slow?ms=1000")  # long enough for all six to be in flight at once
            r = c.getresponse()
            r.read()
            return r.status
        finally:
            c.close()

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(slow())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results == [200] * 6
    assert inner.stats()["connections_total"] == connections
