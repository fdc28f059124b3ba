"""The PROXY protocol, in (``accept_proxy``) and out (``send_proxy``),
against the real HAProxy on both sides, and hostile headers on raw sockets.

Clients bind 127.0.0.2 / 127.0.0.3 so that the address a backend learns
differs from the balancer's own (127.0.0.1)."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from balancer_helpers import split_response
from test_access_log import wait_lines

from balancer.config import from_dict
from balancer.errors import BalancerConfigError
from tests.netutil import free_port, wait_for_port

pytestmark = [pytest.mark.timeout(60)]

V2_SIG = b"\r\n\r\n\0\r\nQUIT\n"


def v2(src: str, sport: int, dst: str = "127.0.0.1", dport: int = 80, cmd: int = 0x21, tlvs: bytes = b"") -> bytes:
    body = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", sport, dport) + tlvs
    return V2_SIG + bytes([cmd, 0x11]) + struct.pack("!H", len(body)) + body


def request(port: int, raw: bytes, source: str = "127.0.0.1", path: str = "/headers",
            extra: bytes = b"") -> tuple[str, dict[str, str], bytes]:
    """One request on a new connection from ``source``, ``raw`` sent first."""
    with socket.socket() as s:
        s.settimeout(10)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(raw + b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + b"\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return split_response(data)


def seen(body: bytes) -> dict[str, list[str]]:
    """The headers the backend got, by lower-case name."""
    out: dict[str, list[str]] = {}
    for k, v in json.loads(body)["headers"]:
        out.setdefault(k.lower(), []).append(v)
    return out


def closed_unanswered(port: int, raw: bytes, timeout: float = 5.0) -> bool:
    """Send ``raw``; True if the server closes without a byte of answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(raw)
            return s.recv(1024) == b""
        except ConnectionResetError:
            return True


def accepting(proxy: Any, bks: list[Any], **listener: object) -> Any:
    return proxy([], listeners=[{"address": "127.0.0.1:0", "accept_proxy": True, "default_backend": "p", **listener}],
                 backends={"p": {"servers": [b.address for b in bks]}}, workers=1, timeouts={"header": 0.5})


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Any]:
    """``haproxy(config_body)`` starts HAProxy with the defaults below; waits for ``port``."""
    if shutil.which("haproxy") is None:
        pytest.skip("HAProxy is not installed: the comparison cannot run")
    procs: list[subprocess.Popen[bytes]] = []

    def start(body: str, port: int) -> None:
        cfg = tmp_path / f"haproxy{len(procs)}.cfg"
        cfg.write_text("global\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 3s\n  timeout client 5s\n"
                       "  timeout server 5s\n" + body)
        p = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        wait_for_port(port, proc=p)

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_haproxy_send_proxy_v1_and_v2_reach_us_with_the_client_address(haproxy, proxy, backends) -> None:
    lb = accepting(proxy, backends(1))
    ours = lb.address[1]
    h1, h2 = free_port(), free_port()
    haproxy(f"frontend f1\n  bind 127.0.0.1:{h1}\n  default_backend v1\n"
            f"frontend f2\n  bind 127.0.0.1:{h2}\n  default_backend v2\n"
            f"backend v1\n  server s 127.0.0.1:{ours} send-proxy\n"
            f"backend v2\n  server s 127.0.0.1:{ours} send-proxy-v2\n", h2)
    for port in (h1, h2):
        for source in ("127.0.0.2", "127.0.0.3"):
            status, _, body = request(port, b"", source)
            assert status.endswith("200 OK"), status
            h = seen(body)
            assert h["x-forwarded-for"] == [source]
            assert h["forwarded"] == [f"for={source};proto=http"]
    # HAProxy's health checks of a send-proxy server carry a LOCAL header (v2)
    # or their own address (v1): served as from the real peer, nothing refused
    assert lb.stats()["proxy_refused"] == 0


