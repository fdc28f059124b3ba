"""Backends on Unix sockets (``unix:/path``, HAProxy's ``unix@/path``): both
HTTP paths and the health checks, with real backend processes."""

from __future__ import annotations

import asyncio
import os
import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from balancer_helpers import split_response, start_unix_backend

import rustext
from balancer import LoadBalancer
from balancer.config import from_dict
from balancer.errors import BalancerConfigError

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory: socket paths are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="lb-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def unix_backend(sockdir: Path) -> Iterator[str]:
    path = sockdir / "b0.sock"
    proc = start_unix_backend("b0", str(path))
    yield str(path)
    proc.kill()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def get(port: int, path: str, extra: bytes = b"", body: bytes = b"") -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        method = b"POST" if body else b"GET"
        length = b"Content-Length: %d\r\n" % len(body) if body else b""
        s.sendall(method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + length + extra
                  + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return split_response(data)


@pytest.mark.parametrize("form", ["unix:", "unix@"])
def test_unix_backends_on_both_paths(proxy, unix_backend: str, form: str) -> None:
    lb = proxy([form + unix_backend], workers=1)
    port = lb.address[1]
    for _ in range(3):  # fresh and pooled connections
        status, _, body = get(port, "/whoami")
        assert status.endswith("200 OK") and body == b"b0"
    status, _, body = get(port, "/echo", body=b"x" * 100_000)
    assert status.endswith("200 OK") and body == b"x" * 100_000
    # hyper's path (an Upgrade header takes it)
    status, _, body = get(port, "/headers", extra=b"Upgrade: foo\r\n")
    assert status.endswith("200 OK") and json.loads(body)["method"] == "GET"
    assert [b["name"] for b in lb.backends()] == [form + unix_backend]


def test_a_missing_socket_is_a_backend_error_not_a_crash(proxy, sockdir: Path) -> None:
    lb = proxy([f"unix:{sockdir}/nobody.sock"], workers=1, retries=0)
    status, _, _ = get(lb.address[1], "/whoami")
    assert status.endswith(("503 Service Unavailable", "502 Bad Gateway")), status


async def test_health_checks_reach_unix_backends(unix_backend: str) -> None:
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [f"unix:{unix_backend}"],
                     "health": {"path": "/health", "interval": 0.05, "timeout": 1.0, "rise": 1, "fall": 2}})
    async with LoadBalancer(cfg) as lb:
        assert lb.backends()[0]["state"] == "up"
        await asyncio.to_thread(get, lb.address[1], "/sick")

        async def down() -> None:
            while lb.backends()[0]["state"] != "down":
                await asyncio.sleep(0.02)

        await asyncio.wait_for(down(), 10)


def test_unix_addresses_are_checked() -> None:
    for bad in ("unix:relative.sock", "unix:/" + "a" * 120):
        with pytest.raises(BalancerConfigError, match="backend address"):
            from_dict({"listen": "127.0.0.1:0", "backends": [bad]})
    # the data plane checks again what reaches it (here past balancer.config's check)
    cfg = from_dict({"listen": "127.0.0.1:0", "backends": ["unix:/tmp/b.sock"]})
    object.__setattr__(cfg.backends[0], "address", "unix:/" + "a" * 120)
    with pytest.raises(rustext.BalancerError, match="unix socket path"):
        rustext.Balancer(cfg)


