"""The ZooKeeper registry against Go rpcx's own: github.com/rpcxio/rpcx-zookeeper
(ZooKeeperRegisterPlugin, ZookeeperDiscovery) over rpcxio/libkv v0.5.1 with
smallnest/rpcx v1.9.1, built from ``tests/rpc/interop/go-zookeeper``, and a
real ZooKeeper. Each side discovers and calls the other's servers, sees them
leave (clean stop: the node deleted; SIGKILL: the session expires), both
write the same nodes, groups filter on both sides. Without Go the tests are
skipped on a developer's machine and fail in CI (``CI=true``)."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from rpc.discovery.url import RegistryRoute, RegistryURL
from rpc.discovery.zookeeper import ZooKeeperDiscovery
from rpc.errors import NoServerAvailable
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port
from tests.rpc.discovery.helpers import wait_servers
from tests.rpc.gopeer import build_go_peer
from tests.rpc.test_rpcx_e2e import Served, serve
from tests.rpc.zookeeper_fixture import ZooKeeperServer

_bases = iter(range(1_000_000))


@pytest.fixture(scope="module")
def go_zk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-zookeeper", "the rpcx-zookeeper interop peer")


@pytest.fixture
def zk(zookeeper_server: ZooKeeperServer) -> str:
    return zookeeper_server.hosts


@pytest.fixture
def base() -> str:
    """A fresh base path per test (the ZooKeeper is shared by the session)."""
    return f"/zk-interop-{os.getpid()}-{next(_bases)}"


class GoProcess:
    """A Go peer's process; its stdout lines are collected by a thread so
    that a test can wait (bounded) for a line."""

    def __init__(self, *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="go-zookeeper-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def stderr(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def expect(self, pred: Callable[[str], bool], timeout: float = 20.0) -> str:
        """The first line (from now on) for which ``pred`` holds, waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.001))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout:g} s; stderr:\n{self.stderr()}") from None
            if pred(line):
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


@pytest.fixture
def go_procs() -> Iterator[list[GoProcess]]:
    started: list[GoProcess] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def ours() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.stop()


def go_server(binary: Path, zk: str, base: str, procs: list[GoProcess], group: str = "") -> tuple[GoProcess, str]:
    """A Go rpcx server registered with rpcx-zookeeper's plugin; (process, its registered address)."""
    port = free_port()
    p = GoProcess(str(binary), "server", f"127.0.0.1:{port}", zk, base, *([group] if group else []))
    procs.append(p)
    p.expect(lambda line: line.startswith("ready"))
    return p, f"tcp@127.0.0.1:{port}"


def our_server(zk: str, base: str, started: list[Served], *extra: str) -> Served:
    """`juggler rpc serve --zookeeper ZK --base BASE`, registered once it prints its line."""
    s = serve("--example", "arith", "--zookeeper", zk, "--base", base, *extra)
    started.append(s)
    return s


def go_client(binary: Path, zk: str, base: str, group: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), "client", zk, base, "6", "7", *([group] if group else [])],
                          check=False, capture_output=True, text=True, timeout=60)


def tree(zk: str, root: str) -> dict[str, tuple[bytes, bool]]:
    """Every node from ``root``'s top-level parent down: path → (data, ephemeral)."""
    top = "/" + root.strip("/").split("/")[0]
    client = KazooClient(hosts=zk, timeout=4)
    client.start(timeout=10)
    try:
        out: dict[str, tuple[bytes, bool]] = {}

        def walk(path: str) -> None:
            data, stat = client.get(path)
            out[path] = (data, stat.ephemeralOwner != 0)
            for child in client.get_children(path):
                walk(f"{path}/{child}")

        walk(top)
        return out
    finally:
        client.stop()
        client.close()


async def test_our_xclient_calls_a_go_server_registered_in_zookeeper(
    go_zk: Path, zk: str, base: str, go_procs: list[GoProcess]
) -> None:
    _, addr = await asyncio.to_thread(go_server, go_zk, zk, base, go_procs)
    disc = ZooKeeperDiscovery(zk, "Arith", base=base)
    caller = RpcxCaller()
    try:
        await disc.start()
        assert disc.servers() == {addr: ""}
        async with XClient("Arith", disc, caller, options=XClientOptions()) as xc:
            assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            assert await xc.call("Add", {"A": 6, "B": 7}, timeout=5) == {"C": 13}
    finally:
        await disc.aclose()
        await caller.aclose()