def test_our_send_proxy_v1_and_v2_reach_haproxy_with_the_client_address(haproxy, proxy, backends) -> None:
    (b,) = backends(1)
    hport = free_port()
    haproxy(f"frontend f\n  bind 127.0.0.1:{hport} accept-proxy\n  http-request set-header X-Seen-Src %[src]\n"
            f"  http-request set-header X-Seen-Dst %[dst]:%[dst_port]\n  default_backend b\n"
            f"backend b\n  server s {b.address}\n", hport)
    for version in ("v1", "v2"):
        lb = proxy([f"127.0.0.1:{hport}"], send_proxy=version)
        port = lb.address[1]
        # the fast path, then hyper's (an Upgrade header takes that one), each
        # from two client addresses: a connection opened for one client is
        # never used for the other
        for extra in (b"", b"Upgrade: foo\r\n"):
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.2"):
                status, _, body = request(port, b"", source, extra=extra)
                assert status.endswith("200 OK"), (version, status)
                h = seen(body)
                assert h["x-seen-src"] == [source], (version, extra)
                assert h["x-seen-dst"] == [f"127.0.0.1:{port}"]


@pytest.mark.parametrize("extra", [b"", b"Upgrade: foo\r\n"], ids=["fast path", "hyper path"])
def test_keep_alive_client_requests_are_not_sent_on_another_clients_connection(proxy, extra: bytes) -> None:
    """A raw backend records the PROXY header of each connection it gets and
    the client each request came from (its X-Forwarded-For). As HAProxy does,
    each client keeps its own backend connection for its next requests."""
    import itertools
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    log: list[tuple[int, str, str]] = []
    ids = itertools.count()

    def serve(c: socket.socket) -> None:
        conn_id = next(ids)
        with c:
            buf = b""
            header = ""
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                if buf.startswith(b"PROXY "):
                    line, _, buf = buf.partition(b"\r\n")
                    header = line.split()[2].decode()
                head, _, buf = buf.partition(b"\r\n\r\n")
                xff = next(x.split(b":", 1)[1].strip().decode() for x in head.split(b"\r\n")
                           if x.lower().startswith(b"x-forwarded-for:"))
                log.append((conn_id, header, xff))
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        lb = proxy([f"127.0.0.1:{srv.getsockname()[1]}"], send_proxy="v1", workers=1)
        clients = []
        for source in ("127.0.0.2", "127.0.0.3"):
            s = socket.socket()
            s.settimeout(10)
            s.bind((source, 0))
            s.connect(("127.0.0.1", lb.address[1]))
            clients.append(s)
        for _ in range(3):  # interleaved keep-alive requests of two clients
            for s in clients:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
                assert s.recv(65536).endswith(b"ok")
        for s in clients:
            s.close()
        assert len(log) == 6
        assert all(header == xff for _, header, xff in log), log
        # one backend connection per client, reused for each of its requests, never the other's
        by_conn = {conn_id: {xff for c, _, xff in log if c == conn_id} for conn_id, _, _ in log}
        assert len(by_conn) == 2 and all(len(v) == 1 for v in by_conn.values()), log
    finally:
        srv.close()


HOSTILE = {
    "no header": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "TLS instead": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 40,
    "v1 without CRLF in 107 bytes": b"PROXY TCP4 " + b"1" * 120,
    "v1 LF only": b"PROXY TCP4 127.0.0.9 127.0.0.1 1 2\n",
    "v1 bad family": b"PROXY UDP4 127.0.0.9 127.0.0.1 1 2\r\n",
    "v1 IPv6 as TCP4": b"PROXY TCP4 ::1 ::1 1 2\r\n",
    "v1 port out of range": b"PROXY TCP4 127.0.0.9 127.0.0.1 70000 2\r\n",
    "v1 missing port": b"PROXY TCP4 127.0.0.9 127.0.0.1 1\r\n",
    "v2 version 3": V2_SIG + b"\x31\x11\x00\x0c" + b"\0" * 12,
    "v2 unknown command": V2_SIG + b"\x2f\x11\x00\x0c" + b"\0" * 12,
    "v2 IPv4 length short": V2_SIG + b"\x21\x11\x00\x08" + b"\0" * 8,
    "v2 IPv6 length short": V2_SIG + b"\x21\x21\x00\x0c" + b"\0" * 12,
    "v2 oversized length": V2_SIG + b"\x21\x11\xff\xff" + b"\0" * 100,
    "v2 TLV overrun": v2("127.0.0.9", 1, tlvs=b"\xe0\x00\x20abc"),
    "v1 then silence": b"PROXY TCP4 127.0.0.9",
    "v2 then silence": V2_SIG + b"\x21\x11\x00\x0c\x7f",
}


