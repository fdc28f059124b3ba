"""What the hand-written HTTP/1 fast path adds: pipelining, heads split across
segments, hand-over to hyper in the middle of a connection, response framing
kept exact across keep-alive exchanges."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from balancer_helpers import dechunk, lb_config, pattern, raw_exchange, split_response


@pytest.fixture
def lb(backends, proxy):
    return proxy(backends(2), workers=1)


def port_of(b) -> int:
    return b.address[1]


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(f, head_request: bool = False) -> tuple[str, dict[str, str], bytes]:
    """One response from a keep-alive stream (Content-Length or chunked)."""
    status = f.readline().decode("latin-1").rstrip("\r\n")
    assert status, "connection closed before a response"
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    if head_request or status.split()[1].startswith("1") or status.split()[1] in ("204", "304"):
        return status, headers, b""
    if headers.get("transfer-encoding") == "chunked":
        body = bytearray()
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                while f.readline() not in (b"\r\n", b""):
                    pass
                return status, headers, bytes(body)
            body += f.read(size)
            assert f.read(2) == b"\r\n"
    if "content-length" in headers:
        return status, headers, f.read(int(headers["content-length"]))
    return status, headers, f.read()


def test_pipelined_requests_answered_in_order(lb):
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(
            b"GET /size/10 HTTP/1.1\r\nHost: t\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /size/3000?chunked=1 HTTP/1.1\r\nHost: t\r\n\r\n"
            b"HEAD /size/7 HTTP/1.1\r\nHost: t\r\n\r\n"
            b"GET /size/70000 HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        assert read_response(f)[2] == pattern(10)
        assert read_response(f)[2] == b"hello"
        status, headers, body = read_response(f)
        assert headers["transfer-encoding"] == "chunked" and body == pattern(3000)
        status, headers, _ = read_response(f, head_request=True)
        assert status.startswith("HTTP/1.1 200") and headers["content-length"] == "7"
        assert read_response(f)[2] == pattern(70000)


def test_request_split_across_many_segments(lb):
    req = b"POST /echo HTTP/1.1\r\nHost: t\r\nX-Long: " + b"v" * 3000 + b"\r\nContent-Length: 2000\r\n\r\n" + pattern(2000)
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        for i in range(0, len(req), 7):
            s.sendall(req[i : i + 7])
        status, headers, body = read_response(f)
        assert status.startswith("HTTP/1.1 200") and body == pattern(2000)
        # and byte by byte through the head of a second one
        for b in b"GET /whoami HTTP/1.1\r\nHost: t\r\n\r\n":
            s.sendall(bytes([b]))
        assert read_response(f)[2] in (b"b0", b"b1")


def test_upgrade_after_plain_requests_hands_over_to_hyper(lb):
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(b"GET /size/100 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == pattern(100)
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        status, headers, _ = read_response(f, head_request=True)
        assert status.startswith("HTTP/1.1 101"), status
        assert headers["upgrade"] == "echo"
        s.sendall(b"ping-after-upgrade")
        assert f.read(len(b"ping-after-upgrade")) == b"ping-after-upgrade"


@pytest.mark.parametrize(
    "second",
    [
        # chunked request body: hyper's
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        # Expect: 100-continue: hyper's
        b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
        # absolute-form target: hyper's
        b"POST http://t/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    ],
)
def test_fallback_mid_connection_then_more_requests(lb, second):
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(b"GET /size/10 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == pattern(10)
        s.sendall(second)
        status, _, body = read_response(f)
        if status.startswith("HTTP/1.1 100"):
            status, _, body = read_response(f)
        assert status.startswith("HTTP/1.1 200"), status
        assert body == b"hello"
        s.sendall(b"GET /size/20 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == pattern(20)


def test_large_upload_streams_through_hyper(lb):
    n = 3 * 1024 * 1024
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(b"GET /size/10 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == pattern(10)
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % n)
        s.sendall(pattern(n))
        status, headers, body = read_response(f)
        assert headers["x-received-length"] == str(n) and body == pattern(n)


@pytest.mark.parametrize("size", [0, 5, 70000, 600 * 1024])
def test_chunked_response_keeps_connection_in_sync(lb, size):
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        for _ in range(3):
            s.sendall(f"GET /size/{size}?chunked=1 HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            status, headers, body = read_response(f)
            assert headers["transfer-encoding"] == "chunked"
            assert "content-length" not in headers
            assert body == pattern(size)


@pytest.mark.parametrize("mode", ["chunked", "close"])
def test_http10_keep_alive_client_gets_close_delimited_body(lb, mode):
    raw = raw_exchange(
        port_of(lb), f"GET /size/5000?{mode}=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n".encode()
    )
    status, headers, body = split_response(raw)
    assert status.startswith("HTTP/1.0 200")
    assert "transfer-encoding" not in headers and headers.get("connection") == "close"
    assert body == pattern(5000)


def test_close_delimited_backend_answer_chunked_to_http11(lb):
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(b"GET /size/100000?close=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, body = read_response(f)
        assert headers["transfer-encoding"] == "chunked" and body == pattern(100000)
        s.sendall(b"GET /size/5 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == pattern(5)


def test_forwarding_and_hop_by_hop_on_fast_path(lb):
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(
            b"GET /headers HTTP/1.1\r\nHost: example.org\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
            b"Keep-Alive: 5\r\nTE: trailers\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\n"
            b"X-Forwarded-Proto: https\r\nForwarded: for=1.2.3.4\r\nX-Keep: yes\r\n\r\n"
        )
        status, _, body = read_response(f)
    got = json.loads(body)
    h: dict[str, list[str]] = {}
    for k, v in got["headers"]:
        h.setdefault(k.lower(), []).append(v)
    assert got["version"] == "HTTP/1.1"
    assert h["host"] == ["example.org"] and h["x-keep"] == ["yes"]
    for hop in ("connection", "x-drop", "keep-alive", "te"):
        assert hop not in h, hop
    assert h["x-forwarded-for"] == ["1.2.3.4, 5.6.7.8, 127.0.0.1"]
    assert h["x-forwarded-proto"] == ["http"]
    assert h["forwarded"] == ["for=1.2.3.4, for=127.0.0.1;proto=http"]


def test_http10_without_host_gets_backend_host(lb):
    raw = raw_exchange(port_of(lb), b"GET /headers HTTP/1.0\r\n\r\n")
    _, _, body = split_response(raw)
    h = {k.lower(): v for k, v in json.loads(body)["headers"]}
    assert h["host"].startswith("127.0.0.1:")


def test_malformed_request_rejected_by_hyper(lb):
    raw = raw_exchange(port_of(lb), b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400"), raw[:100]


def test_client_leaving_mid_response_does_not_break_the_next_one(lb):
    with connect(port_of(lb)) as s:
        s.sendall(b"GET /size/4000000 HTTP/1.1\r\nHost: t\r\n\r\n")
        s.recv(1000)
    for _ in range(5):
        raw = raw_exchange(port_of(lb), b"GET /size/1000 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert split_response(raw)[2] == pattern(1000)
    st = lb.stats()
    assert st["requests"] >= 6


def test_chunked_response_passthrough_via_raw_exchange_dechunks(lb):
    raw = raw_exchange(port_of(lb), b"GET /size/65537?chunked=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    status, headers, body = split_response(raw)
    assert headers["transfer-encoding"] == "chunked" and headers["connection"] == "close"
    assert dechunk(body) == pattern(65537)


def test_reload_applies_to_the_next_request_of_an_idle_keep_alive_connection(backends, proxy):
    a, b = backends(2)
    lb = proxy([a], workers=1)
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        s.sendall(b"GET /whoami HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == a.name.encode()
        lb.update(lb_config([b], workers=1))
        s.sendall(b"GET /whoami HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == b.name.encode()


def test_new_connections_survive_frequent_idle_checks(backends, proxy):
    """Idle checks (every idle_timeout/2) never close a connection whose
    request has not been read yet: ab aborts on the reset that causes."""
    lb = proxy(backends(2), workers=1, timeouts={"idle": 0.05})
    out = subprocess.run(
        ["ab", "-n", "3000", "-c", "10", f"http://127.0.0.1:{port_of(lb)}/size/10"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Failed requests:        0" in out.stdout, out.stdout


SPECIAL = {
    "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade", "expect",
    "host", "proxy-connection", "proxy-authenticate", "proxy-authorization", "x-forwarded-for",
    "x-forwarded-proto", "forwarded",
}


@settings(max_examples=60, deadline=None)
@given(
    headers=st.lists(
        st.tuples(st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,12}", fullmatch=True),
                  st.from_regex(r"[!-~]([ -~]{0,28}[!-~])?", fullmatch=True)),
        max_size=8,
    ),
    body=st.binary(max_size=3000),
    cut=st.integers(0, 1 << 20),
    http10=st.booleans(),
)
def test_generated_requests_forwarded_exactly(proxy_session, headers, body, cut, http10):
    """Random end-to-end headers and bodies, the request split at a random
    byte: the backend sees every header as sent and the body intact."""
    port = proxy_session.address[1]
    hs = [(k, v) for k, v in headers if k.lower() not in SPECIAL]
    version = "1.0" if http10 else "1.1"
    lines = "".join(f"{k}: {v}\r\n" for k, v in hs)
    for path, payload in (("/echo", body), ("/headers", b"")):
        method = "POST" if payload else "GET"
        raw = (f"{method} {path} HTTP/{version}\r\nHost: t\r\n{lines}Content-Length: {len(payload)}\r\n"
               "Connection: close\r\n\r\n").encode() + payload
        at = cut % len(raw)
        with connect(port) as s:
            s.sendall(raw[:at])
            s.sendall(raw[at:])
            chunks = []
            while data := s.recv(1 << 16):
                chunks.append(data)
        status, _, got = split_response(b"".join(chunks))
        assert status.startswith(f"HTTP/{version} 200"), status
        if path == "/echo":
            assert got == payload
        else:
            seen = json.loads(got)["headers"]
            for k, v in hs:
                assert [k, v] in seen, (k, v, seen)


def test_a_worker_serves_keep_alive_and_idles_without_cpu(backends, proxy):
    """Requests on a kept-alive connection are answered; once traffic stops
    the worker blocks: an idle balancer burns no CPU."""
    lb = proxy(backends(1), workers=1)
    with connect(port_of(lb)) as s, s.makefile("rb") as f:
        for i in range(300):
            s.sendall(b"GET /size/%d HTTP/1.1\r\nHost: t\r\n\r\n" % (i % 50))
            assert read_response(f)[2] == pattern(i % 50)
        c0 = time.process_time()
        time.sleep(0.5)  # the window measured, not a synchronisation
        used = time.process_time() - c0
        s.sendall(b"GET /size/5 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2] == pattern(5)
    assert used < 0.2, f"{used:.3f} s of CPU in 0.5 s of idle"
