"""Go rpcx estates that register in Consul (rpcx-consul v0.1.0's
ConsulRegisterPlugin and ConsulDiscovery, through libkv v0.5.1; the Go peer
in ``tests/rpc/interop/go-consul``) and ours, in both directions, against a
real Consul agent: calls, deregistration, groups and ``state=inactive``, and
the KV entries ours writes compared with the Go plugin's."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rpc.discovery.consul import LOCK_FLAG, ConsulDiscovery, ConsulHTTP, ConsulRegistrar
from rpc.discovery.url import RegistryURL
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port
from tests.rpc.consul_fixture import ConsulServer, consul_server  # noqa: F401
from tests.rpc.gopeer import GoServer, build_go_peer
from tests.rpc.test_cli_rpc import run_cli
from tests.rpc.test_rpcx_e2e import Served, serve


@pytest.fixture(scope="module")
def go_consul_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-consul", "the rpcx-consul interop peer")


@pytest.fixture
def consul(consul_server: ConsulServer) -> str:  # noqa: F811 - the imported fixture
    """``127.0.0.1:PORT`` of the session's Consul agent."""
    return consul_server.address


@pytest.fixture
def base(request: pytest.FixtureRequest) -> str:
    return f"/rpcx-go-consul-{os.getpid()}-{request.node.name[-24:]}"



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


def go_call(peer: Path, consul: str, base: str, group: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(peer), "client", consul, base, "6", "7", *([group] if group else [])],
                          capture_output=True, text=True, timeout=60, check=False)


def go_reply(peer: Path, consul: str, base: str, group: str = "") -> dict[str, object]:
    res = go_call(peer, consul, base, group)
    assert res.returncode == 0, res.stderr
    reply: dict[str, object] = json.loads(res.stdout)
    return reply


async def until(discovery: ConsulDiscovery, condition: Callable[[dict[str, str]], bool],
                timeout: float = 15.0) -> None:
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


async def entries(consul: str, base: str) -> list[dict[str, Any]]:
    """Every KV entry under ``base`` (a prefix), as Consul holds it."""
    http = ConsulHTTP(consul)
    try:
        found, _ = await http.list(base.lstrip("/"))
        return found
    finally:
        await http.aclose()


async def session_of(consul: str, session: str) -> dict[str, Any]:
    http = ConsulHTTP(consul)
    try:
        _, info, _ = await http.request("GET", f"/v1/session/info/{session}")
        assert info, f"no session {session}"
        return dict(info[0])
    finally:
        await http.aclose()


async def test_our_xclient_calls_a_go_server_and_sees_it_deregister(
        go_consul_peer: Path, consul: str, base: str, go_servers: list[GoServer]) -> None:
    go = GoServer(go_consul_peer, consul, base)
    go_servers.append(go)
    # no periodic re-read within the test: what changes is seen through the blocking query
    discovery = ConsulDiscovery(consul, "Arith", base=base, refresh_interval=300)
    caller = RpcxCaller()
    try:
        async with discovery, XClient("Arith", discovery, caller, options=XClientOptions()) as xc:
            assert discovery.servers() == {f"tcp@{go.addr}": ""}
            assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42, "Server": f"go@{go.addr}"}
            # ConsulRegisterPlugin.Stop deletes the server's key: the watch sees it
            go.stop(signal.SIGTERM)
            assert go.proc.returncode == 0
            await until(discovery, lambda servers: not servers)
    finally:
        await caller.aclose()


def test_cli_calls_a_go_server_through_consul(go_consul_peer: Path, consul: str, base: str,
                                              go_servers: list[GoServer]) -> None:
    go = GoServer(go_consul_peer, consul, base)  # registered before it prints "ready"
    go_servers.append(go)
    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", f"consul://{consul}{base}",
                          "Arith.Mul", '{"A":6,"B":7}', "--timeout", "5"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"C": 42, "Server": f"go@{go.addr}"}


