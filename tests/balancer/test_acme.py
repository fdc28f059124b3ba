"""Certificates from an ACME CA (balancer/acme/) against Pebble, Let's
Encrypt's test CA, with a dnsmasq giving the test names to 127.0.0.1.

Real balancers (the service, the data plane) answer Pebble's HTTP-01 and
TLS-ALPN-01 validations themselves; each test waits on the balancer's ACME
state or on what a TLS client is served, never on a sleep.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import re
import socket
import ssl
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from balancer_helpers import raw_exchange, split_response, start_backend
from dnsmasq import Dnsmasq
from pebble import Pebble

from balancer.acme.storage import Storage
from balancer.config import from_dict
from balancer.service import LoadBalancer
from tests.netutil import free_port, wait_until

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _acme_log(caplog):
    caplog.set_level(logging.INFO, "balancer.acme")

NAME = "a.example.test"


class Site:
    """A Pebble whose validations reach ``http_port``/``tls_port``, a backend, the folder."""

    def __init__(self, tmp: str, pebble: Callable[..., Pebble], validity: int) -> None:
        self.tmp = tmp
        self.http_port, self.tls_port = free_port(), free_port()
        self.ca = pebble(http_port=self.http_port, tls_port=self.tls_port, validity=validity)
        self.root = self.ca.root(os.path.join(tmp, "pebble-root.pem"))
        self.storage = os.path.join(tmp, "acme")

    def config(self, *, challenges: tuple[str, ...] = ("http-01",), tls_port: int | None = None,
               http_port: int | None = None, backend: str = "127.0.0.1:9", **acme: Any) -> Any:
        return from_dict({
            "listen": f"127.0.0.1:{tls_port or self.tls_port}",
            "workers": 1,
            "backends": [backend],
            "tls": {"redirect": f"127.0.0.1:{http_port or self.http_port}"},
            "acme": {"names": [NAME], "storage": self.storage, "directory": self.ca.directory,
                     "ca_root": self.ca.minica, "challenges": list(challenges), "retry_after": "0.5s",
                     "watch_interval": "0.2s", **acme},
        })

    def served(self, port: int | None = None) -> dict[str, Any]:
        """The certificate a client trusting Pebble's root is served for NAME."""
        ctx = ssl.create_default_context(cafile=self.root)
        with (socket.create_connection(("127.0.0.1", port or self.tls_port), timeout=10) as raw,
              ctx.wrap_socket(raw, server_hostname=NAME) as s):
            return s.getpeercert()


@pytest.fixture
def site(tmp_path) -> Iterator[Callable[..., Site]]:
    dns = Dnsmasq(str(tmp_path / "hosts"), {NAME: ["127.0.0.1"]})
    started: list[Pebble] = []

    def pebble(**kw: Any) -> Pebble:
        p = Pebble(str(tmp_path), dns=dns.nameserver, port=free_port(), management_port=free_port(), **kw)
        started.append(p)
        return p

    yield lambda validity=7776000: Site(str(tmp_path), pebble, validity)
    for p in started:
        p.stop()
    dns.stop()


@pytest.fixture
def backend() -> Iterator[Any]:
    b = start_backend("b0")
    yield b
    b.kill()


async def started(config: Any) -> LoadBalancer:
    lb = LoadBalancer(config, drain_timeout=2.0)
    await lb.start()
    return lb


async def obtained(lb: LoadBalancer, n: int = 1, timeout: float = 30.0) -> None:
    assert lb.acme is not None
    await wait_until(lambda: lb.acme.orders >= n, timeout,
                     what=lambda: f"orders={lb.acme.orders} last error: {lb.acme.last_error}")


async def test_http01_obtains_a_certificate_kept_0600(site, backend, caplog):
    s = site()
    lb = await started(s.config(backend=backend.address))
    try:
        await obtained(lb)
        assert f"{NAME} validated by http-01" in caplog.text
        cert = await asyncio.to_thread(s.served)
        assert ("DNS", NAME) in cert["subjectAltName"]
        # a client trusting the CA gets through to the backend
        ctx = ssl.create_default_context(cafile=s.root)
        ctx.check_hostname = False  # the test connects to 127.0.0.1; the name was checked above

        def get() -> int:
            c = http.client.HTTPSConnection("127.0.0.1", s.tls_port, context=ctx, timeout=10)
            try:
                c.request("GET", "/size/10", headers={"Host": NAME})
                return c.getresponse().status
            finally:
                c.close()

        assert await asyncio.to_thread(get) == 200
        assert stat.S_IMODE(os.stat(s.storage).st_mode) == 0o700
        for name in ("account.key", "account.json", "cert.pem", "key.pem", "lock"):
            assert stat.S_IMODE(os.stat(os.path.join(s.storage, name)).st_mode) == 0o600, name
        assert not [f for f in os.listdir(s.storage) if f.endswith(".tmp")]
    finally:
        await lb.aclose()


async def test_tls_alpn01_obtains_a_certificate(site, caplog):
    s = site()
    lb = await started(s.config(challenges=("tls-alpn-01",)))
    try:
        await obtained(lb)
        assert f"{NAME} validated by tls-alpn-01" in caplog.text
        assert ("DNS", NAME) in (await asyncio.to_thread(s.served))["subjectAltName"]
    finally:
        await lb.aclose()


