"""The Python control plane: config files, health checks, admin API, reload, CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests.netutil import free_port, wait_for_port

import rustext

from balancer import BalancerConfig, BalancerConfigError, HealthCheck, LoadBalancer, load
from balancer.runner import BalancerProcess
from balancer.config import BackendConfig, from_dict, parse_backends

GOOD = """
listen = "127.0.0.1:{port}"
admin = "127.0.0.1:{admin}"
workers = 2
algorithm = "{algorithm}"
retries = 2

[timeouts]
connect = 1.0
response = 10.0

[passive]
eject_after = 2
cooldown = 5.0

[limits]
max_connections = 100

[[backends]]
address = "{b0}"
weight = 2

[[backends]]
address = "{b1}"
"""


def write(tmp_path, text: str) -> str:
    p = tmp_path / "balancer.toml"
    p.write_text(text)
    return str(p)


def test_config_file_round_trip(tmp_path):
    cfg = load(write(tmp_path, GOOD.format(port=8080, admin=9090, algorithm="wrr", b0="127.0.0.1:1", b1="127.0.0.1:2")))
    assert cfg.algorithm == "weighted_round_robin"
    assert cfg.backends[0] == BackendConfig(address="127.0.0.1:1", weight=2)
    assert cfg.timeouts.connect == 1.0 and cfg.passive.eject_after == 2
    (pool,) = cfg.backend_pools()  # what the data plane reads
    assert pool.name == "default" and pool.config.backends == cfg.backends
    assert pool.config.limits.max_connections == 100


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('listen = "x"', "HOST:PORT"),
        ('backends = []', "'listen' is required"),
        ('listen = "127.0.0.1:1"\nalgorithm = "fastest"', "algorithm must be one of"),
        ('listen = "127.0.0.1:1"\nworkers = 0', "workers"),
        ('listen = "127.0.0.1:1"\nbogus = 1', "unknown top-level"),
        ('listen = "127.0.0.1:1"\nnap_us = 60', "unknown top-level key(s): nap_us"),
        ('listen = "127.0.0.1:1"\nworkers = true', "workers: expected an integer, got True"),
        ('listen = "127.0.0.1:1"\nworkers = "two"', "workers: expected an integer, got 'two'"),
        ('listen = "127.0.0.1:1"\n[timeouts]\nconect = 1', "unknown key(s) in [timeouts]"),
        ('listen = "127.0.0.1:1"\n[[backends]]\naddress = "a:1"\nweight = -1', "weight"),
        ('listen = "127.0.0.1:1"\nbackends = ["a:1", "a:1"]', "listed twice"),
        ('listen = "127.0.0.1:1"\n[health]\npath = "x"', "health.path"),
        ('listen = "127.0.0.1:1"\nhash_key = "cookie"', "hash_key"),
        ("listen = [", "invalid TOML"),
    ],
)
def test_invalid_config_files_are_rejected_clearly(tmp_path, text, message):
    with pytest.raises(BalancerConfigError) as exc:
        load(write(tmp_path, text))
    assert message in str(exc.value)
    assert str(tmp_path) in str(exc.value)


def test_parse_backends_flag():
    assert parse_backends("127.0.0.1:1=3, 127.0.0.1:2") == [
        BackendConfig(address="127.0.0.1:1", weight=3), BackendConfig(address="127.0.0.1:2")
    ]
    with pytest.raises(BalancerConfigError):
        parse_backends("127.0.0.1:1=x")
    assert from_dict({"listen": "127.0.0.1:1", "backends": ["127.0.0.1:2"]}).backends[0].weight == 1


def http_get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


async def aget(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    return await asyncio.to_thread(http_get, port, path, method)


async def wait_for(cond, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def test_active_health_checks_mark_down_and_up(backends):
    b = backends(2)
    cfg = BalancerConfig(
        listen="127.0.0.1:0", workers=1,
        backends=(BackendConfig(address=b[0].address), BackendConfig(address=b[1].address)),
        health=HealthCheck(path="/health", interval=0.05, timeout=1.0, rise=2, fall=2),
    )
    async with LoadBalancer(cfg) as lb:
        port = lb.address[1]
        assert await aget(b[1].port, "/sick") == (200, b"ok")
        await wait_for(lambda: {x["name"]: x["state"] for x in lb.backends()}[b[1].address] == "down")
        for _ in range(6):
            assert await aget(port, "/whoami") == (200, b"b0")
        b[1].kill()
        b[0].kill()
        await wait_for(lambda: all(x["state"] == "down" for x in lb.backends()))
        assert (await aget(port, "/whoami"))[0] == 503


async def test_marked_down_by_errors_until_the_health_check_passes(backends):
    """passive.on_error = "mark-down" (HAProxy's observe layer7 + on-error mark-down): three 500s in
    a row take the server out, and its health check, passing `rise` times, brings it back (the
    hour-long cooldown plays no part)."""
    b = backends(2)
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [b[0].address, b[1].address],
                     "retry_on": [], "health": {"path": "/health", "interval": 0.05, "timeout": 1.0, "rise": 2,
                                                "fall": 2},
                     "passive": {"observe": "layer7", "eject_after": 3, "cooldown": 3600, "on_error": "mark-down"}})
    async with LoadBalancer(cfg) as lb:
        port = lb.address[1]
        assert await aget(b[0].port, "/fail", "POST") == (200, b"ok")
        got = [await aget(port, "/whoami") for _ in range(10)]
        assert [s for s, _ in got].count(500) == 3 and got[-4:] == [(200, b"b1")] * 4

        def state() -> dict[str, object]:
            return {x["name"]: x for x in lb.backends()}[b[0].address]

        assert state()["ejections"] == 1
        await wait_for(lambda: state()["state"] == "up")  # the health check passed twice
        assert not lb._native.backend_ejected(b[0].address)
        assert {(await aget(port, "/whoami"))[0] for _ in range(4)} == {200, 500}  # b0 serves again


async def test_admin_api(backends):
    b = backends(2)
    admin = free_port()
    cfg = BalancerConfig(listen="127.0.0.1:0", workers=1, admin=f"127.0.0.1:{admin}",
                         backends=(BackendConfig(address=b[0].address), BackendConfig(address=b[1].address)))
    async with BalancerProcess(cfg) as process:
        lb = process.lb
        port = lb.address[1]
        for _ in range(4):
            assert (await aget(port, "/whoami"))[0] == 200
        status, body = await aget(admin, "/backends")
        assert status == 200 and [x["requests"] for x in json.loads(body)] == [2, 2]
        status, body = await aget(admin, "/metrics")
        text = body.decode()
        assert status == 200
        assert "balancer_requests_total 4" in text
        assert 'balancer_responses_total{class="2xx"} 4' in text
        assert f'balancer_backend_state{{backend="{b[0].address}",pool="default",state="up"}} 1' in text
        assert 'balancer_request_duration_seconds_bucket{le="+Inf"} 4' in text
        assert (await aget(admin, f"/backends/{b[0].address}/drain", "POST"))[0] == 200
        assert {(await aget(port, "/whoami"))[1] for _ in range(4)} == {b"b1"}
        assert (await aget(admin, f"/backends/{b[0].address}/up", "POST"))[0] == 200
        assert (await aget(admin, f"/backends/{b[1].address}/weight?w=0", "POST"))[0] == 200
        assert {(await aget(port, "/whoami"))[1] for _ in range(4)} == {b"b0"}
        assert (await aget(admin, "/backends/127.0.0.1:1/drain", "POST"))[0] == 404
        assert (await aget(admin, "/stats"))[0] == 200
        assert (await aget(admin, "/reload", "POST"))[0] == 400  # no file to reload
        assert (await aget(admin, "/nope"))[0] == 404


async def test_reload_file_under_load_and_invalid_reload_keeps_old(tmp_path, backends):
    b = backends(3)
    admin = free_port()
    path = write(tmp_path, GOOD.format(port=0, admin=admin, algorithm="round_robin", b0=b[0].address, b1=b[1].address))
    async with BalancerProcess(load(path), config_path=path) as process:
        lb = process.lb
        port = lb.address[1]
        stop = asyncio.Event()
        errors: list[object] = []
        seen: set[bytes] = set()

        def client() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            while not stop.is_set():
                try:
                    c.request("GET", "/whoami")
                    r = c.getresponse()
                    body = r.read()
                    if r.status != 200:
                        errors.append(r.status)
                    seen.add(body)
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(exc)
                    return
            c.close()

        tasks = [asyncio.create_task(asyncio.to_thread(client)) for _ in range(4)]
        for i in range(6):
            b0, b1 = (b[0], b[2]) if i % 2 == 0 else (b[1], b[2])
            with open(path, "w") as f:
                f.write(GOOD.format(port=0, admin=admin, algorithm="least_connections", b0=b0.address, b1=b1.address))
            await lb.reload()
            await asyncio.sleep(0.05)
        with open(path, "w") as f:
            f.write("listen = [broken")
        with pytest.raises(BalancerConfigError):
            await lb.reload()
        status, body = await aget(admin, "/reload", "POST")
        assert status == 400 and b"invalid TOML" in body
        stop.set()
        await asyncio.gather(*tasks)
        assert errors == []
        assert b"b2" in seen
        assert lb.config.algorithm == "least_connections"
        assert lb.stats()["algorithm"] == "least_connections"


def test_cli_serves_reloads_on_sighup_and_exits_on_sigterm(tmp_path, backends):
    b = backends(2)
    port, admin = free_port(), free_port()
    path = write(tmp_path, GOOD.format(port=port, admin=admin, algorithm="round_robin", b0=b[0].address, b1=b[1].address))
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", path, "--log-level", "WARNING"],
                            cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(admin, 20, proc)  # the admin endpoint opens once the data plane listens
        assert http_get(admin, "/healthz")[0] == 200
        assert {http_get(port, "/whoami")[1] for _ in range(4)} == {b"b0", b"b1"}
        with open(path, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\nadmin = "127.0.0.1:{admin}"\nworkers = 2\n'
                    f'backends = ["{b[1].address}"]\n')
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while {x["name"] for x in json.loads(http_get(admin, "/backends")[1])} != {b[1].address}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert {http_get(port, "/whoami")[1] for _ in range(4)} == {b"b1"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_cli_rejects_bad_flags():
    from cli.main import main

    assert main(["balancer", "--listen", "127.0.0.1:0"]) == 2
    assert main(["balancer", "--listen", "127.0.0.1:0", "--backends", "127.0.0.1:1", "--algorithm", "x"]) == 2


def test_cli_flags_without_config_file(backends):
    b = backends(2)
    port, admin = free_port(), free_port()
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "balancer", "--listen", f"127.0.0.1:{port}",
         "--backends", f"{b[0].address}=3,{b[1].address}", "--algorithm", "wrr", "--workers", "2",
         "--metrics-port", str(admin), "--health-path", "/health", "--log-level", "WARNING"],
        cwd=root, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for_port(admin, 20, proc)  # the admin endpoint opens once the data plane listens
        assert http_get(admin, "/healthz")[0] == 200
        got = [http_get(port, "/whoami")[1] for _ in range(8)]
        assert got.count(b"b0") == 6 and got.count(b"b1") == 2
        backends_json = json.loads(http_get(admin, "/backends")[1])
        assert [x["weight"] for x in backends_json] == [3, 1]
        assert b"balancer_requests_total 8" in http_get(admin, "/metrics")[1]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_cli_listen_port_only_means_all_interfaces():
    from cli.balancer import build_config
    from cli.main import build_parser

    args = build_parser().parse_args(["balancer", "--listen", ":8080", "--backends", "127.0.0.1:1=2"])
    cfg = build_config(args)
    assert cfg.listen == "0.0.0.0:8080" and cfg.backends[0].weight == 2




def pool_states(lb: LoadBalancer) -> dict[str, str]:
    return {x["pool"]: x["state"] for x in lb.backends()}


@pytest.mark.parametrize("server", ["tcp", "unix"])
async def test_health_checks_expect_a_status_and_a_body(backends, tmp_path, server):
    """expect_status / expect_body (HAProxy's http-check expect status / string): the backend's
    /health answers 200 "ok". Expecting "ok" keeps it up; expecting another text or status takes it
    down. Over aiohttp for TCP servers, over the raw connection for Unix-socket ones."""
    from balancer_helpers import start_unix_backend

    if server == "tcp":
        (b,) = backends(1)
        address, proc = b.address, None
    else:
        sock = tmp_path / "b.sock"
        proc = start_unix_backend("u0", str(sock))
        address = f"unix:{sock}"
    health = {"path": "/health", "interval": 0.05, "timeout": 1.0, "rise": 1, "fall": 2}
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "default_backend": "body_ok", "health": health,
                     "backends": {"body_ok": {"servers": [address], "health": {"expect_body": "ok",
                                                                                "expect_status": [200, 204]}},
                                  "body_missing": {"servers": [address], "health": {"expect_body": "READY"}},
                                  "status_other": {"servers": [address], "health": {"expect_status": [204]}}}})
    try:
        async with LoadBalancer(cfg) as lb:
            await wait_for(lambda: pool_states(lb)["body_missing"] == "down")
            await wait_for(lambda: pool_states(lb)["status_other"] == "down")
            await asyncio.sleep(0.3)  # several more checks of each pool
            assert pool_states(lb) == {"body_ok": "up", "body_missing": "down", "status_other": "down"}
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
            assert proc.stdout is not None
            proc.stdout.close()


async def test_health_checks_on_another_port(backends):
    """health.port (HAProxy's check port): the checks of b0 go to b1's port, so b1 turning sick
    takes b0 down although b0 itself is well; requests then get 503."""
    b0, b1 = backends(2)
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [b0.address],
                     "health": {"path": "/health", "interval": 0.05, "timeout": 1.0, "rise": 1, "fall": 2,
                                "port": b1.port}})
    async with LoadBalancer(cfg) as lb:
        port = lb.address[1]
        assert await aget(port, "/whoami") == (200, b"b0")
        assert await aget(b1.port, "/sick") == (200, b"ok")
        await wait_for(lambda: lb.backends()[0]["state"] == "down")
        assert (await aget(port, "/whoami"))[0] == 503
        assert await aget(b0.port, "/health") == (200, b"ok")  # the server itself is well


@pytest.mark.parametrize(("health", "words"), [
    ({"port": 0}, ["health.port", "1..65535"]),
    ({"port": "8080"}, ["health.port"]),
    ({"expect_status": []}, ["health.expect_status", "list of HTTP statuses"]),
    ({"expect_status": [200, 999]}, ["health.expect_status"]),
    ({"expect_body": ""}, ["health.expect_body"]),
    ({"type": "grpc", "expect_status": [200]}, ["expect_status", "SERVING"]),
])
def test_health_expectation_errors(health, words):
    with pytest.raises(BalancerConfigError) as e:
        from_dict({"listen": "127.0.0.1:0", "proto": "h2", "backends": ["127.0.0.1:1"], "health": health})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_health_port_is_refused_for_unix_servers_and_expectations_are_not_inherited_by_grpc():
    with pytest.raises(BalancerConfigError, match="health.port does not apply to servers on a Unix socket"):
        from_dict({"listen": "127.0.0.1:0", "backends": {"u": {"servers": ["unix:/tmp/x.sock"]}},
                   "health": {"port": 8081}})
    cfg = from_dict({"listen": "127.0.0.1:0", "health": {"path": "/health", "expect_body": "ok"},
                     "backends": {"web": {"servers": ["127.0.0.1:1"]},
                                  "api": {"servers": ["127.0.0.1:2"], "proto": "h2", "health": {"type": "grpc"}}}})
    assert cfg.pools()["web"].health.expect_body == "ok" and cfg.pools()["api"].health.expect_body is None


async def test_health_check_method(tmp_path):
    """health.method (HAProxy's http-check send meth): the checks' request line says it, over
    aiohttp (TCP) and the raw probe (a Unix socket); a HEAD answered 200 keeps the server up."""
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines.append(head.split(b"\r\n", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    tcp = await asyncio.start_server(serve, "127.0.0.1", 0)
    sock = str(tmp_path / "h.sock")
    unix = await asyncio.start_unix_server(serve, sock)
    port = tcp.sockets[0].getsockname()[1]
    health = {"path": "/ping", "interval": 0.05, "timeout": 1.0, "rise": 1, "fall": 1}
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "default_backend": "tcp",
                     "backends": {"tcp": {"servers": [f"127.0.0.1:{port}"], "health": {**health, "method": "HEAD"}},
                                  "unix": {"servers": [f"unix:{sock}"], "health": {**health, "method": "OPTIONS"}}}})
    try:
        async with LoadBalancer(cfg) as lb:
            await wait_for(lambda: b"HEAD /ping HTTP/1.1" in lines and b"OPTIONS /ping HTTP/1.1" in lines)
            assert set(lines) == {b"HEAD /ping HTTP/1.1", b"OPTIONS /ping HTTP/1.1"}, lines
            assert {x["pool"]: x["state"] for x in lb.backends()} == {"tcp": "up", "unix": "up"}
    finally:
        tcp.close()
        unix.close()
    for bad, words in (({"method": "POST"}, "health.method must be GET, HEAD or OPTIONS"),
                       ({"method": "HEAD", "expect_body": "ok"}, "not HEAD")):
        with pytest.raises(BalancerConfigError, match=words):
            from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "health": bad})