def test_go_xclient_calls_our_server_and_loses_it_at_shutdown(go_consul_peer: Path, consul: str, base: str,
                                                              our_servers: list[Served]) -> None:
    ours = serve("--example", "arith", "--consul", consul, "--base", base)
    our_servers.append(ours)
    assert go_reply(go_consul_peer, consul, base) == {"C": 42}
    # a clean shutdown deletes our key: Go's discovery finds no server
    ours.signal(signal.SIGTERM)
    assert ours.wait() == 0
    keys = {e["Key"] for e in asyncio.run(entries(consul, base))}
    assert f"{base.lstrip('/')}/Arith/{ours.address}" not in keys
    res = go_call(go_consul_peer, consul, base)
    assert res.returncode != 0 and "can not found any server" in res.stderr


async def test_our_entries_are_the_go_plugins(go_consul_peer: Path, consul: str, base: str,
                                              go_servers: list[GoServer]) -> None:
    """The same service registered by the Go plugin under one base and by
    ours under another: the same keys, values and flags, the server's key
    held by a session of the same kind (behaviour delete, TTL half the entry's)."""
    go = GoServer(go_consul_peer, consul, f"{base}-go", group="blue")
    go_servers.append(go)
    address = f"tcp@127.0.0.1:{free_port()}"
    registrar = ConsulRegistrar(consul, base=f"{base}-py", ttl=20)
    try:
        await registrar.register("Arith", address, "group=blue")

        plain = base.lstrip("/")

        async def layout(side: str, addr: str) -> tuple[list[tuple[str, str, int]], dict[str, Any]]:
            found = await entries(consul, f"{base}-{side}")
            rows = sorted((e["Key"].replace(f"{plain}-{side}", plain, 1).replace(addr, "ADDR"),
                           base64.b64decode(e["Value"] or "").decode(), e["Flags"]) for e in found)
            [server] = [e for e in found if e["Key"].endswith(addr)]
            session = await session_of(consul, server["Session"])
            return rows, {k: session[k] for k in ("Behavior", "TTL", "LockDelay", "NodeChecks")}

        go_rows, go_session = await layout("go", f"tcp@{go.addr}")
        our_rows, our_session = await layout("py", address)
        assert go_rows == [(plain, "rpcx_path", LOCK_FLAG), (f"{plain}/Arith", "Arith", LOCK_FLAG),
                           (f"{plain}/Arith/ADDR", "group=blue", LOCK_FLAG)]
        assert our_rows == go_rows
        assert our_session == go_session == {"Behavior": "delete", "TTL": "10s", "LockDelay": 1_000_000,
                                             "NodeChecks": ["serfHealth"]}
    finally:
        await registrar.aclose()


async def test_refresh_keeps_an_edit_and_recreates_a_vanished_entry(consul: str, base: str) -> None:
    """As the Go plugin's ticker: an edit made in Consul (``state=inactive``)
    survives the refresh (which renews the same session), and an entry deleted
    behind the server's back is written again with a new session."""
    address = "tcp@127.0.0.1:1"
    registrar = ConsulRegistrar(consul, base=base, ttl=20)
    http = ConsulHTTP(consul)
    key = registrar.key("Arith", address)
    try:
        await registrar.register("Arith", address, "weight=2")
        before = await http.get(key)
        assert before is not None and before["Session"]
        await http.put(key, "weight=2&state=inactive")
        await registrar.refresh()
        after = await http.get(key)
        assert after is not None and after["Session"] == before["Session"]
        assert base64.b64decode(after["Value"]).decode() == "state=inactive&weight=2"  # Go's Values.Encode order
        await http.delete(key)
        await registrar.refresh()
        again = await http.get(key)
        assert again is not None and base64.b64decode(again["Value"]).decode() == "weight=2"
        assert again["Session"] and again["Session"] != before["Session"]
    finally:
        await registrar.aclose()
        await http.aclose()
    assert await entries(consul, f"{base}/Arith/") == []


