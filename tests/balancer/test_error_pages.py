"""Error pages ([error_pages], HAProxy's errorfile): the balancer's own
answers (503 without a backend, 502, 429, 400) carry the configured page on
both request paths, HAProxy's raw .http files are taken as they are, the
pages follow a reload, and bad tables are refused with the file and line.
Real balancers and sockets; the backend is a closed port."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest
from balancer_helpers import split_response

from balancer import BalancerConfigError, LoadBalancer, load
from tests.netutil import free_port

pytestmark = pytest.mark.timeout(60)

#: what Debian's /etc/haproxy/errors/503.http holds, in shape
HAPROXY_503 = (b"HTTP/1.0 503 Service Unavailable\r\nCache-Control: no-cache\r\nConnection: close\r\n"
               b"Content-Type: text/html\r\n\r\n<html><body><h1>503 Service Unavailable</h1>\n"
               b"No server is available to handle this request.\n</body></html>\n")


def exchange(port: int, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """One request on a new connection; the response read whole (by its length)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
        if not raw.startswith(b"HEAD"):
            while len(body) < length:
                chunk = s.recv(65536)
                assert chunk, data
                body += chunk
    return split_response(head + b"\r\n\r\n" + body)


def write_config(path: Path, pages: dict[int, Path], extra: str = "") -> Path:
    table = "".join(f'{status} = "{file}"\n' for status, file in pages.items())
    path.write_text(f'listen = "127.0.0.1:0"\nworkers = 1\nretries = 0\nbackends = ["127.0.0.1:{free_port()}"]\n'
                    f"{extra}[error_pages]\n{table}")
    return path


