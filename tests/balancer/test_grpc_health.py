"""Active health checks of HTTP/2 and gRPC pools (balancer/health.py): the
gRPC health checking protocol against real grpcio servers behind the
balancer, HTTP checks spoken in HTTP/2 (h2c and TLS), and the config rules."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from balancer import BalancerConfigError, LoadBalancer
from balancer.config import from_dict
from balancer.health import health_request, serving_status
from tests.balancer.balancer_helpers import BackendProc, start_backend
from tests.netutil import free_port, wait_until
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(60)]

GRPC_BACKEND = str(Path(__file__).with_name("grpc_backend.py"))
NOT_SERVING, SERVING = 2, 1
FAST = {"interval": 0.05, "timeout": 1.0, "rise": 2, "fall": 2}


@dataclass(kw_only=True)
class Backend(BackendProc):
    ca: bytes | None = None  # served over TLS, with a certificate from this CA

    def channel(self) -> grpc.Channel:
        if self.ca is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, grpc.ssl_channel_credentials(root_certificates=self.ca),
                                   options=(("grpc.ssl_target_name_override", "localhost"),))

    def set_health(self, status: int, service: str = "") -> None:
        """What its health service answers about ``service`` from now on."""
        with self.channel() as ch:
            ch.unary_unary("/test.Echo/SetHealth")(f"{service}={status}".encode(), timeout=5)

    def health_checks(self) -> tuple[int, int]:
        """(checks answered, client connections they came on)."""
        with self.channel() as ch:
            checks, conns = ch.unary_unary("/test.Echo/HealthChecks")(b"", timeout=5).split(b",")
        return int(checks), int(conns)



@pytest.fixture
def grpc_backend() -> Iterator:
    """``grpc_backend(name, health=True, tls=None, ca=None)``: a grpcio
    server (tests/balancer/grpc_backend.py), over TLS with ``tls`` = (cert,
    key) from the CA ``ca`` (PEM); killed after the test."""
    started: list[Backend] = []

    def start(name: str, health: bool = True, tls: tuple[str, str] | None = None, ca: bytes | None = None) -> Backend:
        port = free_port()
        env = {**os.environ, **({} if health else {"GRPC_HEALTH": "off"})}
        proc = subprocess.Popen([sys.executable, GRPC_BACKEND, str(port), name, *(tls or ())],
                                stdout=subprocess.PIPE, env=env)
        b = Backend(name, port, proc, ca=ca)
        started.append(b)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"grpc backend {name} did not start")
        return b

    yield start
    for b in started:
        b.kill()


def pool(backends: list[str], proto: str = "h2", **health: object) -> dict:
    return {"listen": "127.0.0.1:0", "workers": 1, "proto": proto, "backends": backends,
            "health": {**FAST, **health}}


def healthy(lb: LoadBalancer) -> dict[str, bool]:
    return {b["name"]: b["healthy"] for b in lb.backends()}


async def become(lb: LoadBalancer, want: dict[str, bool]) -> None:
    """Wait (bounded) until the named backends' health is ``want``."""
    await wait_until(lambda: all(healthy(lb)[k] == v for k, v in want.items()), 10,
                     what=lambda: f"backends {healthy(lb)}, wanted {want}")


