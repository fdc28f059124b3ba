"""HTTP semantics through the real proxy against real backend processes."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time

import pytest
from balancer_helpers import dechunk, pattern, raw_exchange, split_response

SIZES = [0, 1, 1024, 65535, 300 * 1024, 4 * 1024 * 1024, 50 * 1024 * 1024]


def port_of(b) -> int:
    return b.address[1]


@pytest.fixture
def lb(backends, proxy):
    return proxy(backends(2), workers=2)


def get(port: int, path: str, headers: dict[str, str] | None = None, method: str = "GET", body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


@pytest.mark.parametrize(
    ("size", "mode"),
    [(n, m) for n in SIZES for m in ("length", "chunked", "close") if n < SIZES[-1] or m == "length"],
)
def test_bodies_byte_identical_http11(lb, size, mode):
    q = "" if mode == "length" else f"?{mode}=1"
    status, headers, body = get(port_of(lb), f"/size/{size}{q}")
    assert status == 200
    assert body == pattern(size)
    assert "connection" not in headers or headers["connection"].lower() != "close" or mode == "close"
    if mode == "length":
        assert headers["content-length"] == str(size)


@pytest.mark.parametrize("size", [0, 1024, 300 * 1024, 4 * 1024 * 1024])
@pytest.mark.parametrize("mode", ["length", "chunked", "close"])
def test_http10_client_never_gets_chunked(lb, size, mode):
    q = "" if mode == "length" else f"?{mode}=1"
    raw = raw_exchange(port_of(lb), f"GET /size/{size}{q} HTTP/1.0\r\nHost: t\r\n\r\n".encode())
    status, headers, body = split_response(raw)
    assert status.startswith("HTTP/1.0 200"), status
    assert "transfer-encoding" not in headers
    assert body == pattern(size)
    if "content-length" in headers:
        assert int(headers["content-length"]) == size


def test_http10_keep_alive(lb):
    with socket.create_connection(("127.0.0.1", port_of(lb)), timeout=10) as s:
        f = s.makefile("rb")
        for _ in range(3):
            s.sendall(b"GET /size/1000 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            status = f.readline()
            assert status.startswith(b"HTTP/1.0 200")
            headers = {}
            while (line := f.readline()) != b"\r\n":
                k, _, v = line.decode().partition(":")
                headers[k.lower()] = v.strip()
            assert headers["connection"].lower() == "keep-alive"
            assert f.read(int(headers["content-length"])) == pattern(1000)


@pytest.mark.parametrize("size", [1024, 300 * 1024])
def test_ab_http10_no_keepalive_zero_failures(backends, proxy, size):
    assert shutil.which("ab"), "ab (apache2-utils) is installed by scripts/test"
    lb = proxy(backends(4), workers=2)
    out = subprocess.run(
        ["ab", "-n", "300", "-c", "10", f"http://127.0.0.1:{port_of(lb)}/size/{size}"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Complete requests:      300" in out.stdout
    assert "Failed requests:        0" in out.stdout, out.stdout
    assert "Non-2xx" not in out.stdout


def test_request_bodies_streamed_both_ways(lb):
    body = pattern(20 * 1024 * 1024)
    status, headers, echoed = get(port_of(lb), "/echo", method="POST", body=body)
    assert status == 200 and headers["x-received-length"] == str(len(body))
    assert echoed == body

    def chunks():
        for i in range(0, len(body), 1 << 20):
            yield body[i : i + (1 << 20)]

    c = http.client.HTTPConnection("127.0.0.1", port_of(lb), timeout=30)
    c.request("POST", "/echo", body=chunks(), encode_chunked=True)
    r = c.getresponse()
    assert r.status == 200 and r.getheader("transfer-encoding") == "chunked"
    assert r.read() == body
    c.close()


def test_chunked_request_from_http11_client_raw(lb):
    raw = raw_exchange(
        port_of(lb),
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    status, headers, body = split_response(raw)
    assert status.startswith("HTTP/1.1 200")
    # a small body is read whole before it is forwarded, then sent with a Content-Length
    # (the echo backend answers in kind); a larger one streams chunked (the test above)
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    assert body == b"hello world"


def test_headers_forwarded_and_hop_by_hop_removed(lb):
    status, _, body = get(
        port_of(lb),
        "/headers",
        headers={
            "Host": "example.org:8443",
            "Connection": "keep-alive, X-Private",
            "X-Private": "secret",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic eA==",
            "TE": "trailers",
            "X-Forwarded-For": "203.0.113.9",
            "X-Custom": "kept",
        },
    )
    assert status == 200
    got = json.loads(body)
    h = {k.lower(): v for k, v in got["headers"]}
    assert got["version"] == "HTTP/1.1"
    assert h["host"] == "example.org:8443"
    assert h["x-custom"] == "kept"
    for gone in ("x-private", "keep-alive", "proxy-authorization", "te"):
        assert gone not in h, gone
    assert h.get("connection", "keep-alive").lower() == "keep-alive"
    assert h["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert h["x-forwarded-proto"] == "http"
    assert h["forwarded"] == "for=127.0.0.1;proto=http"


def test_response_hop_by_hop_removed_and_backend_named(lb):
    raw = raw_exchange(port_of(lb), b"GET /size/10?close=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    status, headers, body = split_response(raw)
    # A close-delimited HTTP/1.0 backend answer goes to a 1.1 client chunked.
    assert status.startswith("HTTP/1.1 200")
    assert headers.get("transfer-encoding") == "chunked"
    assert dechunk(body) == pattern(10)
    assert headers["x-backend"] in ("b0", "b1")


def test_keep_alive_client_connection_reused(lb):
    c = http.client.HTTPConnection("127.0.0.1", port_of(lb), timeout=10)
    for _ in range(20):
        c.request("GET", "/size/100")
        r = c.getresponse()
        assert r.read() == pattern(100)
    c.close()
    st = lb.stats()
    assert st["connections_total"] == 1 and st["requests"] == 20


def test_head_request(lb):
    status, headers, body = get(port_of(lb), "/size/5000", method="HEAD")
    assert status == 200 and body == b""


def test_upgrade_passthrough(lb):
    with socket.create_connection(("127.0.0.1", port_of(lb)), timeout=10) as s:
        s.sendall(
            b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        status, headers, _ = split_response(head)
        assert status.startswith("HTTP/1.1 101")
        assert headers["upgrade"] == "websocket"
        for msg in (b"ping", b"x" * 100_000):
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                got += s.recv(65536)
            assert got == msg


def test_oversized_headers_get_431(backends, proxy):
    lb = proxy(backends(1), limits={"max_header_bytes": 8192})
    raw = raw_exchange(port_of(lb), b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 431")


def test_slowloris_connection_closed(backends, proxy):
    lb = proxy(backends(1), timeouts={"header": 0.5})
    with socket.create_connection(("127.0.0.1", port_of(lb)), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")
        s.settimeout(0.1)  # paces the trickle: one byte per 100 ms
        closed = False
        deadline = time.monotonic() + 20
        while not closed and time.monotonic() < deadline:
            try:
                s.sendall(b"X")
                closed = s.recv(1024) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed, "a client trickling its headers must be cut off"
    # The balancer keeps serving others.
    assert get(port_of(lb), "/size/10")[2] == pattern(10)


def test_all_backends_down_is_503_quickly(proxy):
    from tests.netutil import free_port

    lb = proxy([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], passive={"eject_after": 1, "cooldown": 60})
    status, _, _ = get(port_of(lb), "/x")
    assert status == 502  # both refused the connection
    start = time.monotonic()
    status, _, body = get(port_of(lb), "/x")
    assert status == 503 and b"no backend" in body
    assert time.monotonic() - start < 5
    assert all(b["state"] == "ejected" for b in lb.backends())


def test_admin_down_backends_answer_503(lb):
    for b in lb.backends():
        lb.set_backend_state(b["name"], "down")
    assert get(port_of(lb), "/size/1")[0] == 503
    lb.set_backend_state(lb.backends()[0]["name"], "up")
    assert get(port_of(lb), "/size/1")[0] == 200


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_large_bodies_stream_in_constant_memory(lb):
    """The proxy runs in this process: its RSS must not grow with the body."""
    size = 256 * 1024 * 1024
    c = http.client.HTTPConnection("127.0.0.1", port_of(lb), timeout=60)
    c.request("GET", f"/size/{size}")
    r = c.getresponse()
    before = _rss_kib()
    got = 0
    while chunk := r.read(1 << 20):
        got += len(chunk)
    grown = _rss_kib() - before
    c.close()
    assert got == size
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB while streaming {size} bytes"

    up = 128 * 1024 * 1024
    block = pattern(1 << 20)

    def body():
        for _ in range(up // len(block)):
            yield block

    c = http.client.HTTPConnection("127.0.0.1", port_of(lb), timeout=60)
    before = _rss_kib()
    c.request("POST", "/echo", body=body(), headers={"Content-Length": str(up)})
    r = c.getresponse()
    n = 0
    while chunk := r.read(1 << 20):
        n += len(chunk)
    grown = _rss_kib() - before
    c.close()
    assert r.getheader("x-received-length") == str(up) and n == up
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB while uploading {up} bytes"


def test_idle_keep_alive_closed_after_idle_timeout_not_header_timeout(backends, proxy):
    lb = proxy(backends(1), timeouts={"idle": 0.4, "header": 0.2})
    with socket.create_connection(("127.0.0.1", port_of(lb)), timeout=10) as s:
        f = s.makefile("rb")
        s.sendall(b"GET /size/10 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert f.readline().startswith(b"HTTP/1.1 200")
        while f.readline() != b"\r\n":
            pass
        assert f.read(10) == pattern(10)
        # Waiting for the next request is idleness, not a slow head: the
        # connection outlives the header timeout, then the idle one closes it.
        start = time.monotonic()
        assert s.recv(1) == b""
        assert time.monotonic() - start >= 0.2
        f.close()
