"""DNS service discovery (balancer/discovery.py) against a real dnsmasq and
real backend processes on 127.0.0.x addresses."""

from __future__ import annotations

import asyncio
import http.client
import os
import subprocess
import sys

import pytest
from balancer_helpers import start_backend

from balancer import BalancerConfig, BalancerConfigError, LoadBalancer, load
from balancer.config import BackendConfig, from_dict
from balancer.discovery import Discovery, DnsConfig, Target
from tests.dnsmasq import Dnsmasq
from tests.netutil import free_port, wait_for_port, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.fixture
def backends_on():
    """``backends_on(port, "127.0.0.2", "127.0.0.3")``: one backend per address, same port, named b0, b1, …"""
    started = []

    def make(port: int, *hosts: str):
        out = [start_backend(f"b{len(started) + i}", port, host=h) for i, h in enumerate(hosts)]
        started.extend(out)
        return out

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def dnsmasq(tmp_path):
    servers: list[Dnsmasq] = []

    def make(hosts: dict[str, list[str]], srv: list[str] = (), port: int | None = None) -> Dnsmasq:
        d = Dnsmasq(str(tmp_path / "hosts"), hosts, srv=list(srv), port=port)
        servers.append(d)
        return d

    yield make
    for d in servers:
        d.stop()


def get(port: int, path: str = "/whoami") -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def names(lb: LoadBalancer) -> set[str]:
    return {b["name"] for b in lb.backends()}


def config(dns: Dnsmasq, *backends: BackendConfig, **dns_settings) -> BalancerConfig:
    return BalancerConfig(listen="127.0.0.1:0", workers=2, backends=backends,
                          dns=DnsConfig(nameservers=(dns.nameserver,), **{"interval": 0.05, **dns_settings}))


# --- the config -------------------------------------------------------------------------------


@pytest.mark.parametrize(("dns", "message"), [
    ({"interval": 0}, "dns.interval"),
    ({"nameservers": ["ns.example"]}, "must be an IP address"),
    ({"nameservers": ["127.0.0.1:x"]}, "must be an IP address"),
    ({"init_addr": "libc"}, "dns.init_addr"),
    ({"hold_obsolete": -1}, "dns.hold_obsolete"),
])
def test_dns_table_is_validated(dns, message):
    with pytest.raises(BalancerConfigError, match=message):
        from_dict({"listen": "127.0.0.1:1", "dns": dns})


def test_backend_by_srv_or_address_not_both():
    with pytest.raises(BalancerConfigError, match="not both"):
        BackendConfig(address="a:1", srv="_http._tcp.a")
    with pytest.raises(BalancerConfigError, match="needs address"):
        BackendConfig()
    with pytest.raises(BalancerConfigError, match="resolve"):
        BackendConfig(address="a:1", resolve="ipv5")
    cfg = from_dict({"listen": "127.0.0.1:1", "dns": {"nameservers": ["127.0.0.1:53", "[::1]:5353"]},
                     "backends": ["app.test:80", "10.0.0.1:80", {"srv": "_http._tcp.app.test"}]})
    assert set(cfg.dns_targets()) == {"app.test:80", "srv:_http._tcp.app.test"}
    # without [dns], a name is resolved once at load, as before: nothing to follow but SRV
    assert set(from_dict({"listen": "127.0.0.1:1", "backends": ["localhost:80"]}).dns_targets()) == set()


# --- the resolver against dnsmasq, with a controlled clock --------------------------------------


async def test_hold_obsolete_and_hold_valid_follow_the_clock(dnsmasq):
    dns = dnsmasq({"app.test": ["127.0.0.2"]})
    now = [100.0]
    disc = Discovery(DnsConfig(nameservers=(dns.nameserver,), hold_obsolete=10, hold_valid=30, timeout=0.5),
                     clock=lambda: now[0])
    target = Target("app.test:80", "a", "app.test", 80)
    disc.configure(disc.config, [target])
    assert await disc.refresh()
    dns.set_hosts({"app.test": ["127.0.0.3"]})
    now[0] = 105
    assert await disc.refresh()
    assert disc.addresses(target) == [("127.0.0.3:80", None), ("127.0.0.2:80", None)]  # .2 held 10 s
    now[0] = 111
    assert await disc.refresh()
    assert disc.addresses(target) == [("127.0.0.3:80", None)]
    dns.set_hosts({})  # the name is gone: a failure, the last good set stays for hold_valid
    now[0] = 130
    assert not await disc.refresh()
    assert disc.addresses(target) == [("127.0.0.3:80", None)]
    assert disc.stats()["app.test:80"]["failures"] == 1
    now[0] = 141.1  # 30 s after the last good answer
    assert await disc.refresh()
    assert disc.addresses(target) == []


