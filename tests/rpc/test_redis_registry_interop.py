"""Go rpcx and ours sharing a Redis registry, both directions: Go rpcx v1.9.1's
``serverplugin.RedisRegisterPlugin`` and rpcx-redis's ``RedisDiscovery``
(both over github.com/rpcxio/libkv v0.5.1; the Go peer in
``tests/rpc/interop/go-redis``) against our ``juggler rpc serve --redis`` and
``RedisDiscovery``: registration, calls, groups, metadata updates,
deregistration, TTL expiry and an operator's ``state=inactive`` seen by the
other side, and the raw keys and
values ours writes checked against those the Go plugin wrote. Without ``go``
the tests are skipped on a developer's machine and fail in CI (``CI=true``)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from rpc.discovery.libkv import KVPair, decode_pair, encode_pair
from rpc.discovery.redis import RedisDiscovery
from rpc.errors import NoServerAvailable
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.rpc.discovery.helpers import wait_servers
from tests.rpc.gopeer import GoServer, build_go_peer
from tests.rpc.test_rpcx_e2e import Served, serve


@pytest.fixture(scope="module")
def go_redis_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-redis", "the rpcx Redis interop peer")


def redis_addr(redis_url: str) -> str:
    """host:port, as libkv takes a Redis endpoint."""
    return urlsplit(redis_url).netloc



def go_server(peer: Path, redis_url: str, base: str, group: str = "", *, interval: str = "1s",
              metrics: bool = False) -> GoServer:
    """The Go peer serving Arith, registered by RedisRegisterPlugin (TTL: twice ``interval``)."""
    return GoServer(peer, redis_addr(redis_url), base, group,
                    env={"UPDATE_INTERVAL": interval, "METRICS": "1" if metrics else ""})


class GoClient:
    """The Go peer's XClient over rpcx-redis's discovery: it prints the servers
    the discovery reports at each change and answers ``call A B`` on stdin."""

    def __init__(self, peer: Path, redis_url: str, base: str, group: str = "") -> None:
        self.proc = subprocess.Popen([str(peer), "client", redis_addr(redis_url), base, *([group] if group else [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.servers: dict[str, str] | None = None  # the last ones reported
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _next(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"the Go client said nothing more in time (servers: {self.servers})") from None
        if line is None:
            assert self.proc.stderr is not None
            raise AssertionError(f"the Go client exited: {self.proc.stderr.read()}")
        if line.startswith("servers "):
            self.servers = json.loads(line.removeprefix("servers "))
        return line

    def until_servers(self, pred: Callable[[dict[str, str]], bool], timeout: float = 10.0) -> dict[str, str]:
        """Wait until the discovery reports servers satisfying ``pred``."""
        deadline = time.monotonic() + timeout
        while self.servers is None or not pred(self.servers):
            self._next(deadline)
        return self.servers

    def call(self, a: int, b: int, timeout: float = 10.0) -> str:
        """``reply {JSON}`` or ``error MESSAGE``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"call {a} {b}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            line = self._next(deadline)
            if line.startswith(("reply ", "error ")):
                return line

    def call_until(self, pred: Callable[[str], bool], timeout: float = 5.0) -> str:
        """Call until the answer satisfies ``pred``: the XClient takes a discovery
        change in on a goroutine of its own, after the discovery reported it."""
        deadline = time.monotonic() + timeout
        while not pred(answer := self.call(6, 7)):
            assert time.monotonic() < deadline, f"the Go XClient still answers {answer!r}"
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def base(request: pytest.FixtureRequest) -> str:
    return f"/rpcx-go-redis-{os.getpid()}-{request.node.name[-24:]}"


@pytest.fixture
def cleanup() -> Iterator[list[GoServer | GoClient | Served]]:
    started: list[GoServer | GoClient | Served] = []
    yield started
    for s in reversed(started):
        if isinstance(s, GoClient):
            s.close()
        else:
            s.stop()


