"""Go rpcx estates that register in etcd v3 (rpcx-etcd v0.5.0's
EtcdV3RegisterPlugin and EtcdV3Discovery, the Go peer in
``tests/rpc/interop/go-etcd``) and ours, in both directions, with groups:
a regression test that our etcd layout stays the one Go's plugins use."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rpc.discovery.etcd import EtcdDiscovery
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.rpc.gopeer import GoServer, build_go_peer
from tests.rpc.test_rpcx_e2e import Served, serve


@pytest.fixture(scope="module")
def go_etcd_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-etcd", "the rpcx-etcd interop peer")



@pytest.fixture
def base(request: pytest.FixtureRequest) -> str:
    return f"/rpcx-go-etcd-{os.getpid()}-{request.node.name[-24:]}"


@pytest.fixture
def go_servers() -> Iterator[list[GoServer]]:
    started: list[GoServer] = []
    yield started
    for s in started:
        s.stop()


@pytest.fixture
def our_servers() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.stop()


def go_call(peer: Path, etcd: str, base: str, group: str = "") -> dict[str, object]:
    res = subprocess.run([str(peer), "client", etcd, base, "6", "7", *([group] if group else [])],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    reply: dict[str, object] = json.loads(res.stdout)
    return reply


async def until(discovery: EtcdDiscovery, condition: Callable[[dict[str, str]], bool], timeout: float = 15.0) -> None:
    """Wait, on the discovery's change notifications, until its servers satisfy ``condition``."""
    changed = asyncio.Event()
    unsubscribe = discovery.subscribe(lambda _servers: changed.set())
    try:
        async with asyncio.timeout(timeout):
            while not condition(discovery.servers()):
                await changed.wait()
                changed.clear()
    except TimeoutError:
        raise AssertionError(f"the discovery did not see the change in {timeout} s: {discovery.servers()}") from None
    finally:
        unsubscribe()


async def registered(etcd: str, base: str, address: str) -> None:
    """Wait until ``address`` is registered for Arith under ``base`` (rpcx-etcd
    v0.5.0's plugin writes its node on its first refresh, not at Register)."""
    async with EtcdDiscovery(etcd, "Arith", base=base) as discovery:
        await until(discovery, lambda servers: address in servers)


async def test_our_xclient_calls_a_go_server_registered_with_rpcx_etcd(
        go_etcd_peer: Path, etcd_endpoint: str, base: str, go_servers: list[GoServer]) -> None:
    go = GoServer(go_etcd_peer, etcd_endpoint, base)
    go_servers.append(go)
    discovery = EtcdDiscovery(etcd_endpoint, "Arith", base=base)
    caller = RpcxCaller()
    try:
        async with discovery, XClient("Arith", discovery, caller, options=XClientOptions()) as xc:
            await until(discovery, lambda servers: list(servers) == [f"tcp@{go.addr}"])
            assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42, "Server": f"go@{go.addr}"}
            # A clean stop deregisters (EtcdV3RegisterPlugin.Stop deletes the key): seen by the watch.
            go.stop(signal.SIGTERM)
            await until(discovery, lambda servers: not servers)
    finally:
        await caller.aclose()


def test_cli_calls_a_go_server_through_etcd(go_etcd_peer: Path, etcd_endpoint: str, base: str,
                                            go_servers: list[GoServer]) -> None:
    go = GoServer(go_etcd_peer, etcd_endpoint, base)
    go_servers.append(go)
    asyncio.run(registered(etcd_endpoint, base, f"tcp@{go.addr}"))
    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", f"etcd://{urlsplit(etcd_endpoint).netloc}{base}",
                          "Arith.Mul", '{"A":6,"B":7}', "--timeout", "5"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"C": 42, "Server": f"go@{go.addr}"}


def test_go_xclient_calls_our_server_registered_in_etcd(go_etcd_peer: Path, etcd_endpoint: str, base: str,
                                                        our_servers: list[Served]) -> None:
    ours = serve("--example", "arith", "--etcd", etcd_endpoint, "--base", base)
    our_servers.append(ours)
    assert go_call(go_etcd_peer, etcd_endpoint, base) == {"C": 42}


async def test_groups_across_go_and_python_servers(go_etcd_peer: Path, etcd_endpoint: str, base: str,
                                                   go_servers: list[GoServer], our_servers: list[Served]) -> None:
    """A Go server in group ``blue`` and ours in ``green``, under one base
    path: each side's client keeps to the group it asks for, as rpcx's
    ``Option.Group`` does, and one without a group may reach both."""
    go = GoServer(go_etcd_peer, etcd_endpoint, base, group="blue")
    go_servers.append(go)
    ours = serve("--example", "arith", "--etcd", etcd_endpoint, "--base", base, "--group", "green")
    our_servers.append(ours)
    await registered(etcd_endpoint, base, f"tcp@{go.addr}")
    for _ in range(3):  # random selector: any misrouting would show within a few calls
        assert go_call(go_etcd_peer, etcd_endpoint, base, "green") == {"C": 42}
        assert go_call(go_etcd_peer, etcd_endpoint, base, "blue") == {"C": 42, "Server": f"go@{go.addr}"}
    caller = RpcxCaller()
    try:
        for group, expected in (("blue", {"C": 42, "Server": f"go@{go.addr}"}), ("green", {"C": 42})):
            discovery = EtcdDiscovery(etcd_endpoint, "Arith", base=base)
            async with discovery, XClient("Arith", discovery, caller, options=XClientOptions(group=group)) as xc:
                assert len(discovery.servers()) == 2
                for _ in range(5):
                    assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == expected
    finally:
        await caller.aclose()