async def test_a_name_gives_at_most_max_addresses(dnsmasq):
    dns = dnsmasq({"many.test": [f"127.0.1.{i}" for i in range(1, 9)]})
    disc = Discovery(DnsConfig(nameservers=(dns.nameserver,), max_addresses=3, timeout=2))
    target = Target("many.test:80", "a", "many.test", 80, "ipv4")
    disc.configure(disc.config, [target])
    assert await disc.refresh()
    assert len(disc.addresses(target)) == 3


# --- a whole balancer --------------------------------------------------------------------------


async def test_a_records_moving_move_traffic_without_a_failed_request(dnsmasq, backends_on):
    port = free_port()
    b0, b1 = backends_on(port, "127.0.0.2", "127.0.0.3")
    dns = dnsmasq({"app.test": ["127.0.0.2"]})
    async with LoadBalancer(config(dns, BackendConfig(address=f"app.test:{port}"))) as lb:
        assert names(lb) == {b0.address}
        assert lb.backends()[0]["source"] == f"app.test:{port}"
        stop = asyncio.Event()
        errors: list[object] = []
        seen: list[bytes] = []

        def client() -> None:
            c = http.client.HTTPConnection("127.0.0.1", lb.address[1], timeout=10)
            while not stop.is_set():
                try:
                    c.request("GET", "/whoami")
                    r = c.getresponse()
                    body = r.read()
                    if r.status != 200:
                        errors.append(r.status)
                    seen.append(body)
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(exc)
                    return
            c.close()

        clients = [asyncio.create_task(asyncio.to_thread(client)) for _ in range(4)]
        await wait_until(lambda: len(seen) > 20, 10)
        dns.set_hosts({"app.test": ["127.0.0.3"]})
        await wait_until(lambda: names(lb) == {b1.address}, 10, what=lambda: str(lb.backends()))
        mark = len(seen)
        await wait_until(lambda: len(seen) > mark + 20, 10)
        stop.set()
        await asyncio.gather(*clients)
        assert errors == []
        assert set(seen[mark + 8:]) == {b"b1"}  # after the switch (a few were already on their way)
        assert seen[0] == b"b0"
        s = lb.stats()["dns"][f"app.test:{port}"]
        assert s["failures"] == 0 and s["addresses"] == 1 and s["resolutions"] >= 2


async def test_srv_records_give_ports_and_weights(dnsmasq, backends_on):
    p0, p1 = free_port(), free_port()
    b0 = backends_on(p0, "127.0.0.2")[0]
    b1 = backends_on(p1, "127.0.0.3")[0]
    dns = dnsmasq({"b0.app.test": ["127.0.0.2"], "b1.app.test": ["127.0.0.3"], "spare.app.test": ["127.0.0.4"]},
                  srv=[f"_http._tcp.app.test,b0.app.test,{p0},0,3", f"_http._tcp.app.test,b1.app.test,{p1},0,1",
                       f"_http._tcp.app.test,spare.app.test,{p1},1,5"])  # priority 1: a fallback, unused
    cfg = config(dns, BackendConfig(srv="_http._tcp.app.test"))
    cfg = BalancerConfig(**{**cfg.__dict__, "algorithm": "weighted_round_robin"})
    async with LoadBalancer(cfg) as lb:
        assert {b["name"]: b["weight"] for b in lb.backends()} == {b0.address: 3, b1.address: 1}
        got = [(await asyncio.to_thread(get, lb.address[1]))[1] for _ in range(8)]
        assert got.count(b"b0") == 6 and got.count(b"b1") == 2