def test_go_client_calls_our_server_registered_in_zookeeper(
    go_zk: Path, zk: str, base: str, ours: list[Served]
) -> None:
    our_server(zk, base, ours)
    res = go_client(go_zk, zk, base)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == '{"C":42}'


def test_our_nodes_equal_the_go_plugins(
    go_zk: Path, zk: str, base: str, go_procs: list[GoProcess], ours: list[Served]
) -> None:
    """The same paths, data and ephemeral-ness under two bases: one written by
    rpcx-zookeeper's plugin, one by ``rpc serve --zookeeper`` (both in group
    blue, a nested base whose parent is created empty)."""
    go_proc, go_addr = go_server(go_zk, zk, f"{base}-go/apps", go_procs, group="blue")
    mine = our_server(zk, f"{base}-py/apps", ours, "--group", "blue")

    def relative(root: str, addr: str) -> dict[str, tuple[bytes, bool]]:
        return {p.removeprefix(root).replace(addr, "ADDR"): v for p, v in tree(zk, root).items()}

    go_nodes = relative(f"{base}-go", go_addr)
    our_nodes = relative(f"{base}-py", mine.address)
    assert go_nodes == {
        "": (b"", False),
        "/apps": (b"rpcx_path", False),
        "/apps/Arith": (b"Arith", False),
        "/apps/Arith/ADDR": (b"group=blue", True),
    }
    assert our_nodes == go_nodes
    assert go_proc.proc.poll() is None


async def test_go_servers_leaving_are_seen_by_our_discovery(
    go_zk: Path, zk: str, base: str, go_procs: list[GoProcess]
) -> None:
    """A Go server stopped cleanly deletes its node at once; one killed leaves
    it to ZooKeeper's session expiry (≤ 4 s here). The children watch reports
    both (the periodic re-read is set to a minute)."""
    disc = ZooKeeperDiscovery(zk, "Arith", base=base, refresh_interval=60)
    await disc.start()
    try:
        stopped, a = await asyncio.to_thread(go_server, go_zk, zk, base, go_procs)
        killed, b = await asyncio.to_thread(go_server, go_zk, zk, base, go_procs)
        assert await wait_servers(disc, lambda s: len(s) == 2) == {a: "", b: ""}
        stopped.proc.send_signal(signal.SIGTERM)
        assert await wait_servers(disc, lambda s: a not in s, timeout=5) == {b: ""}
        assert await asyncio.to_thread(stopped.proc.wait, 10) == 0
        killed.proc.kill()
        assert await wait_servers(disc, lambda s: not s, timeout=15) == {}
    finally:
        await disc.aclose()


def test_our_servers_leaving_are_seen_by_the_go_discovery(
    go_zk: Path, zk: str, base: str, go_procs: list[GoProcess], ours: list[Served]
) -> None:
    """rpcx-zookeeper's ZookeeperDiscovery (what a Go XClient watches) sees
    our server appear, leave on SIGTERM (node deleted before the listener
    closes), and a SIGKILLed one leave when its session expires.

    libkv's WatchTree lists the children, hands them over, then sets the next
    children watch: a change in between reaches a Go client only with the
    change after it (and a Go client whose ZooKeeper connection dropped under
    load may miss one too). So each step waits for the watch's update first,
    and where the removal does not show, a later change under the service (a
    node created and deleted) must bring it: what a Go client would see."""
    stopped = our_server(zk, base, ours)
    watch = GoProcess(str(go_zk), "watch", zk, base, "Arith")
    go_procs.append(watch)
    assert watch.expect(lambda line: line.startswith("initial")) == f"initial {stopped.address}="
    watch.expect(lambda line: line == f"servers {stopped.address}=")  # WatchTree started
    stopped.signal(signal.SIGTERM)
    expect_with_nudges(watch, zk, f"{base}/Arith", lambda line: line == "servers", timeout=10)
    assert stopped.wait() == 0
    killed = our_server(zk, base, ours)
    expect_with_nudges(watch, zk, f"{base}/Arith", lambda line: line == f"servers {killed.address}=", timeout=10)
    killed.signal(signal.SIGKILL)
    expect_with_nudges(watch, zk, f"{base}/Arith", lambda line: line == "servers", timeout=15)