def test_hostile_headers_are_closed_unanswered_and_others_served(proxy, backends) -> None:
    lb = accepting(proxy, backends(1))
    port = lb.address[1]
    for name, raw in HOSTILE.items():
        # the silent ones are closed by the header timeout (0.5 s), well within the client's 5 s
        assert closed_unanswered(port, raw), name
    # counted as the worker lets the socket go: the client may see the close first
    deadline = time.monotonic() + 5
    while lb.stats()["proxy_refused"] < len(HOSTILE) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lb.stats()["proxy_refused"] == len(HOSTILE)
    # the worker keeps serving: a valid header with unknown TLVs, and a LOCAL one
    status, _, body = request(port, v2("192.0.2.9", 4000, tlvs=b"\xe0\x00\x03abc\x04\x00\x00"))
    assert status.endswith("200 OK") and seen(body)["x-forwarded-for"] == ["192.0.2.9"]
    status, _, body = request(port, v2("192.0.2.9", 4000, cmd=0x20), source="127.0.0.2")
    assert status.endswith("200 OK") and seen(body)["x-forwarded-for"] == ["127.0.0.2"]
    status, _, body = request(port, b"PROXY UNKNOWN\r\n", source="127.0.0.3")
    assert status.endswith("200 OK") and seen(body)["x-forwarded-for"] == ["127.0.0.3"]
    status, _, body = request(port, b"PROXY TCP6 2001:db8::7 ::1 5 80\r\n")
    assert status.endswith("200 OK") and seen(body)["x-forwarded-for"] == ["2001:db8::7"]


def test_a_header_split_over_segments_is_waited_for(proxy, backends) -> None:
    lb = accepting(proxy, backends(1))
    with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for part in (b"PROXY TCP4 ", b"192.0.2.5 127.0.0.1 ", b"1234 80\r", b"\nGET /headers HTTP/1.1\r\n",
                     b"Host: x\r\nConnection: close\r\n\r\n"):
            s.sendall(part)
            time.sleep(0.02)  # separate segments, well within the header timeout
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _, body = split_response(data)
    assert status.endswith("200 OK") and seen(body)["x-forwarded-for"] == ["192.0.2.5"]


def test_on_tls_listeners_the_header_comes_before_the_client_hello(proxy, backends, pki) -> None:
    leaf = pki.leaf("localhost", "127.0.0.1")
    (b,) = backends(1)
    lb = proxy([], listeners=[{"address": "127.0.0.1:0", "tls": True, "accept_proxy": True, "default_backend": "p"}],
               backends={"p": {"servers": [b.address]}}, workers=1,
               tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]})
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=10) as raw:
        raw.sendall(b"PROXY TCP4 198.51.100.4 127.0.0.1 999 443\r\n")
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    status, _, body = split_response(data)
    assert status.endswith("200 OK")
    h = seen(body)
    assert h["x-forwarded-for"] == ["198.51.100.4"] and h["x-forwarded-proto"] == ["https"]


def test_config_fields_are_checked() -> None:
    cfg = from_dict({"listen": "127.0.0.1:0", "accept_proxy": True, "send_proxy": "v2",
                     "backends": [{"address": "127.0.0.1:1", "send_proxy": "none"}, "127.0.0.1:2"]})
    (pool,) = cfg.backend_pools()  # as the data plane reads them
    assert cfg.effective_listeners()[0].accept_proxy is True
    assert pool.config.send_proxy == "v2"
    assert [b.send_proxy for b in pool.config.backends] == ["none", None]
    for bad in ({"send_proxy": "v3"}, {"accept_proxy": "yes"},
                {"backends": [{"address": "127.0.0.1:1", "send_proxy": True}]}):
        with pytest.raises(BalancerConfigError, match="send_proxy|accept_proxy"):
            from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], **bad})


async def states_after_checks(lb: Any, witness: str) -> dict[str, str]:
    """Each pool's state once the pool ``witness`` (whose server fails its
    checks) is down, and some more checks (interval 0.05 s) have run."""
    import asyncio

    async def witness_down() -> None:
        while {x["pool"]: x["state"] for x in lb.backends()}[witness] != "down":
            await asyncio.sleep(0.02)

    await asyncio.wait_for(witness_down(), 10)
    await asyncio.sleep(0.3)  # several more checks of each pool
    return {x["pool"]: x["state"] for x in lb.backends()}