async def test_failing_resolution_keeps_the_last_set_and_is_counted(dnsmasq, backends_on, tmp_path):
    port = free_port()
    b0, b1 = backends_on(port, "127.0.0.2", "127.0.0.3")
    dns = dnsmasq({"app.test": ["127.0.0.2", "127.0.0.3"]})
    async with LoadBalancer(config(dns, BackendConfig(address=f"app.test:{port}"), timeout=0.3)) as lb:
        assert names(lb) == {b0.address, b1.address}
        dns.set_hosts({})  # NXDOMAIN-like: dnsmasq refuses the name now
        await wait_until(lambda: lb.stats()["dns"][f"app.test:{port}"]["failures"] >= 2, 10)
        assert names(lb) == {b0.address, b1.address}
        dns.stop()  # no answer at all: timeouts
        failures = lb.stats()["dns"][f"app.test:{port}"]["failures"]
        await wait_until(lambda: lb.stats()["dns"][f"app.test:{port}"]["failures"] >= failures + 2, 10)
        assert "no answer within" in lb.stats()["dns"][f"app.test:{port}"]["last_error"]
        assert names(lb) == {b0.address, b1.address}
        assert {(await asyncio.to_thread(get, lb.address[1]))[1] for _ in range(4)} == {b"b0", b"b1"}
        # the server comes back on the same port with one address: followed again
        dns2 = dnsmasq({"app.test": ["127.0.0.3"]}, port=dns.port)
        assert dns2.port == dns.port
        await wait_until(lambda: names(lb) == {b1.address}, 10)


async def test_unresolvable_name_at_start_and_init_addr(dnsmasq, backends_on):
    port = free_port()
    b0 = backends_on(port, "127.0.0.2")[0]
    dns = dnsmasq({})
    async with LoadBalancer(config(dns, BackendConfig(address=f"app.test:{port}"))) as lb:
        assert names(lb) == set()
        assert (await asyncio.to_thread(get, lb.address[1]))[0] == 503
        dns.set_hosts({"app.test": ["127.0.0.2"]})
        await wait_until(lambda: names(lb) == {b0.address}, 10)
        assert await asyncio.to_thread(get, lb.address[1]) == (200, b"b0")
    with pytest.raises(BalancerConfigError, match=r"nope.test:\d+ does not resolve"):
        async with LoadBalancer(config(dns, BackendConfig(address=f"nope.test:{port}"), init_addr="error")):
            pass


async def test_reload_adds_a_name_and_a_bad_name_keeps_the_running_set(dnsmasq, backends_on, tmp_path):
    port = free_port()
    b0, b1 = backends_on(port, "127.0.0.2", "127.0.0.3")
    dns = dnsmasq({"one.test": ["127.0.0.2"], "two.test": ["127.0.0.3"]})
    path = tmp_path / "balancer.toml"
    head = f'listen = "127.0.0.1:0"\nworkers = 1\n[dns]\nnameservers = ["{dns.nameserver}"]\ninterval = 0.05\n'
    path.write_text(head + f'[[backends]]\naddress = "one.test:{port}"\n')
    async with LoadBalancer(load(path), config_path=path) as lb:
        assert names(lb) == {b0.address}
        path.write_text(head + f'[[backends]]\naddress = "one.test:{port}"\n[[backends]]\naddress = "two.test:{port}"\n')
        await lb.reload()
        assert names(lb) == {b0.address, b1.address}
        path.write_text(head + 'init_addr = "error"\n' + f'[[backends]]\naddress = "nope.test:{port}"\n')
        with pytest.raises(BalancerConfigError, match="does not resolve"):
            await lb.reload()
        assert names(lb) == {b0.address, b1.address}
        assert set(lb.stats()["dns"]) == {f"one.test:{port}", f"two.test:{port}"}