def expect_with_nudges(watch: GoProcess, zk: str, service_path: str, pred: Callable[[str], bool],
                       timeout: float) -> str:
    """``watch.expect(pred)``; if the line does not come within ``timeout``,
    up to three times: a child created and deleted under ``service_path`` (a
    later change, which libkv's WatchTree reports with the current children),
    then wait for the line again."""
    try:
        return watch.expect(pred, timeout=timeout)
    except AssertionError:
        pass
    client = KazooClient(hosts=zk, timeout=4)
    client.start(timeout=10)
    try:
        for attempt in range(3):
            nudge = f"{service_path}/nudge-{attempt}"
            client.create(nudge, b"", ephemeral=True)
            client.delete(nudge)
            try:
                return watch.expect(pred, timeout=5)
            except AssertionError:
                if attempt == 2:
                    raise
    finally:
        client.stop()
        client.close()
    raise AssertionError("unreachable")


def test_cli_call_and_bench_through_zookeeper(go_zk: Path, zk: str, base: str, go_procs: list[GoProcess]) -> None:
    """`juggler rpc call|bench zookeeper://…` reach a Go server registered by rpcx-zookeeper."""
    go_server(go_zk, zk, base, go_procs, group="blue")
    url = f"zookeeper://{zk}{base}"
    cli = [sys.executable, "-m", "cli", "rpc", "call", url, "Arith.Mul", '{"A":6,"B":7}', "--timeout", "5"]
    res = subprocess.run(cli, check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == '{"C": 42}'
    res = subprocess.run([*cli, "--group", "blue"], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == '{"C": 42}', res.stderr
    res = subprocess.run([*cli, "--group", "red"], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "no server of group 'red'" in res.stderr
    empty = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", f"zookeeper://{zk}{base}-none",
                            "Arith.Mul", "{}"], check=False, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 1 and "no server registered for service Arith" in empty.stderr
    bench = subprocess.run([sys.executable, "-m", "cli", "rpc", "bench", url, "--example", "arith", "-n", "200",
                            "-c", "4", "--group", "blue"], check=False, capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    assert "received requests_OK : 200" in bench.stdout and "errors               : 0" in bench.stdout


async def test_groups_with_a_go_server_in_a_group(
    go_zk: Path, zk: str, base: str, go_procs: list[GoProcess], ours: list[Served]
) -> None:
    """A Go server in group blue and ours in group green under one base: each
    side's XClient of a group sees only that group's server, without a group
    both; a group nobody is in finds none."""
    _, go_addr = await asyncio.to_thread(go_server, go_zk, zk, base, go_procs, "blue")
    mine = await asyncio.to_thread(our_server, zk, base, ours, "--group", "green")
    registry = RegistryURL.parse(f"zookeeper://{zk}{base}")
    caller = RpcxCaller()
    try:
        for group, expected in (("blue", {go_addr}), ("green", {mine.address}), ("", {go_addr, mine.address})):
            async with RegistryRoute(registry=registry, group=group).xclient("Arith", caller) as xc:
                assert set(xc.servers) == expected
                replies = await xc.broadcast("Mul", {"A": 6, "B": 7}, timeout=5)
                assert replies == {addr: {"C": 42} for addr in expected}
        with pytest.raises(NoServerAvailable, match="no server of group 'red'"):
            async with RegistryRoute(registry=registry, group="red").xclient("Arith", caller):
                pass
    finally:
        await caller.aclose()
    for group in ("blue", "green", ""):
        res = await asyncio.to_thread(go_client, go_zk, zk, base, group)
        assert res.returncode == 0 and res.stdout.strip() == '{"C":42}', (group, res.stderr)
    res = await asyncio.to_thread(go_client, go_zk, zk, base, "red")
    assert res.returncode == 1 and "can not found any server" in res.stderr
