"""Listeners added and removed by a reload, under load: the kept listener
refuses nothing, the new one serves, the removed one refuses new
connections while its request in flight finishes."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest
from balancer_helpers import split_response

from balancer import LoadBalancer
from balancer.config import from_dict
from tests.netutil import free_port

pytestmark = [pytest.mark.timeout(60)]


def config(listeners: list[tuple[int, str]], main: str, slow: str) -> Any:
    return from_dict({
        "workers": 2,
        "backends": {"main": {"servers": [main]}, "slow": {"servers": [slow]}},
        "listeners": [{"address": f"127.0.0.1:{port}", "default_backend": pool} for port, pool in listeners]})


def read_response(s: socket.socket) -> tuple[str, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response")
        data += chunk
    status, headers, body = split_response(data)
    while len(body) < int(headers["content-length"]):
        body += s.recv(65536)
    return status, body


class Load:
    """Requests in a loop on `port`: one thread with a new connection each,
    one on a single keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.done = [0, 0]
        self.threads = [threading.Thread(target=self.fresh), threading.Thread(target=self.keep_alive)]
        for t in self.threads:
            t.start()

    def fresh(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    status, body = read_response(s)
                assert status.endswith("200 OK") and body == b"b0", status
                self.done[0] += 1
            except Exception as exc:  # every failure is reported by the test
                self.failures.append(f"new connection: {exc!r}")

    def keep_alive(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                while not self.stop.is_set():
                    s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\n\r\n")
                    status, body = read_response(s)
                    assert status.endswith("200 OK") and body == b"b0", status
                    self.done[1] += 1
        except Exception as exc:
            self.failures.append(f"keep-alive: {exc!r}")

    async def until(self, fresh: int, kept: int) -> None:
        while self.done[0] < fresh or self.done[1] < kept:
            assert not self.failures, self.failures
            await asyncio.sleep(0.01)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=20)


async def test_reload_adds_and_removes_listeners_without_refusing_or_cutting(backends) -> None:
    main, slow = backends(2)
    kept, gone, new = free_port(), free_port(), free_port()
    async with LoadBalancer(config([(kept, "main"), (gone, "slow")], main.address, slow.address)) as lb:
        load = Load(kept)
        try:
            await asyncio.wait_for(load.until(20, 20), 20)
            # a keep-alive request in flight on the listener about to go
            draining = socket.create_connection(("127.0.0.1", gone), timeout=10)
            draining.sendall(b"GET /slow?ms=700 HTTP/1.1\r\nHost: x\r\n\r\n")

            async def in_flight() -> None:
                while not any(b["name"] == slow.address and b["active"] for b in lb.backends()):
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(in_flight(), 10)
            before = list(load.done)
            await lb.reload(config([(kept, "main"), (new, "main")], main.address, slow.address))
            assert [a[1] for a in lb.addresses] == [kept, new]
            # the new listener serves, the removed one refuses
            with socket.create_connection(("127.0.0.1", new), timeout=10) as s:
                s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert read_response(s) == ("HTTP/1.1 200 OK", b"b0")
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", gone), timeout=10).close()
            # the request in flight finishes, then its connection closes
            status, body = await asyncio.to_thread(read_response, draining)
            assert status.endswith("200 OK") and body == b"b1"
            assert await asyncio.to_thread(draining.recv, 1024) == b""
            draining.close()
            # the load went on through the reload, with no failure
            await asyncio.wait_for(load.until(before[0] + 20, before[1] + 20), 20)
        finally:
            load.finish()
        assert load.failures == []
        # a reload that keeps the listeners keeps their sockets (and ports)
        await lb.reload(config([(kept, "main"), (new, "main")], main.address, slow.address))
        assert [a[1] for a in lb.addresses] == [kept, new]


async def test_a_listener_that_cannot_open_leaves_everything_as_it_was(backends) -> None:
    main, slow = backends(2)
    kept = free_port()
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        async with LoadBalancer(config([(kept, "main")], main.address, slow.address)) as lb:
            with pytest.raises(Exception, match="address already in use"):
                await lb.reload(config([(kept, "main"), (busy.getsockname()[1], "main")], main.address, slow.address))
            assert [a[1] for a in lb.addresses] == [kept]
            with socket.create_connection(("127.0.0.1", kept), timeout=10) as s:
                s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert read_response(s)[1] == b"b0"
    finally:
        busy.close()


async def test_a_new_https_listener_without_certificates_is_refused(backends, pki) -> None:
    main, slow = backends(2)
    kept = free_port()
    leaf = pki.leaf("localhost", "127.0.0.1")
    async with LoadBalancer(config([(kept, "main")], main.address, slow.address)) as lb:
        new = from_dict({"workers": 2, "backends": [main.address],
                         "tls": {"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]},
                         "listeners": [{"address": f"127.0.0.1:{kept}", "default_backend": "default"},
                                       {"address": f"127.0.0.1:{free_port()}", "tls": True,
                                        "default_backend": "default"}]})
        with pytest.raises(Exception, match="restart"):
            await lb.reload(new)
        assert [a[1] for a in lb.addresses] == [kept]
