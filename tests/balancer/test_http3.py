"""HTTP/3 on the balancer's TLS listeners: aioquic's HTTP/3 client against a
real rustext.Balancer and real backend processes, certificates from the test CA.

GET and POST with a body; routes, header rules and the balancer's own
answers as over HTTP/2 (curl); the access log's protocol; ``Alt-Svc`` on
HTTP/1.1 and HTTP/2 responses; ``http3 = false``; garbage datagrams (random
bytes, truncated and corrupted Initial packets) after which the listener
still serves; the endpoint closed with the balancer.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import QuicEvent

from tests.netutil import wait_until
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(60)]

Response = tuple[int, dict[str, str], bytes]


class H3Client(QuicConnectionProtocol):
    """A minimal HTTP/3 client: one request per stream, answers gathered whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http = H3Connection(self._quic)
        self._pending: dict[int, tuple[asyncio.Future[Response], list[tuple[bytes, bytes]], bytearray]] = {}

    def quic_event_received(self, event: QuicEvent) -> None:
        for ev in self._http.handle_event(event):
            self._h3_event(ev)

    def _h3_event(self, ev: H3Event) -> None:
        if not isinstance(ev, (HeadersReceived, DataReceived)) or ev.stream_id not in self._pending:
            return
        fut, headers, body = self._pending[ev.stream_id]
        if isinstance(ev, HeadersReceived):
            headers.extend(ev.headers)
        else:
            body.extend(ev.data)
        if ev.stream_ended and not fut.done():
            fields = {k.decode().lower(): v.decode() for k, v in headers}
            fut.set_result((int(fields.pop(":status")), fields, bytes(body)))

    async def request(self, method: str, path: str, authority: str, headers: dict[str, str] | None = None,
                      body: bytes = b"") -> Response:
        sid = self._quic.get_next_available_stream_id()
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[sid] = (fut, [], bytearray())
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", authority.encode()),
                  (b":path", path.encode())]
        fields += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self._http.send_headers(sid, fields, end_stream=not body)
        if body:
            self._http.send_data(sid, body, end_stream=True)
        self.transmit()
        return await asyncio.wait_for(fut, 10)


def h3_config(ca: Path) -> QuicConfiguration:
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost", idle_timeout=5.0)
    cfg.load_verify_locations(str(ca))
    return cfg


async def h3(port: int, ca: Path, *requests: tuple[Any, ...]) -> list[Response]:
    """Each of ``requests`` ((method, path, authority[, headers[, body]])) on one HTTP/3 connection."""
    async with connect("127.0.0.1", port, configuration=h3_config(ca), create_protocol=H3Client,
                       wait_connected=True) as client:
        assert isinstance(client, H3Client)
        return [await client.request(*r) for r in requests]


