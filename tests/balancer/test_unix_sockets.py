"""Backends on Unix sockets (``unix:/path``, HAProxy's ``unix@/path``): both
HTTP paths and the health checks, with real backend processes."""

from __future__ import annotations

import asyncio
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
        await asyncio.sleep(0.3)  # several checks
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
    with pytest.raises(ValueError, match="unix socket path"):
        rustext.Balancer({"listen": "127.0.0.1:0", "backends": ["unix:/" + "a" * 120]})