def unix_get(path: str, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return split_response(data)


def unix_listener(sockdir: Path, backend: str, **extra: object) -> rustext.Balancer:
    cfg = from_dict({"workers": 2, "backends": [backend],
                     "listeners": [{"address": f"unix:{sockdir}/lb.sock", "mode": "0660",
                                    "default_backend": "default", **extra},
                                   {"address": "127.0.0.1:0", "default_backend": "default"}]})
    lb = rustext.Balancer(cfg)
    lb.start()
    return lb


def test_a_unix_listener_serves_both_paths_without_a_forwarded_address(sockdir: Path, backends) -> None:
    (b,) = backends(1)
    lb = unix_listener(sockdir, b.address, request_headers={"set": {"X-Src": "%[src]"}})
    path = str(sockdir / "lb.sock")
    try:
        assert lb.addresses[0] == (f"unix:{path}", 0)
        assert oct(os.stat(path).st_mode & 0o777) == "0o660"
        for extra in (b"", b"Upgrade: foo\r\n"):  # the fast path, then hyper's
            status, _, body = unix_get(path, b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                       b"X-Forwarded-For: 192.0.2.1\r\n" + extra + b"\r\n")
            assert status.endswith("200 OK"), status
            h = {k.lower(): v for k, v in json.loads(body)["headers"]}
            # as HAProxy: nothing appended for a client without an address, what came in is kept
            assert h["x-forwarded-for"] == "192.0.2.1" and "forwarded" not in h, h
            assert h["x-forwarded-proto"] == "http"
            assert h["x-src"] == ""  # %[src]: empty, as HAProxy's for a Unix-socket client
        # the TCP listener beside it forwards its clients' addresses as usual
        status, _, body = get(lb.addresses[1][1], "/headers")
        assert dict(json.loads(body)["headers"])["x-forwarded-for"] == "127.0.0.1"
    finally:
        lb.close()
    assert not os.path.exists(path)  # removed at close


def test_accept_proxy_on_a_unix_listener_gives_the_client_address(sockdir: Path, backends) -> None:
    (b,) = backends(1)
    lb = unix_listener(sockdir, b.address, accept_proxy=True)
    try:
        _, _, body = unix_get(str(sockdir / "lb.sock"), b"PROXY TCP4 192.0.2.8 10.0.0.1 1234 80\r\n"
                                   b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert dict(json.loads(body)["headers"])["x-forwarded-for"] == "192.0.2.8"
    finally:
        lb.close()


def test_a_stale_socket_is_replaced_and_a_busy_one_refused(sockdir: Path, backends) -> None:
    (b,) = backends(1)
    path = sockdir / "lb.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a file left by a process that is gone: nobody accepts on it
    stale.close()
    lb = unix_listener(sockdir, b.address)
    try:
        assert unix_get(str(path), b"GET /whoami HTTP/1.0\r\n\r\n")[2] == b"b0"
        with pytest.raises(rustext.BalancerError, match=f"cannot listen on unix:{path}: address already in use"):
            unix_listener(sockdir, b.address)
        assert unix_get(str(path), b"GET /whoami HTTP/1.0\r\n\r\n")[2] == b"b0"  # still ours
    finally:
        lb.close()
    path.write_text("not a socket")
    with pytest.raises(rustext.BalancerError, match="not a socket"):
        unix_listener(sockdir, b.address)
    assert path.read_text() == "not a socket"


def test_unix_listener_config_is_checked() -> None:
    for listener, match in (({"address": "unix:/tmp/x.sock", "mode": "rw"}, "mode"),
                            ({"address": "127.0.0.1:0", "mode": "0660"}, "mode"),
                            ({"address": "unix:x.sock"}, "absolute")):
        with pytest.raises(BalancerConfigError, match=match):
            from_dict({"backends": ["127.0.0.1:1"], "listeners": [{"default_backend": "default", **listener}]})


def test_a_unix_client_is_logged_as_unix_and_forwarded_no_address_over_tls(sockdir: Path, backends, pki) -> None:
    """HAProxy logs a client of a Unix socket as ``unix`` with the listener's
    number as its port (``%ci:%cp`` = ``unix:1``); over TLS as in clear, no
    address is appended to X-Forwarded-For (there is none: not ``0.0.0.0``)."""
    import ssl

    (b,) = backends(1)
    leaf = pki.leaf("localhost", "127.0.0.1")
    log = sockdir / "access.log"
    cfg = from_dict({"workers": 1, "backends": [b.address],
                     "tls": {"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]},
                     "access_log": {"path": str(log), "format": "%ci:%cp %HP %ST"},
                     "listeners": [{"address": f"unix:{sockdir}/plain.sock", "default_backend": "default"},
                                   {"address": f"unix:{sockdir}/tls.sock", "tls": True,
                                    "default_backend": "default"}]})
    lb = rustext.Balancer(cfg)
    lb.start()
    try:
        unix_get(str(sockdir / "plain.sock"), b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        for extra in (b"", b"Upgrade: foo\r\n"):  # the fast path's and hyper's view of the peer
            with socket.socket(socket.AF_UNIX) as raw:
                raw.settimeout(10)
                raw.connect(str(sockdir / "tls.sock"))
                with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                    s.sendall(b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + b"\r\n")
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
            status, _, body = split_response(data)
            assert status.endswith("200 OK"), status
            h = {k.lower(): v for k, v in json.loads(body)["headers"]}
            assert "x-forwarded-for" not in h and "forwarded" not in h, h
            assert h["x-forwarded-proto"] == "https"
    finally:
        lb.close()
    lines = log.read_text().splitlines()
    assert lines == ["unix:1 /whoami 200", "unix:2 /headers 200", "unix:2 /headers 200"], lines