async def test_our_xclient_calls_a_go_server_and_sees_it_deregister(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    go = go_server(go_redis_peer, redis_url, base)
    cleanup.append(go)
    # no periodic refresh to speak of: what is seen comes through the keyspace-notification watch
    discovery = RedisDiscovery(redis_url, "Arith", base=base, refresh_interval=60)
    caller = RpcxCaller()
    try:
        async with discovery, XClient("Arith", discovery, caller, options=XClientOptions()) as xc:
            assert discovery.servers() == {go.address: ""}
            assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            go.stop(signal.SIGTERM)  # Shutdown unregisters: the plugin deletes its key
            assert await wait_servers(discovery, lambda s: not s, timeout=2) == {}
            with pytest.raises(NoServerAvailable):
                await xc.call("Mul", {"A": 6, "B": 7}, timeout=1)
    finally:
        await caller.aclose()


async def test_a_killed_go_server_expires_from_our_discovery(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    go = go_server(go_redis_peer, redis_url, base, interval="500ms")  # TTL 1 s
    cleanup.append(go)
    async with RedisDiscovery(redis_url, "Arith", base=base, refresh_interval=60) as discovery:
        assert discovery.servers() == {go.address: ""}
        go.stop(signal.SIGKILL)  # no deregistration: only the TTL removes it
        assert await wait_servers(discovery, lambda s: not s, timeout=4) == {}


async def test_go_metadata_updates_and_groups_reach_our_xclient(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    """With a metrics registry the Go plugin rewrites the metadata at each
    update (calls=…&connections=…, keys sorted); our discovery follows and the
    group still routes."""
    go = go_server(go_redis_peer, redis_url, base, "canary", interval="300ms", metrics=True)
    cleanup.append(go)
    caller = RpcxCaller()
    try:
        async with RedisDiscovery(redis_url, "Arith", base=base, refresh_interval=60) as discovery:
            servers = await wait_servers(discovery, lambda s: "calls=" in s.get(go.address, ""), timeout=5)
            assert re.fullmatch(r"calls=[0-9.]+&connections=[0-9.]+&group=canary", servers[go.address])
            async with XClient("Arith", discovery, caller, options=XClientOptions(group="canary")) as xc:
                assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            async with XClient("Arith", discovery, caller, options=XClientOptions(group="stable")) as xc:
                assert xc.servers == {}
    finally:
        await caller.aclose()


def test_cli_calls_a_go_server_through_redis(go_redis_peer: Path, redis_url: str, base: str,
                                             cleanup: list[GoServer | GoClient | Served]) -> None:
    go = go_server(go_redis_peer, redis_url, base)
    cleanup.append(go)
    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", f"redis://{redis_addr(redis_url)}{base}",
                          "Arith.Mul", '{"A":6,"B":7}', "--timeout", "5"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"C": 42}


def test_go_xclient_calls_our_server_and_sees_it_deregister(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    ours = serve("--example", "arith", "--redis", redis_url, "--base", base)
    cleanup.append(ours)
    client = GoClient(go_redis_peer, redis_url, base)
    cleanup.append(client)
    assert client.until_servers(lambda s: bool(s)) == {ours.address: ""}
    assert client.call(6, 7) == 'reply {"C":42}'
    ours.signal(signal.SIGTERM)  # graceful: unregisters before it stops accepting
    assert ours.wait() == 0
    client.until_servers(lambda s: not s, timeout=2)
    assert client.call(6, 7).startswith("error ")


def test_go_xclient_sees_our_killed_server_expire(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    ours = serve("--example", "arith", "--redis", redis_url, "--base", base, "--ttl", "1")
    cleanup.append(ours)
    client = GoClient(go_redis_peer, redis_url, base)
    cleanup.append(client)
    client.until_servers(lambda s: ours.address in s)
    ours.stop()  # SIGKILL: no deregistration, the TTL ends it
    client.until_servers(lambda s: not s, timeout=4)


def test_go_xclient_keeps_to_its_group_among_our_servers(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    ours = serve("--example", "arith", "--redis", redis_url, "--base", base, "--group", "canary")
    cleanup.append(ours)
    canary = GoClient(go_redis_peer, redis_url, base, "canary")
    stable = GoClient(go_redis_peer, redis_url, base, "stable")
    cleanup += [canary, stable]
    assert canary.until_servers(bool) == {ours.address: "group=canary"}
    assert canary.call(6, 7) == 'reply {"C":42}'
    stable.until_servers(bool)
    assert stable.call(6, 7).startswith("error ")  # rpcx's XClient filtered it out: no server of its group


def test_our_keys_and_values_are_the_go_plugins(go_redis_peer: Path, redis_url: str, base: str,
                                                cleanup: list[GoServer | GoClient | Served]) -> None:
    """Under one base, the Go plugin registers Arith with group=canary, then
    ``juggler rpc serve --group canary`` does: the directories each wrote and
    the two server entries are the same bytes but for the address and
    libkv's LastIndex, with the same kind of TTL."""
    r = redis.Redis.from_url(redis_url)
    try:
        go = go_server(go_redis_peer, redis_url, base, "canary", interval="5s")  # TTL 10 s
        cleanup.append(go)
        dirs = [f"/{base}", f"/{base}/Arith"]
        go_dirs = r.mget(dirs)
        ours = serve("--example", "arith", "--redis", redis_url, "--base", base, "--group", "canary", "--ttl", "10")
        cleanup.append(ours)
        our_dirs = r.mget(dirs)
        keys = {k.decode() for k in r.scan_iter(match=f"/{base}*")}
        go_key, our_key = f"/{base}/Arith/{go.address}", f"/{base}/Arith/{ours.address}"
        assert keys == {*dirs, go_key, our_key}

        def shape(raw: bytes | None, address: str = "ADDR") -> str:
            assert raw is not None
            return re.sub(r'"LastIndex":[0-9]+}$', '"LastIndex":N}', raw.decode()).replace(address, "ADDR")

        assert [shape(v) for v in our_dirs] == [shape(v) for v in go_dirs]
        assert [decode_pair(v).value for v in our_dirs if v is not None] == [b"rpcx_path", b"Arith"]
        assert shape(r.get(our_key), ours.address) == shape(r.get(go_key), go.address)
        assert decode_pair(r.get(our_key)).value == b"group=canary"  # type: ignore[arg-type]
        assert shape(r.get(go_key), go.address) == (
            f'{{"Key":"{base}/Arith/ADDR","Value":"Z3JvdXA9Y2FuYXJ5","LastIndex":N}}')
        for key in (go_key, our_key):
            assert 5000 < r.pttl(key) <= 10000
        for key in dirs:
            assert r.pttl(key) == -1  # no TTL, whoever wrote them last
    finally:
        r.close()


def mark_inactive(r: redis.Redis, key: str) -> None:
    """What an operator does to take a server out of rotation: its metadata
    becomes ``state=inactive``, the TTL left as it is."""
    pair = decode_pair(r.get(key))  # type: ignore[arg-type]
    r.set(key, encode_pair(KVPair(key=pair.key, value=b"state=inactive", last_index=pair.last_index)), keepttl=True)


def test_a_server_of_ours_marked_inactive_in_redis_leaves_the_go_xclient(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    ours = serve("--example", "arith", "--redis", redis_url, "--base", base, "--ttl", "2")
    cleanup.append(ours)
    client = GoClient(go_redis_peer, redis_url, base)
    cleanup.append(client)
    client.until_servers(lambda s: ours.address in s)
    r = redis.Redis.from_url(redis_url)
    try:
        key = f"/{base}/Arith/{ours.address}"
        mark_inactive(r, key)
        client.until_servers(lambda s: s == {ours.address: "state=inactive"})
        client.call_until(lambda answer: answer.startswith("error "))  # rpcx's XClient dropped it
        time.sleep(2.5)  # past the 2 s TTL: only our heartbeats kept the entry, with the operator's edit
        assert decode_pair(r.get(key)).value == b"state=inactive"  # type: ignore[arg-type]
    finally:
        r.close()


async def test_a_go_server_marked_inactive_in_redis_leaves_our_xclient(
        go_redis_peer: Path, redis_url: str, base: str, cleanup: list[GoServer | GoClient | Served]) -> None:
    go = go_server(go_redis_peer, redis_url, base, interval="300ms")
    cleanup.append(go)
    r = redis.Redis.from_url(redis_url)
    caller = RpcxCaller()
    try:
        async with RedisDiscovery(redis_url, "Arith", base=base, refresh_interval=60) as discovery, \
                XClient("Arith", discovery, caller, options=XClientOptions()) as xc:
            assert xc.servers == {go.address: ""}
            mark_inactive(r, f"/{base}/Arith/{go.address}")
            await wait_servers(discovery, lambda s: s == {go.address: "state=inactive"}, timeout=2)
            assert xc.servers == {}
            await asyncio.sleep(1.0)  # past the Go plugin's 600 ms TTL: its updates kept the edit
            assert discovery.servers() == {go.address: "state=inactive"} and xc.servers == {}
    finally:
        await caller.aclose()
        r.close()