def calls(port: int, n: int) -> Counter[str]:
    """``n`` unary calls through the balancer: which backend answered each."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return Counter(ch.unary_unary("/test.Echo/Unary")(b"x", timeout=5).split(b":")[0].decode()
                       for _ in range(n))


async def test_not_serving_is_down_and_gets_no_calls_until_serving_again(grpc_backend):
    a, b = grpc_backend("a"), grpc_backend("b")
    async with LoadBalancer(from_dict(pool([a.address, b.address], type="grpc"))) as lb:
        port = lb.address[1]
        assert await asyncio.to_thread(calls, port, 4) == {"a": 2, "b": 2}
        await asyncio.to_thread(b.set_health, NOT_SERVING)
        await become(lb, {a.address: True, b.address: False})
        assert await asyncio.to_thread(calls, port, 6) == {"a": 6}
        await asyncio.to_thread(b.set_health, SERVING)
        await become(lb, {b.address: True})
        assert await asyncio.to_thread(calls, port, 4) == {"a": 2, "b": 2}
        b.kill()  # the kept connection breaks, new ones are refused
        await become(lb, {a.address: True, b.address: False})
        assert await asyncio.to_thread(calls, port, 3) == {"a": 3}


async def test_one_connection_per_backend_is_kept_between_checks(grpc_backend):
    a = grpc_backend("a")
    async with LoadBalancer(from_dict(pool([a.address], type="grpc"))) as lb:
        await wait_until(lambda: asyncio.to_thread(lambda: a.health_checks()[0] >= 5), 10, interval=0.05)
        assert (await asyncio.to_thread(a.health_checks))[1] == 1
        assert healthy(lb)[a.address]


async def test_a_server_without_the_health_service_is_down(grpc_backend):
    with_health, without = grpc_backend("with"), grpc_backend("without", health=False)
    async with LoadBalancer(from_dict(pool([with_health.address, without.address], type="grpc"))) as lb:
        await become(lb, {without.address: False})
        assert healthy(lb)[with_health.address]
        assert await asyncio.to_thread(calls, lb.address[1], 3) == {"with": 3}


async def test_grpc_service_names_the_service_asked_about(grpc_backend):
    a, b = grpc_backend("a"), grpc_backend("b")
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "proto": "h2",
                     "backends": {"echo": {"servers": [a.address, b.address],
                                           "health": {**FAST, "type": "grpc", "grpc_service": "test.Echo"}},
                                  "other": {"servers": [a.address],
                                            "health": {**FAST, "type": "grpc", "grpc_service": "no.Such"}}}})
    async with LoadBalancer(cfg) as lb:
        def state(p: str) -> dict[str, bool]:
            return {x["name"]: x["healthy"] for x in lb.backends() if x["pool"] == p}

        # the whole server NOT_SERVING does not matter: test.Echo is asked about
        await asyncio.to_thread(a.set_health, NOT_SERVING)
        await asyncio.to_thread(b.set_health, NOT_SERVING, "test.Echo")
        await wait_until(lambda: state("echo") == {a.address: True, b.address: False}, 10,
                         what=lambda: str(state("echo")))
        # a service the server does not know (NOT_FOUND) is a failure
        await wait_until(lambda: state("other") == {a.address: False}, 10, what=lambda: str(state("other")))


async def test_a_server_that_never_answers_is_down(grpc_backend):
    """Connections accepted, nothing ever answered: each check times out."""
    silent_conns: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent_conns.append(writer)
        await reader.read()  # until the check gives up and closes

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        async with LoadBalancer(from_dict(pool([address], type="grpc", timeout=0.2))) as lb:
            await become(lb, {address: False})
            assert silent_conns  # the checks did connect: it is the silence that failed them
    finally:
        silent.close()
        for w in silent_conns:
            w.close()
        await silent.wait_closed()


async def test_a_reload_to_grpc_checks_over_h2_brings_a_grpc_server_up(grpc_backend):
    """HTTP/1 checks of a gRPC server fail (it answers no HTTP/1); the
    reload changing the pool to h2 and gRPC checks starts the checks over."""
    a = grpc_backend("a")
    async with LoadBalancer(from_dict(pool([a.address], proto="h1"))) as lb:
        await become(lb, {a.address: False})
        await lb.reload(from_dict(pool([a.address], type="grpc")))
        await become(lb, {a.address: True})
        assert await asyncio.to_thread(calls, lb.address[1], 2) == {"a": 2}


async def test_grpc_checks_over_tls_to_backends(grpc_backend, pki, tmp_path):
    leaf = pki.leaf("localhost", "127.0.0.1")
    good = grpc_backend("good", tls=(str(leaf.cert), str(leaf.key)), ca=pki.ca.read_bytes())
    plain = grpc_backend("plain")  # no TLS: its checks fail the handshake
    cfg = pool([good.address, plain.address], type="grpc")
    async def answered_checks(more: int = 3) -> None:
        """Wait until ``good`` has answered ``more`` checks (over TLS: it serves nothing else)."""
        n = (await asyncio.to_thread(good.health_checks))[0]
        await wait_until(lambda: asyncio.to_thread(lambda: good.health_checks()[0] >= n + more), 10, interval=0.05)

    async with LoadBalancer(from_dict({**cfg, "tls": {"backend": True, "backend_ca": str(pki.ca)}})) as lb:
        await answered_checks()
        await become(lb, {good.address: True, plain.address: False})
        with grpc.insecure_channel(f"127.0.0.1:{lb.address[1]}") as ch:
            assert ch.unary_unary("/test.Echo/Unary")(b"x", timeout=5) == b"good:x"
    # against another CA, verification fails; backend_insecure skips it, as for the requests
    other = TestPKI(tmp_path)
    async with LoadBalancer(from_dict({**cfg, "tls": {"backend": True, "backend_ca": str(other.ca)}})) as lb:
        await become(lb, {good.address: False})
    async with LoadBalancer(from_dict({**cfg, "tls": {"backend": True, "backend_insecure": True}})) as lb:
        await answered_checks()
        await become(lb, {good.address: True, plain.address: False})


async def test_http_checks_of_an_h2_pool_speak_http2(tmp_path):
    """The backend is a second balancer (it accepts h2c, found by its
    preface) in front of an HTTP/1 server whose /health can turn 503."""
    origin = start_backend("origin")
    try:
        async with LoadBalancer(from_dict({"listen": "127.0.0.1:0", "workers": 1,
                                           "backends": [origin.address]})) as inner:
            h2_backend = f"127.0.0.1:{inner.address[1]}"
            cfg = pool([h2_backend], type="http", path="/health")
            async with LoadBalancer(from_dict(cfg)) as lb:
                await wait_until(lambda: inner.stats()["requests"] >= 2, 10, what="no check reached the backend")
                assert healthy(lb)[h2_backend]
                await asyncio.to_thread(subprocess.run, ["curl", "-s", "-X", "POST", "--max-time", "5",
                                                         f"http://{origin.address}/sick"], check=True)
                await become(lb, {h2_backend: False})
    finally:
        origin.kill()


async def test_http_checks_of_an_h2_pool_expect_a_body():
    """expect_body over HTTP/2: the origin's /health says "ok"; a pool expecting "ok" stays up,
    one expecting "READY" goes down."""
    origin = start_backend("origin")
    try:
        async with LoadBalancer(from_dict({"listen": "127.0.0.1:0", "workers": 1,
                                           "backends": [origin.address]})) as inner:
            h2_backend = f"127.0.0.1:{inner.address[1]}"
            async with LoadBalancer(from_dict(pool([h2_backend], type="http", path="/health",
                                                   expect_body="READY"))) as lb:
                await become(lb, {h2_backend: False})
            async with LoadBalancer(from_dict(pool([h2_backend], type="http", path="/health",
                                                   expect_body="ok", expect_status=[200]))) as lb:
                checks = inner.stats()["requests"]
                await wait_until(lambda: inner.stats()["requests"] >= checks + 3, 10, what="no checks")
                assert healthy(lb)[h2_backend]
    finally:
        origin.kill()


def test_health_messages_round_trip():
    assert health_request("") == b"\x00\x00\x00\x00\x00"
    assert health_request("a.B") == b"\x00\x00\x00\x00\x05\x0a\x03a.B"
    assert serving_status(b"\x00\x00\x00\x00\x02\x08\x01") == SERVING
    assert serving_status(b"\x00\x00\x00\x00\x00") == 0  # proto3 leaves UNKNOWN out
    # unknown fields are skipped, the last status wins
    assert serving_status(b"\x00\x00\x00\x00\x07\x12\x01z\x08\x02\x08\x01") == SERVING
    for bad in (b"", b"\x01\x00\x00\x00\x00", b"\x00\x00\x00\x00\x05\x08", b"\x00\x00\x00\x00\x02\x12\x05"):
        with pytest.raises(ValueError):
            serving_status(bad)


@pytest.mark.parametrize(("data", "words"), [
    (pool(["127.0.0.1:1"], proto="h1", type="grpc"), ["health.type", "proto = \"h2\""]),
    (pool(["127.0.0.1:1"], type="grpc", path="/health"), ["health.path", "grpc_service"]),
    (pool(["127.0.0.1:1"], type="http", grpc_service="x"), ["health.grpc_service", "type = \"grpc\""]),
    (pool(["127.0.0.1:1"], type="tcp"), ["health.type", "tcp"]),
    ({"listen": "127.0.0.1:0", "backends": {"api": {"servers": ["127.0.0.1:1"], "health": {"type": "grpc"}}}},
     ["backends.api", "proto = \"h2\""]),
])
def test_config_errors(data, words):
    with pytest.raises(BalancerConfigError) as e:
        from_dict(data)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_pool_switching_to_grpc_does_not_inherit_the_http_path():
    cfg = from_dict({"listen": "127.0.0.1:0", "health": {"path": "/health"},
                     "backends": {"web": {"servers": ["127.0.0.1:1"]},
                                  "api": {"servers": ["127.0.0.1:2"], "proto": "h2", "health": {"type": "grpc"}}}})
    pools = cfg.pools()
    assert (pools["web"].health.type, pools["web"].health.path) == ("http", "/health")
    assert (pools["api"].health.type, pools["api"].health.path) == ("grpc", "/")


async def test_http_checks_go_over_tls_when_the_requests_do(pki):
    """h1 pools too: a check in clear would fail against an HTTPS-only server."""
    leaf = pki.leaf("localhost", "127.0.0.1")
    origin = start_backend("origin", tls=(str(leaf.cert), str(leaf.key)))

    def origin_health() -> bytes:
        return subprocess.run(["curl", "-s", "--max-time", "5", "--cacert", str(pki.ca),
                               f"https://{origin.address}/health"], check=True, capture_output=True).stdout

    try:
        # the check's path is /sick: a check that reached the server (over TLS) leaves it sick, and succeeds
        cfg = {**pool([origin.address], proto="h1", path="/sick"), "tls": {"backend": True, "backend_ca": str(pki.ca)}}
        async with LoadBalancer(from_dict(cfg)) as lb:
            await wait_until(lambda: asyncio.to_thread(lambda: origin_health() == b"sick"), 10, interval=0.05)
            assert healthy(lb)[origin.address]
    finally:
        origin.kill()


@given(st.binary(max_size=64))
def test_any_response_body_is_a_status_or_a_value_error(body: bytes) -> None:
    framed = b"\x00" + len(body).to_bytes(4, "big") + body
    for data in (body, framed):
        try:
            assert isinstance(serving_status(data), int)
        except ValueError:
            pass