def test_own_answers_carry_the_pages_on_both_paths(tmp_path: Path) -> None:
    (tmp_path / "503.http").write_bytes(HAPROXY_503)
    (tmp_path / "429.json").write_text('{"error": "slow down"}\n')
    (tmp_path / "400.html").write_text("<p>bad request</p>\n")
    cfg = write_config(tmp_path / "b.toml", {503: tmp_path / "503.http", 429: tmp_path / "429.json",
                                             400: tmp_path / "400.html"},
                       '[rate_limit]\nrate = "1/m"\nkey = "header:X-Client"\nmissing = "allow"\n')

    async def run() -> None:
        async with LoadBalancer(load(cfg), config_path=cfg) as lb:
            port = lb.address[1]
            (server,) = [b["name"] for b in lb.backends()]
            lb.set_backend_state(server, "down")  # no backend available: 503
            fast = b"GET /x HTTP/1.1\r\nHost: t\r\nX-Request-ID: r1\r\n\r\n"
            # chunked: hyper's path
            hyper = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"
            for raw in (fast, hyper):
                status, headers, body = await asyncio.to_thread(exchange, port, raw)
                assert status.startswith("HTTP/1.1 503"), status
                assert body == HAPROXY_503.partition(b"\r\n\r\n")[2]
                assert headers["content-type"] == "text/html" and headers["cache-control"] == "no-cache"
                assert headers["content-length"] == str(len(body))
                assert headers.get("connection") != "close" or raw is hyper  # the file's Connection is not taken
            # rate limited (the first request of a client passes): the page, Retry-After kept
            limited = b"GET /x HTTP/1.1\r\nHost: t\r\nX-Client: c1\r\n\r\n"
            assert (await asyncio.to_thread(exchange, port, limited))[0].startswith("HTTP/1.1 503")
            status, headers, body = await asyncio.to_thread(exchange, port, limited)
            assert status.startswith("HTTP/1.1 429") and "retry-after" in headers, (status, headers)
            assert body == b'{"error": "slow down"}\n'
            assert headers["content-type"] == "application/json; charset=utf-8"
            # HEAD: the page's length, no body
            status, headers, body = await asyncio.to_thread(
                exchange, port, b"HEAD /x HTTP/1.1\r\nHost: t\r\nX-Client: c1\r\n\r\n")
            assert status.startswith("HTTP/1.1 429") and body == b""
            assert headers["content-length"] == str(len(b'{"error": "slow down"}\n'))
            # requests refused by the fast path's framing rules, and by hyper's path (two Host lines)
            for bad in (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"):
                status, headers, body = await asyncio.to_thread(exchange, port, bad)
                assert status.startswith("HTTP/1.1 400") and body == b"<p>bad request</p>\n", (status, body)
                assert headers["content-type"] == "text/html; charset=utf-8"

    asyncio.run(run())


def test_a_reload_reads_the_pages_again(tmp_path: Path) -> None:
    """The backend is a closed port: 502, with the page of the moment."""
    page = tmp_path / "502.html"
    page.write_text("<p>down for maintenance</p>\n")
    cfg = write_config(tmp_path / "b.toml", {502: page})

    async def run() -> None:
        async with LoadBalancer(load(cfg), config_path=cfg) as lb:
            port = lb.address[1]
            raw = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
            assert (await asyncio.to_thread(exchange, port, raw))[2] == b"<p>down for maintenance</p>\n"
            page.write_text("<p>back soon</p>\n")
            await lb.reload()
            assert (await asyncio.to_thread(exchange, port, raw))[2] == b"<p>back soon</p>\n"
            write_config(cfg, {})  # no pages: the one-line text again
            await lb.reload()
            status, headers, body = await asyncio.to_thread(exchange, port, raw)
            assert status.startswith("HTTP/1.1 502") and headers["content-type"] == "text/plain", headers
            assert body.endswith(b"\n") and b"<p>" not in body

    asyncio.run(run())


@pytest.mark.parametrize(("pages", "message"), [
    ({"999": "x.html"}, "error_pages.999: the key must be one of the statuses"),
    ({"503": "missing.http"}, "error_pages.503: cannot read"),
    ({"503": "502.http"}, "the file answers 502, not 503"),
    ({"503": "big.html"}, "is over 64 KiB"),
    ({"503": "broken.http"}, "not a valid HTTP response"),
])
def test_bad_pages_are_refused_with_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  pages: dict[str, str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "502.http").write_bytes(HAPROXY_503.replace(b"503 Service", b"502 Bad"))
    (tmp_path / "big.html").write_bytes(b"x" * (65 * 1024))
    (tmp_path / "broken.http").write_bytes(b"HTTP/1.1 5O3 Nope\r\n\r\n")
    cfg = tmp_path / "b.toml"
    cfg.write_text('listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:1"]\n\n[error_pages]\n'
                   + "".join(f'{k} = "{v}"\n' for k, v in pages.items()))
    with pytest.raises(BalancerConfigError, match=re.escape(message)) as e:
        load(cfg)
    assert str(e.value).startswith(f"{cfg}:5: "), str(e.value)


def test_the_cli_serves_the_pages_and_the_admin_endpoint_shows_them(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys
    import urllib.request

    from tests.netutil import wait_for_port

    (tmp_path / "502.http").write_bytes(HAPROXY_503.replace(b"503 Service Unavailable", b"502 Bad Gateway"))
    port, admin = free_port(), free_port()
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'listen = "127.0.0.1:{port}"\nadmin = "127.0.0.1:{admin}"\nworkers = 1\nretries = 0\n'
                   f'backends = ["127.0.0.1:{free_port()}"]\n'
                   f'[[routes]]\npath = "/robots.txt"\nrespond = {{ file = "{tmp_path / "502.http"}" }}\n'
                   f'[[routes]]\nbackend = "default"\n'
                   f'[error_pages]\n502 = "{tmp_path / "502.http"}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", str(cfg)],
                            cwd=Path(__file__).resolve().parents[2], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(admin, 20, proc)
        wait_for_port(port, 20, proc)
        status, headers, body = exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status.startswith("HTTP/1.1 502") and b"<h1>502 Bad Gateway" in body and headers["content-type"] == "text/html"
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/config", timeout=10) as r:
            config = json.loads(r.read())
        pages = config["error_pages"]
        size = (tmp_path / "502.http").stat().st_size
        assert config["routes"][0]["respond"]["file_bytes"] == f"{size} bytes"
        assert pages == {"502": {"headers": [["Cache-Control", "no-cache"], ["Content-Type", "text/html"]],
                                 "bytes": len(body)}}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_routes_answer_themselves(tmp_path: Path) -> None:
    """respond on a route (HAProxy's http-request return / deny, nginx's return): a fixed 200 with
    a body, a 403 without one taking the [error_pages] 403 page, a body from a file; on both
    paths; other requests still go to the backend (here a closed port: 502)."""
    (tmp_path / "403.html").write_text("<p>forbidden here</p>\n")
    (tmp_path / "robots.txt").write_text("User-agent: *\nDisallow: /\n")
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'listen = "127.0.0.1:0"\nworkers = 1\nretries = 0\nbackends = ["127.0.0.1:{free_port()}"]\n'
                   '[[routes]]\npath = "/healthz"\nrespond = { status = 200, body = "ok\\n" }\n'
                   '[[routes]]\npath_prefix = "/admin"\nrespond = { status = 403 }\n'
                   f'[[routes]]\npath = "/robots.txt"\nrespond = {{ file = "{tmp_path / "robots.txt"}" }}\n'
                   '[[routes]]\npath = "/teapot"\nrespond = { status = 418, body = "{}", content_type = "application/json" }\n'
                   f'[error_pages]\n403 = "{tmp_path / "403.html"}"\n')

    def get(port: int, path: str, hyper: bool = False) -> tuple[str, dict[str, str], bytes]:
        if hyper:  # a chunked body: hyper's path
            return exchange(port, f"POST {path} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  "0\r\n\r\n".encode())
        return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())

    async def run() -> None:
        async with LoadBalancer(load(cfg), config_path=cfg) as lb:
            port = lb.address[1]
            for hyper in (False, True):
                status, headers, body = await asyncio.to_thread(get, port, "/healthz", hyper)
                assert (status[9:12], body, headers["content-type"]) == ("200", b"ok\n", "text/plain; charset=utf-8")
                status, headers, body = await asyncio.to_thread(get, port, "/admin/users", hyper)
                assert (status[9:12], body) == ("403", b"<p>forbidden here</p>\n")
                assert headers["content-type"] == "text/html; charset=utf-8"
                status, headers, body = await asyncio.to_thread(get, port, "/robots.txt", hyper)
                assert (status[9:12], body) == ("200", b"User-agent: *\nDisallow: /\n")
                status, headers, body = await asyncio.to_thread(get, port, "/teapot", hyper)
                assert (status[9:12], body, headers["content-type"]) == ("418", b"{}", "application/json")
                assert (await asyncio.to_thread(get, port, "/other", hyper))[0][9:12] == "502"
            assert lb.stats()["requests"] == 10

    asyncio.run(run())