async def test_groups_and_inactive_across_go_and_python_servers(
        go_consul_peer: Path, consul: str, base: str, go_servers: list[GoServer], our_servers: list[Served]) -> None:
    """A Go server in group ``blue`` and ours in ``green`` under one base path:
    each side's client keeps to the group it asks for; ours marked
    ``state=inactive`` in Consul is dropped by Go's client and ours."""
    go = GoServer(go_consul_peer, consul, base, group="blue")
    go_servers.append(go)
    ours = serve("--example", "arith", "--consul", consul, "--base", base, "--group", "green")
    our_servers.append(ours)
    for _ in range(3):  # random selector: any misrouting would show within a few calls
        assert go_reply(go_consul_peer, consul, base, "green") == {"C": 42}
        assert go_reply(go_consul_peer, consul, base, "blue") == {"C": 42, "Server": f"go@{go.addr}"}
    caller = RpcxCaller()
    try:
        for group, expected in (("blue", {"C": 42, "Server": f"go@{go.addr}"}), ("green", {"C": 42})):
            discovery = ConsulDiscovery(consul, "Arith", base=base)
            async with discovery, XClient("Arith", discovery, caller, options=XClientOptions(group=group)) as xc:
                assert len(discovery.servers()) == 2
                for _ in range(5):
                    assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == expected
        http = ConsulHTTP(consul)
        try:
            await http.put(f"{base.lstrip('/')}/Arith/{ours.address}", "group=green&state=inactive")
        finally:
            await http.aclose()
        res = go_call(go_consul_peer, consul, base, "green")
        assert res.returncode != 0 and "can not found any server" in res.stderr
        route_url = RegistryURL.parse(f"consul://{consul}{base}")
        discovery = route_url.discovery("Arith")
        async with discovery, XClient("Arith", discovery, caller, options=XClientOptions()) as xc:
            assert len(discovery.servers()) == 2
            for _ in range(5):  # only the Go server is active
                assert await xc.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42, "Server": f"go@{go.addr}"}
    finally:
        await caller.aclose()


async def test_killed_servers_expire_with_their_sessions(
        go_consul_peer: Path, consul: str, base: str, go_servers: list[GoServer], our_servers: list[Served]) -> None:
    """A Go server and ours killed without deregistering: Consul deletes each
    one's key when its session expires (within the 20 s TTL of both), and
    the watch of our discovery sees it; Go's client then finds no server."""
    go = GoServer(go_consul_peer, consul, base)
    go_servers.append(go)
    ours = serve("--example", "arith", "--consul", consul, "--base", base, "--ttl", "20")
    our_servers.append(ours)
    discovery = ConsulDiscovery(consul, "Arith", base=base, refresh_interval=300)  # only the watch sees changes
    async with discovery:
        assert set(discovery.servers()) == {f"tcp@{go.addr}", ours.address}
        go.stop(signal.SIGKILL)
        ours.stop()  # SIGKILL
        await until(discovery, lambda servers: not servers, timeout=45)
    res = go_call(go_consul_peer, consul, base)
    assert res.returncode != 0 and "can not found any server" in res.stderr


def test_bench_through_consul_and_the_errors_a_user_sees(consul: str, base: str, our_servers: list[Served]) -> None:
    """``juggler rpc bench consul://…`` over two of our servers, and the
    one-line errors for nothing registered and for an unreachable agent."""
    target = f"consul://{consul}{base}"
    empty = run_cli("cli.rpc_bench", target, "--example", "arith", "-n", "10")
    assert empty.returncode == 1
    assert empty.stderr.startswith(f"error: no server registered for service Arith under {base} in consul://{consul}")
    for _ in range(2):
        our_servers.append(serve("--example", "arith", "--consul", consul, "--base", base))
    bench = run_cli("cli.rpc_bench", target, "--example", "arith", "-c", "4", "-n", "40", "--selector", "roundrobin")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert "received requests_OK : 40" in bench.stdout and "errors               : 0" in bench.stdout
    port = free_port()
    down = run_cli("cli.rpc_call", f"consul://127.0.0.1:{port}{base}", "Arith.Mul", "{}")
    assert down.returncode == 1
    assert down.stderr.startswith(f"error: cannot reach the registry consul://127.0.0.1:{port}: "), down.stderr
    assert len(down.stderr.splitlines()) == 1 and "Traceback" not in down.stderr