async def test_http01_tokens_are_answered_before_routing_on_plain_listeners(tmp_path, backend):
    """The token table itself: the plain listener (the fast path hands the
    request to hyper's path) answers a pending token, then routes again."""
    from balancer_helpers import lb_config

    import rustext

    native = rustext.Balancer(lb_config([backend], workers=1))
    native.start()
    try:
        port = native.addresses[0][1]
        path = b"/.well-known/acme-challenge/tok123"
        native.acme_http01_set("tok123", "tok123.thumb")
        for req in (b"GET " + path + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                    b"GET " + path + b" HTTP/1.0\r\n\r\n"):
            status, headers, body = split_response(raw_exchange(port, req))
            assert status.split()[1] == "200" and body == b"tok123.thumb", (status, body)
            assert headers["content-type"] == "text/plain"
        native.acme_http01_remove("tok123")
        status, _, body = split_response(
            raw_exchange(port, b"GET " + path + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
        assert body != b"tok123.thumb"  # routed to the backend as any request
    finally:
        native.close()


async def test_restart_reuses_the_account_and_the_certificate(site):
    s = site()
    lb = await started(s.config())
    try:
        await obtained(lb)
        first = (await asyncio.to_thread(s.served))["serialNumber"]
    finally:
        await lb.aclose()
    account_key = Storage(s.storage).read("account.key")
    orders = s.ca.orders()
    accounts = sum("sign-me-up" in line for line in s.ca.log)
    lb = await started(s.config())
    try:
        assert (await asyncio.to_thread(s.served))["serialNumber"] == first
        # scheduled for renewal, months ahead: no order, no new account
        await wait_until(lambda: lb.acme.next_attempt > time.time() + 86400, 10)
        assert lb.acme.orders == 0 and s.ca.orders() == orders
        assert Storage(s.storage).read("account.key") == account_key
        assert sum("sign-me-up" in line for line in s.ca.log) == accounts
    finally:
        await lb.aclose()


async def test_two_balancers_sharing_the_folder_order_once(site):
    s = site()
    a = await started(s.config())
    b = None
    try:
        # b starts while a holds the ordering lock
        await wait_until(lambda: a.acme.storage.locked or a.acme.orders, 10)
        b = await started(s.config(tls_port=free_port(), http_port=free_port()))
        await obtained(a)
        serial = (await asyncio.to_thread(s.served))["serialNumber"]
        b_port = b.address[1]
        await wait_until(lambda: _serial(s, b_port) == serial, 10, interval=0.1)
        assert a.acme.orders == 1 and b.acme.orders == 0 and s.ca.orders() == 1
    finally:
        await a.aclose()
        if b is not None:
            await b.aclose()


def _serial(s: Site, port: int) -> str | None:
    try:
        return s.served(port)["serialNumber"]
    except (ssl.SSLError, OSError):
        return None  # still the placeholder, which the client does not trust


async def test_a_short_lived_certificate_is_renewed_under_load_without_a_failed_request(site, backend):
    s = site(validity=15)
    lb = await started(s.config(backend=backend.address))
    try:
        await obtained(lb)
        first = (await asyncio.to_thread(s.served))["serialNumber"]
        stop = asyncio.Event()
        done: list[int] = []
        failed: list[str] = []
        ctx = ssl.create_default_context(cafile=s.root)
        ctx.check_hostname = False

        def client(keep_alive: bool) -> None:
            conn = None
            while not stop.is_set():
                try:
                    if conn is None:
                        conn = http.client.HTTPSConnection("127.0.0.1", s.tls_port, context=ctx, timeout=10)
                    conn.request("GET", "/size/10", headers={"Host": NAME})
                    r = conn.getresponse()
                    r.read()
                    if r.status != 200:
                        failed.append(f"status {r.status}")
                    done.append(1)
                except Exception as exc:  # noqa: BLE001  # every failure counts
                    failed.append(repr(exc))
                    conn = None
                if not keep_alive and conn is not None:
                    conn.close()
                    conn = None
            if conn is not None:
                conn.close()

        clients = [asyncio.create_task(asyncio.to_thread(client, i % 2 == 0)) for i in range(4)]
        try:
            await obtained(lb, 2, timeout=40)
            await wait_until(lambda: _serial(s, s.tls_port) not in (None, first), 10, interval=0.1)
            before = len(done)
            await wait_until(lambda: len(done) > before + 20, 10)  # traffic goes on with the new certificate
        finally:
            stop.set()
            await asyncio.gather(*clients)
        assert not failed, failed[:5]
        assert len(done) > 50
    finally:
        await lb.aclose()


async def test_when_the_ca_is_down_the_old_certificate_stays_and_retries_back_off(site, caplog):
    s = site(validity=30)
    lb = await started(s.config(renew_before="5/6"))
    try:
        await obtained(lb)
        first = (await asyncio.to_thread(s.served))["serialNumber"]
        s.ca.stop()
        await wait_until(lambda: lb.acme.failures >= 3, 40, interval=0.1,
                         what=lambda: f"failures={lb.acme.failures}")
        assert lb.acme.orders == 1 and lb.acme.last_error
        assert (await asyncio.to_thread(s.served))["serialNumber"] == first
        # the waits grow (0.5 s doubling, with jitter of half of each)
        waits = [float(m) for m in re.findall(r"retrying in ([0-9.]+) s", caplog.text)]
        assert len(waits) >= 3 and waits[2] > waits[0], waits
    finally:
        await lb.aclose()