def curl(*args: str) -> tuple[int, dict[str, str], bytes]:
    """An HTTP/1.1 or HTTP/2 exchange through curl: status, headers, body."""
    exe = shutil.which("curl")
    assert exe is not None, "curl (the HTTP/2 client of these tests) is not installed"
    out = subprocess.run([exe, "-s", "-i", *args], capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    head, _, body = out.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.fixture
def tls_table(pki: TestPKI) -> dict[str, Any]:
    leaf = pki.leaf("localhost", "127.0.0.1")
    return {"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]}


async def test_get_and_post(proxy: Any, backends: Any, pki: TestPKI, tls_table: dict[str, Any],
                            tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    lb = proxy(backends(1), tls=tls_table, workers=2,
               access_log={"path": str(log), "format": "%HM %HP %HV %ST"})
    port = lb.address[1]
    payload = os.urandom(150_000)  # past the read-ahead: streamed to the backend
    (s1, h1, b1), (s2, h2, b2), (s3, _, b3) = await h3(
        port, pki.ca, ("GET", "/headers", f"localhost:{port}"), ("POST", "/echo", f"localhost:{port}", {}, payload),
        ("POST", "/echo", f"localhost:{port}", {}, b"small"))
    assert s1 == 200
    seen = {k.lower(): v for k, v in json.loads(b1)["headers"]}
    assert seen["host"] == f"localhost:{port}"  # from :authority
    assert seen["x-forwarded-proto"] == "https"
    assert "proto=https" in seen["forwarded"]
    assert h1["alt-svc"] == f'h3=":{port}"; ma=86400'
    assert s2 == 200 and b2 == payload and h2["x-received-length"] == str(len(payload))
    assert s3 == 200 and b3 == b"small"
    lines = await wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 3 and log.read_text())
    assert sorted(lines.splitlines()) == ["GET /headers HTTP/3.0 200", "POST /echo HTTP/3.0 200",
                                          "POST /echo HTTP/3.0 200"]


ROUTES = [
    {"host": "a.example", "backend": "a"},
    {"path_prefix": "/r/b/", "backend": "b",
     "response_headers": {"set": {"X-Route": "b"}, "delete": ["X-Internal"]}},
]


async def test_routes_rules_and_own_answers_as_over_http2(proxy: Any, backends: Any, pki: TestPKI,
                                                         tls_table: dict[str, Any]) -> None:
    a, b = backends(2)
    lb = proxy([], tls=tls_table, workers=1, routes=ROUTES, request_headers={"set": {"X-Via": "lb"}},
               backends={"a": {"servers": [a.address]}, "b": {"servers": [b.address]}})
    port = lb.address[1]
    cases = [("a.example", "/r/x"), ("other.example", "/r/b/1"), ("other.example", "/r/none")]
    over_h3 = await h3(port, pki.ca, *[("GET", path, f"{host}:{port}") for host, path in cases])
    for (host, path), (status, headers, body) in zip(cases, over_h3):
        s2, h2, b2 = curl("--http2", "--cacert", str(pki.ca), "--connect-to", f"{host}:{port}:localhost:{port}",
                          "-k", f"https://{host}:{port}{path}")
        assert status == s2, (host, path)
        assert headers.get("x-route") == h2.get("x-route")
        assert headers.get("x-internal") == h2.get("x-internal")
        if status == 200:
            assert json.loads(body)["name"] == json.loads(b2)["name"]
            assert {k.lower(): v for k, v in json.loads(body)["headers"]}["x-via"] == "lb"
    assert json.loads(over_h3[0][2])["name"] == "b0"
    assert over_h3[0][1]["x-internal"] == "secret"
    assert over_h3[1][1]["x-route"] == "b" and "x-internal" not in over_h3[1][1]
    assert json.loads(over_h3[1][2])["name"] == "b1"
    # no route takes it and there is no default pool: the balancer's own answer
    assert over_h3[2][0] == 503 and over_h3[2][2] == curl(
        "--http2", "--cacert", str(pki.ca), f"https://localhost:{port}/r/none")[2]
    # a backend's 404 passes through
    (status, _, _), = await h3(port, pki.ca, ("GET", "/nothing-here", f"a.example:{port}"))
    assert status == 404


async def test_alt_svc_over_http1_and_http2_and_http3_off(proxy: Any, backends: Any, pki: TestPKI,
                                                          tls_table: dict[str, Any]) -> None:
    bks = backends(1)
    lb = proxy(bks, tls=tls_table, workers=1)
    port = lb.address[1]
    for version in ("--http1.1", "--http2"):
        status, headers, _ = curl(version, "--cacert", str(pki.ca), f"https://localhost:{port}/whoami")
        assert status == 200 and headers["alt-svc"] == f'h3=":{port}"; ma=86400'
    off = proxy(bks, tls=tls_table, workers=1, http3=False)
    oport = off.address[1]
    status, headers, _ = curl("--http2", "--cacert", str(pki.ca), f"https://localhost:{oport}/whoami")
    assert status == 200 and "alt-svc" not in headers
    with pytest.raises((ConnectionError, asyncio.TimeoutError, OSError)):
        await asyncio.wait_for(h3(oport, pki.ca, ("GET", "/whoami", f"localhost:{oport}")), 3)
    # plain HTTP listeners advertise nothing
    plain = proxy(bks, workers=1)
    status, headers, _ = curl(f"http://127.0.0.1:{plain.address[1]}/whoami")
    assert status == 200 and "alt-svc" not in headers


def initial_packet() -> bytes:
    """A client's first datagram (an Initial packet with its ClientHello)."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    conn = QuicConnection(configuration=cfg)
    conn.connect(("127.0.0.1", 443), now=0.0)
    return conn.datagrams_to_send(now=0.0)[0][0]


async def test_garbage_datagrams_leave_it_serving(proxy: Any, backends: Any, pki: TestPKI,
                                                  tls_table: dict[str, Any]) -> None:
    lb = proxy(backends(1), tls=tls_table, workers=1)
    port = lb.address[1]
    rng = __import__("random").Random(7)
    initial = initial_packet()
    bad = [os.urandom(n) for n in (0, 1, 5, 20, 1200, 1500)]
    bad += [initial[:n] for n in (1, 6, 30, 100, 600, len(initial) - 1)]
    for _ in range(200):
        pkt = bytearray(initial)
        for _ in range(rng.randint(1, 8)):
            pkt[rng.randrange(len(pkt))] = rng.randrange(256)
        bad.append(bytes(pkt))
    # long headers with random version and connection ids
    bad += [bytes([0xC0 | rng.randrange(64)]) + os.urandom(rng.randint(4, 1300)) for _ in range(200)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for pkt in bad:
            s.sendto(pkt, ("127.0.0.1", port))
    (status, _, body), = await h3(port, pki.ca, ("GET", "/whoami", f"localhost:{port}"))
    assert status == 200 and body == b"b0"
    # and HTTPS over TCP still answers
    status, _, _ = curl("--http2", "--cacert", str(pki.ca), f"https://localhost:{port}/whoami")
    assert status == 200


async def test_the_endpoint_closes_with_the_balancer(backends: Any, pki: TestPKI,
                                                     tls_table: dict[str, Any]) -> None:
    import rustext
    from balancer_helpers import lb_config
    lb = rustext.Balancer(lb_config(backends(1), tls=tls_table, workers=1))
    lb.start()
    port = lb.address[1]
    async with connect("127.0.0.1", port, configuration=h3_config(pki.ca), create_protocol=H3Client) as client:
        assert isinstance(client, H3Client)
        status, _, _ = await client.request("GET", "/whoami", f"localhost:{port}")
        assert status == 200
        # the drain closes the open connection (GOAWAY, then the QUIC close), not its idle timeout
        await asyncio.get_running_loop().run_in_executor(None, lb.close)
        await asyncio.wait_for(client.wait_closed(), 10)
    with pytest.raises((ConnectionError, asyncio.TimeoutError, OSError)):
        await asyncio.wait_for(h3(port, pki.ca, ("GET", "/whoami", f"localhost:{port}")), 3)
    # the port is free again
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))


def test_http3_is_a_boolean() -> None:
    import rustext
    from balancer.config import from_dict
    with pytest.raises(rustext.BalancerConfigError, match="http3"):
        from_dict({"listeners": [{"address": "127.0.0.1:0", "http3": "yes"}], "backends": []})
