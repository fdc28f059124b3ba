"""DNS discovery (rpc/discovery/dns.py) against a real dnsmasq and real
`juggler rpc serve` processes on 127.0.0.x: A and SRV records changing under
a client that keeps calling, the resolver going away, and `juggler rpc call
dns://…` as a process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rpc.discovery.dns import (
    DnsDiscovery,
    DnsName,
    SrvRecord,
    refresh_delay,
    srv_choice,
)
from rpc.discovery.url import RegistryURL, is_registry_url
from rpc.errors import RegistryUnavailable
from rpc.rpcx_client import RpcxCaller
from rpc.selector import RoundRobinSelector
from rpc.xclient import XClient, XClientOptions
from tests.dnsmasq import Dnsmasq
from tests.netutil import free_port, wait_until
from tests.rpc.discovery.helpers import wait_servers
from tests.rpc.test_cli_rpc import run_cli
from tests.rpc.test_rpcx_e2e import Served, serve

APP = ("--app", "tests.rpc.rpcx_app:setup")

# --- sans I/O ----------------------------------------------------------------------------------


def test_urls() -> None:
    assert is_registry_url("dns://app.test:8972") and is_registry_url("dns+srv://_rpcx._tcp.app.test")
    a = RegistryURL.parse("dns://app.test:8972?nameserver=127.0.0.1:5353&nameserver=10.0.0.1&interval=2.5")
    assert a.kind == "dns" and a.display == "dns://app.test:8972"
    assert a.dns == DnsName(name="app.test", port=8972, nameservers=("127.0.0.1:5353", "10.0.0.1"), interval=2.5)
    s = RegistryURL.parse("dns+srv://_rpcx._tcp.app.test.?timeout=1")
    assert s.dns == DnsName(name="_rpcx._tcp.app.test", srv=True, timeout=1.0) and s.display == s.dns.display
    for url, error in [
        ("dns://app.test", "needs a port"),
        ("dns+srv://_rpcx._tcp.app.test:80", "SRV records carry the ports"),
        ("dns://app.test:80?nameserver=dns.example", "nameserver 'dns.example' must be an IP address"),
        ("dns://app.test:80?interval=0", "interval must be a number of seconds > 0"),
        ("dns://app.test:80?ttl=3", "unknown query parameter 'ttl'"),
        ("dns://app.test:80/rpcx", "takes a name, a port and a query only"),
    ]:
        with pytest.raises(ValueError, match=error):
            RegistryURL.parse(url)


def test_srv_choice_and_refresh_delay() -> None:
    records = [SrvRecord(10, 1, 80, "c"), SrvRecord(0, 3, 80, "a"), SrvRecord(0, 0, 81, "b"),
               SrvRecord(0, 1, 0, "none"), SrvRecord(5, 1, 80, ".")]
    assert srv_choice(records) == [[SrvRecord(0, 3, 80, "a"), SrvRecord(0, 0, 81, "b")], [SrvRecord(10, 1, 80, "c")]]
    assert refresh_delay(0, interval=None, min_ttl=1, max_ttl=60) == 1
    assert refresh_delay(30, interval=None, min_ttl=1, max_ttl=60) == 30
    assert refresh_delay(86400, interval=None, min_ttl=1, max_ttl=60) == 60
    assert refresh_delay(None, interval=None, min_ttl=2, max_ttl=60) == 2
    assert refresh_delay(30, interval=5, min_ttl=1, max_ttl=60) == 5


# --- against dnsmasq and real servers ----------------------------------------------------------


@pytest.fixture
def dnsmasq(tmp_path: Any) -> Iterator[Any]:
    started: list[Dnsmasq] = []

    def make(hosts: dict[str, list[str]], srv: list[str] = (), port: int | None = None, ttl: int = 0) -> Dnsmasq:
        d = Dnsmasq(str(tmp_path / "hosts"), hosts, srv=list(srv), port=port, ttl=ttl)
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


@pytest.fixture
def servers() -> Iterator[Any]:
    started: list[Served] = []

    def start(listen: str) -> Served:
        s = serve(*APP, listen=listen)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


class Caller:
    """An XClient calling Probe.Who without pause: the pids that answered, the errors."""

    def __init__(self, xc: XClient) -> None:
        self.xc = xc
        self.pids: list[int] = []
        self.errors: list[BaseException] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                self.pids.append((await self.xc.call("Who", None, timeout=5))["pid"])
            except Exception as exc:  # noqa: BLE001 - counted, the test asserts there are none
                self.errors.append(exc)
            await asyncio.sleep(0)

    async def seen(self, pid: int) -> None:
        mark = len(self.pids)
        await wait_until(lambda: pid in self.pids[mark:], 10, what=f"a call answered by {pid}")

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def calling(name: DnsName) -> AsyncIterator[tuple[DnsDiscovery, Caller]]:
    discovery = DnsDiscovery(name)
    caller = RpcxCaller()
    try:
        async with discovery, XClient("Probe", discovery, caller, selector=RoundRobinSelector(),
                                      options=XClientOptions()) as xc:
            c = Caller(xc)
            try:
                yield discovery, c
            finally:
                await c.stop()
    finally:
        await caller.aclose()


async def test_a_records_changing_under_a_calling_client(dnsmasq: Any, servers: Any) -> None:
    port = free_port()
    b2, b3 = servers(f"127.0.0.2:{port}"), servers(f"127.0.0.3:{port}")
    dns = dnsmasq({"app.test": ["127.0.0.2"]})
    name = DnsName(name="app.test", port=port, nameservers=(dns.nameserver,), min_ttl=0.1)
    async with calling(name) as (discovery, c):
        assert discovery.servers() == {f"tcp@127.0.0.2:{port}": ""}
        await c.seen(b2.proc.pid)
        dns.set_hosts({"app.test": ["127.0.0.2", "127.0.0.3"]})  # a server added
        await wait_servers(discovery, lambda s: len(s) == 2)
        await c.seen(b3.proc.pid)
        dns.set_hosts({"app.test": ["127.0.0.3"]})  # one removed
        assert await wait_servers(discovery, lambda s: len(s) == 1) == {f"tcp@127.0.0.3:{port}": ""}
        mark = len(c.pids)
        await wait_until(lambda: len(c.pids) > mark + 20)
        assert set(c.pids[mark + 5:]) == {b3.proc.pid}  # a call or two may have been on its way
        assert c.errors == []


async def test_srv_records_give_ports_weights_and_priority(dnsmasq: Any, servers: Any) -> None:
    p0, p1, p2 = free_port(), free_port(), free_port()
    a, b, spare = servers(f"127.0.0.2:{p0}"), servers(f"127.0.0.3:{p1}"), servers(f"127.0.0.4:{p2}")
    hosts = {"a.app.test": ["127.0.0.2"], "b.app.test": ["127.0.0.3"], "spare.app.test": ["127.0.0.4"]}
    srv = "_rpcx._tcp.app.test"
    dns = dnsmasq(hosts, srv=[f"{srv},a.app.test,{p0},0,3", f"{srv},b.app.test,{p1},0,1",
                              f"{srv},spare.app.test,{p2},1,1"], ttl=7)
    name = DnsName(name=srv, srv=True, nameservers=(dns.nameserver,), min_ttl=0.1)
    async with calling(name) as (discovery, c):
        # the lowest priority only, the SRV weights as the servers' weight=
        assert discovery.servers() == {f"tcp@127.0.0.2:{p0}": "weight=3", f"tcp@127.0.0.3:{p1}": "weight=1"}
        assert discovery.refresh_interval == 7  # the records' TTL
        await c.seen(a.proc.pid)
        await c.seen(b.proc.pid)
        # dnsmasq reads its SRV records at start only: a new one on the same port, a record gone
        dns.stop()
        dns = dnsmasq(hosts, srv=[f"{srv},b.app.test,{p1},0,5", f"{srv},spare.app.test,{p2},1,1"], port=dns.port)
        await discovery.refresh()  # not waiting 7 s for the TTL
        assert discovery.servers() == {f"tcp@127.0.0.3:{p1}": "weight=5"}
        mark = len(c.pids)
        await wait_until(lambda: len(c.pids) > mark + 10)
        assert set(c.pids[mark + 5:]) == {b.proc.pid}
        # the priority-0 target no longer resolves: the fallback group serves
        dns.set_hosts({"a.app.test": ["127.0.0.2"], "spare.app.test": ["127.0.0.4"]})
        await discovery.refresh()
        assert discovery.servers() == {f"tcp@127.0.0.4:{p2}": "weight=1"}
        await c.seen(spare.proc.pid)
        assert c.errors == []


async def test_resolver_down_keeps_the_last_good_set(dnsmasq: Any, servers: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    b2, b3 = servers(f"127.0.0.2:{port}"), servers(f"127.0.0.3:{port}")
    dns = dnsmasq({"app.test": ["127.0.0.2", "127.0.0.3"]})
    name = DnsName(name="app.test", port=port, nameservers=(dns.nameserver,), min_ttl=0.1, timeout=0.3)
    caplog.set_level(logging.WARNING, "rpc.discovery.dns")
    async with calling(name) as (discovery, c):
        both = discovery.servers()
        assert len(both) == 2
        dns.stop()
        await wait_until(lambda: discovery.fetch_errors >= 3, 10)
        assert discovery.servers() == both and "no answer within 0.3 s" in discovery.last_error
        await c.seen(b2.proc.pid)
        await c.seen(b3.proc.pid)
        # the name gone (dnsmasq, not authoritative, refuses it) keeps the set as well
        dns = dnsmasq({}, port=dns.port)
        await wait_until(lambda: "REFUSED" in discovery.last_error, 10)
        errors = discovery.fetch_errors
        await wait_until(lambda: discovery.fetch_errors >= errors + 3, 10)
        assert discovery.servers() == both
        warnings = [r.getMessage() for r in caplog.records if r.name == "rpc.discovery.dns"]
        assert len(warnings) == 2, warnings  # one per distinct failure, not one per refresh
        dns.set_hosts({"app.test": ["127.0.0.3"]})
        assert await wait_servers(discovery, lambda s: len(s) == 1) == {f"tcp@127.0.0.3:{port}": ""}
        assert discovery.last_error == ""
        assert c.errors == []


async def test_start_fails_when_the_name_does_not_resolve(dnsmasq: Any) -> None:
    dns = dnsmasq({})
    discovery = DnsDiscovery(DnsName(name="nowhere.test", port=1, nameservers=(dns.nameserver,)))
    with pytest.raises(RegistryUnavailable, match="nowhere.test: every nameserver failed .REFUSED."):
        await discovery.start()


def test_cli_call_and_bench_through_dns(dnsmasq: Any, servers: Any) -> None:
    port = free_port()
    b2 = servers(f"127.0.0.2:{port}")
    dns = dnsmasq({"app.test": ["127.0.0.2"]}, srv=[f"_rpcx._tcp.app.test,app.test,{port}"])
    url = f"dns://app.test:{port}?nameserver={dns.nameserver}"
    out = run_cli("cli.rpc_call", url, "Probe.Who", "null", "--selector", "roundrobin")
    assert out.returncode == 0, out.stderr
    assert f'"pid": {b2.proc.pid}' in out.stdout or f'"pid":{b2.proc.pid}' in out.stdout
    out = run_cli("cli.rpc_call", url, "Arith.Mul", '{"A":6,"B":7}')
    assert out.returncode == 0 and out.stdout.strip() == '{"C": 42}', out.stderr
    bench = run_cli("cli.rpc_bench", f"dns+srv://_rpcx._tcp.app.test?nameserver={dns.nameserver}",
                    "--example", "arith", "-n", "20", "-c", "2", "--processes", "2")  # the route goes to each process
    assert bench.returncode == 0 and "received requests_OK : 20" in bench.stdout, bench.stdout + bench.stderr
    out = run_cli("cli.rpc_call", f"dns://nowhere.test:{port}?nameserver={dns.nameserver}", "Probe.Who")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "nowhere.test: every nameserver failed (REFUSED)" in out.stderr, \
        out.stderr
    out = run_cli("cli.rpc_call", "dns://app.test", "Probe.Who")
    assert out.returncode == 2 and "needs a port" in out.stderr and "Traceback" not in out.stderr
