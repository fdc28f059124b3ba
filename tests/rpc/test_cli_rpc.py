"""The rpc CLI modules as real processes: serve (HTTP gateway, Redis
registration, metrics, SIGTERM shutdown), call, bench."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
import redis

from cli import rpc_bench, rpc_call, rpc_serve
from rpc.discovery.libkv import decode_pair
from tests.netutil import free_port, wait_for_port


def run_cli(module: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=os.getcwd())


def test_register_adds_subcommands() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for m in (rpc_serve, rpc_call, rpc_bench):
        m.register(sub)
    args = parser.parse_args(["call", "http://h:1", "Arith.Mul", "{}", "--codec", "msgpack"])
    assert args.func is rpc_call.run and args.codec == "msgpack"
    args = parser.parse_args(["serve", "--example", "bench", "--gateway", "127.0.0.1:1"])
    assert args.func is rpc_serve.run
    args = parser.parse_args(["bench", "inproc:x", "-c", "5"])
    assert args.func is rpc_bench.run and args.concurrency == 5


def test_serve_call_and_graceful_stop(redis_url: str) -> None:
    gw, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.rpc_serve", "--example", "arith", "--gateway", f"127.0.0.1:{gw}",
         "--redis", redis_url, "--advertise", "tcp@127.0.0.1:18972", "--metadata", "weight=3",
         "--metrics-port", str(metrics), "--metrics-host", "127.0.0.1", "--auth", "tok"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd(),
    )
    r = redis.Redis.from_url(redis_url)
    try:
        line = proc.stdout.readline()
        assert line.startswith("rpc serve: http gateway on 127.0.0.1:"), line
        wait_for_port(gw, proc=proc)
        # Go rpcx's layout: libkv's key and KVPair JSON
        assert decode_pair(r.get("//rpcx/Arith/tcp@127.0.0.1:18972")).value == b"weight=3"  # type: ignore[arg-type]

        url = f"http://127.0.0.1:{gw}"
        ok = run_cli("cli.rpc_call", url, "Arith.Mul", '{"A":6,"B":7}', "--auth", "tok")
        assert ok.returncode == 0 and json.loads(ok.stdout) == {"C": 42}, ok.stderr
        mp = run_cli("cli.rpc_call", url, "Arith.Add", '{"A":1,"B":2}', "--auth", "tok", "--codec", "msgpack")
        assert mp.returncode == 0 and json.loads(mp.stdout) == {"C": 3}, mp.stderr
        denied = run_cli("cli.rpc_call", url, "Arith.Mul", '{"A":1,"B":2}')
        assert denied.returncode == 1 and "auth failed" in denied.stderr
        missing = run_cli("cli.rpc_call", url, "Nope.X", "{}", "--auth", "tok")
        assert missing.returncode == 1 and "can't find service Nope" in missing.stderr
        usage = run_cli("cli.rpc_call", url, "NoDot", "{}")
        assert usage.returncode == 2
        rpcx = run_cli("cli.rpc_call", "127.0.0.1:1", "Arith.Mul", "{}")
        assert rpcx.returncode == 1 and "Connection refused" in rpcx.stderr  # rpcx protocol, nobody there

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'rpc_server_requests_total{method="Mul",service="Arith"} 1.0' in text

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert "juggler rpc serve: stopping" in proc.stderr.read()
        assert r.exists("//rpcx/Arith/tcp@127.0.0.1:18972") == 0  # deregistered on shutdown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        proc.stdout.close()
        proc.stderr.close()
        r.close()


def test_serve_needs_a_listener() -> None:
    res = run_cli("cli.rpc_serve", "--example", "arith")
    assert res.returncode == 2 and "--listen, --gateway and/or --grpc" in res.stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_bench_in_process(processes: str) -> None:
    res = run_cli("cli.rpc_bench", "inproc:bench", "-c", "20", "-n", "2000", "--processes", processes)
    assert res.returncode == 0, res.stderr
    assert "received requests_OK : 2000" in res.stdout and "throughput  (TPS)" in res.stdout
    assert "p99.9:" in res.stdout and "client CPU" in res.stdout


def test_bench_reports_errors_against_a_dead_address() -> None:
    res = run_cli("cli.rpc_bench", "127.0.0.1:1", "-n", "10")
    assert res.returncode == 1 and "errors               : 10" in res.stdout


async def test_serve_group_publishes_metadata_and_xclients_of_that_group_use_it(etcd_endpoint: str) -> None:
    from rpc.discovery.etcd import EtcdDiscovery
    from rpc.errors import NoServerAvailable
    from rpc.rpcx_client import RpcxCaller
    from rpc.xclient import XClient, XClientOptions

    port, base = free_port(), f"/rpcx-cli-group-{os.getpid()}"
    address = f"tcp@127.0.0.1:{port}"
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "cli.rpc_serve", "--example", "arith", "--listen", f"127.0.0.1:{port}",
         "--etcd", etcd_endpoint, "--base", base, "--metadata", "weight=2", "--group", "canary"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd(),
    )
    disc = EtcdDiscovery(etcd_endpoint, "Arith", base=base, refresh_interval=0.2)
    caller = RpcxCaller()
    try:
        assert (await asyncio.to_thread(proc.stdout.readline)).startswith("rpc serve: ")
        await disc.start()
        from tests.rpc.discovery.helpers import wait_servers

        assert await wait_servers(disc, lambda s: address in s, timeout=10) == {address: "weight=2&group=canary"}
        async with XClient("Arith", disc, caller, options=XClientOptions(group="canary")) as canary:
            assert await canary.call("Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
        async with XClient("Arith", disc, caller, options=XClientOptions(group="stable")) as stable:
            assert stable.servers == {}
            with pytest.raises(NoServerAvailable):
                await stable.call("Mul", {"A": 6, "B": 7}, timeout=5)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 5)
        proc.stdout.close()
        proc.stderr.close()
        await disc.aclose()
        await caller.aclose()


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--group", ""], "--group needs a name"),
        (["--metadata", "group=a", "--group", "b"], "already has a group"),
    ],
)
def test_serve_group_usage_errors(extra: list[str], error: str) -> None:
    res = run_cli("cli.rpc_serve", "--example", "arith", "--gateway", f"127.0.0.1:{free_port()}", *extra)
    assert res.returncode == 2 and error in res.stderr and "Traceback" not in res.stderr