async def test_health_checks_of_send_proxy_servers_start_with_a_header(haproxy, backends) -> None:
    """HAProxy (accept-proxy) in front of a backend: checks from pools with
    send_proxy pass it; the same server checked without a header is down."""

    from balancer import LoadBalancer

    (b,) = backends(1)
    hport = free_port()
    haproxy(f"frontend f\n  bind 127.0.0.1:{hport} accept-proxy\n  default_backend b\n"
            f"backend b\n  server s {b.address}\n", hport)
    addr = f"127.0.0.1:{hport}"
    cfg = from_dict({
        "listen": "127.0.0.1:0", "workers": 1, "default_backend": "v1",
        "health": {"path": "/health", "interval": 0.05, "timeout": 1.0, "rise": 1, "fall": 2},
        "backends": {"v1": {"servers": [addr], "send_proxy": "v1"}, "v2": {"servers": [addr], "send_proxy": "v2"},
                     "plain": {"servers": [addr]}}})
    async with LoadBalancer(cfg) as lb:
        assert await states_after_checks(lb, "plain") == {"v1": "up", "v2": "up", "plain": "down"}


def test_the_access_log_shows_the_client_of_the_header(proxy, backends, tmp_path: Path) -> None:
    (b,) = backends(1)
    log = tmp_path / "access.log"
    lb = proxy([], listeners=[{"address": "127.0.0.1:0", "accept_proxy": True, "default_backend": "p"}],
               backends={"p": {"servers": [b.address]}}, workers=1,
               access_log={"path": str(log), "format": "%ci|%cp|%ft"})
    for path in ("/headers", "/whoami"):
        request(lb.address[1], b"PROXY TCP4 192.0.2.44 127.0.0.1 4444 80\r\n", path=path)
    lines = wait_lines(log, 2)  # the log is written by its own thread
    assert lines == [f"192.0.2.44|4444|127.0.0.1:{lb.address[1]}"] * 2


@pytest.mark.parametrize("server", ["send_proxy", "unix"])
async def test_health_checks_over_tls_of_send_proxy_and_unix_servers(haproxy, backends, pki, tmp_path: Path,
                                                                     server: str) -> None:
    """With TLS to backends, checks of a server behind send_proxy (header,
    then handshake) and of one on a Unix socket go over TLS as its requests
    do: HAProxy terminating TLS there keeps them up. A closed port in
    another pool going down shows the checks ran."""
    import asyncio

    from balancer import LoadBalancer

    (b,) = backends(1)
    leaf = pki.leaf("localhost", "127.0.0.1")
    pem = tmp_path / "haproxy.pem"
    pem.write_bytes(Path(leaf.cert).read_bytes() + Path(leaf.key).read_bytes())
    hport = free_port()
    sock = tmp_path / "tls.sock"
    if server == "send_proxy":
        binds, addr = f"  bind 127.0.0.1:{hport} accept-proxy ssl crt {pem}\n", f"127.0.0.1:{hport}"
    else:
        binds, addr = f"  bind 127.0.0.1:{hport}\n  bind unix@{sock} ssl crt {pem}\n", f"unix:{sock}"
    haproxy(f"frontend f\n{binds}  default_backend b\nbackend b\n  server s {b.address}\n", hport)
    pool: dict[str, Any] = {"servers": [addr], **({"send_proxy": "v2"} if server == "send_proxy" else {})}
    cfg = from_dict({
        "listen": "127.0.0.1:0", "workers": 1, "default_backend": "tls",
        "tls": {"backend": True, "backend_ca": str(pki.ca)},
        "health": {"path": "/health", "interval": 0.05, "timeout": 1.0, "rise": 1, "fall": 2},
        "backends": {"tls": pool, "closed": {"servers": [f"127.0.0.1:{free_port()}"]}}})
    async with LoadBalancer(cfg) as lb:
        assert await states_after_checks(lb, "closed") == {"tls": "up", "closed": "down"}
        status, _, body = await asyncio.to_thread(request, lb.addresses[0][1], b"", path="/whoami")
        assert status.startswith("HTTP/1.1 200") and b"b0" in body, (status, body)