def test_cli_serves_names_and_refuses_an_unresolvable_one(dnsmasq, backends_on, tmp_path):
    port, listen, admin = free_port(), free_port(), free_port()
    backends_on(port, "127.0.0.2")
    dns = dnsmasq({"app.test": ["127.0.0.2"]})
    path = tmp_path / "balancer.toml"
    text = (f'listen = "127.0.0.1:{listen}"\nadmin = "127.0.0.1:{admin}"\nworkers = 1\n'
            f'[dns]\nnameservers = ["{dns.nameserver}"]\ninit_addr = "error"\n'
            f'[[backends]]\naddress = "{{name}}:{port}"\n')
    path.write_text(text.format(name="nope.test"))
    cmd = [sys.executable, "-m", "cli", "balancer", "--config", str(path), "--log-level", "WARNING"]
    r = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "nope.test" in r.stderr and "does not resolve" in r.stderr and "Traceback" not in r.stderr
    path.write_text(text.format(name="app.test"))
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(admin, 20, proc)
        assert get(listen) == (200, b"b0")
        metrics = get(admin, "/metrics")[1].decode()
        assert f'balancer_dns_addresses{{name="app.test:{port}"}} 1.0' in metrics
        assert f'balancer_dns_failures_total{{name="app.test:{port}"}} 0.0' in metrics
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def get_host(port: int, host: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/whoami", headers={"Host": host})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


async def test_named_pools_follow_dns_with_their_own_settings(dnsmasq, backends_on, tmp_path):
    """Servers of ``[backends.NAME]`` pools given by name (or SRV) are
    resolved like top-level ones; each address keeps its server's settings,
    a pool whose name does not resolve yet answers 503 while the others
    serve, and the pool's health checker follows the addresses."""
    port = free_port()
    b0, b1, b2 = backends_on(port, "127.0.0.2", "127.0.0.3", "127.0.0.4")
    dns = dnsmasq({"web.test": ["127.0.0.2"], "api.test": ["127.0.0.3"]})
    path = tmp_path / "balancer.toml"
    path.write_text(
        f'workers = 1\n'
        f'[dns]\nnameservers = ["{dns.nameserver}"]\ninterval = 0.05\n'
        f'[[listeners]]\naddress = "127.0.0.1:0"\ndefault_backend = "web"\n'
        f'[[listeners.routes]]\nhost = "api.example"\nbackend = "api"\n'
        f'[[listeners.routes]]\nhost = "later.example"\nbackend = "later"\n'
        f'[backends.web]\nservers = [{{ address = "web.test:{port}", weight = 7 }}]\n'
        f'[backends.api]\nservers = ["api.test:{port}"]\n'
        f'[backends.api.health]\npath = "/whoami"\ninterval = 0.05\nrise = 1\nfall = 1\n'
        f'[backends.later]\nservers = ["later.test:{port}"]\n')
    async with LoadBalancer(load(path), config_path=path) as lb:
        pools = {(b["pool"], b["name"]): b["weight"] for b in lb.backends()}
        assert pools == {("web", b0.address): 7, ("api", b1.address): 1}
        assert lb.backends()[0]["source"] in (f"web/web.test:{port}", f"api/api.test:{port}")
        assert await asyncio.to_thread(get_host, lb.address[1], "www.example") == (200, b"b0")
        assert await asyncio.to_thread(get_host, lb.address[1], "api.example") == (200, b"b1")
        assert (await asyncio.to_thread(get_host, lb.address[1], "later.example"))[0] == 503  # no address yet
        assert set(lb.stats()["dns"]) == {f"web/web.test:{port}", f"api/api.test:{port}",
                                          f"later/later.test:{port}"}
        dns.set_hosts({"web.test": ["127.0.0.2"], "api.test": ["127.0.0.4"], "later.test": ["127.0.0.3"]})
        await wait_until(lambda: {(b["pool"], b["name"]) for b in lb.backends()} == {
            ("web", b0.address), ("api", b2.address), ("later", b1.address)}, 10, what=lambda: str(lb.backends()))
        assert await asyncio.to_thread(get_host, lb.address[1], "later.example") == (200, b"b1")
        assert await asyncio.to_thread(get_host, lb.address[1], "api.example") == (200, b"b2")
        # the api pool's checker now checks the new address: its backend going away marks it down
        b2.kill()
        await wait_until(lambda: [b["healthy"] for b in lb.backends() if b["pool"] == "api"] == [False], 10,
                         what=lambda: str(lb.backends()))
