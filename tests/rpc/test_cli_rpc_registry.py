"""`juggler rpc call|bench` through a registry (etcd://, redis://) as real
processes, against real `juggler rpc serve` processes registered in a real
etcd and Redis: calls spread, failover past a killed server, --group, and the
errors a user can act on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.netutil import free_port
from tests.rpc.test_cli_rpc import run_cli


class Servers:
    """`juggler rpc serve --app tests.rpc.rpcx_app:setup` processes (Arith,
    Probe.Who answering the pid) registered under one base path."""

    def __init__(self, register: list[str]) -> None:
        self.register = register
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *extra: str) -> tuple[subprocess.Popen[str], str, int]:
        port, metrics = free_port(), free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.rpc_serve", "--app", "tests.rpc.rpcx_app:setup",
             "--listen", f"127.0.0.1:{port}", "--ttl", "30", "--metrics-port", str(metrics),
             "--metrics-host", "127.0.0.1", *self.register, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd(),
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once registered
        assert line.startswith("rpc serve: rpcx on "), (line, proc.stderr.read() if proc.poll() is not None else "")
        return proc, f"tcp@127.0.0.1:{port}", metrics

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()


def mul_calls(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(r'rpc_server_requests_total\{method="Mul",service="Arith"\} ([0-9.]+)', text)
    return int(float(m.group(1))) if m else 0


def who(target: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli("cli.rpc_call", target, "Probe.Who", "null", *flags)


@pytest.fixture(params=["etcd", "redis"])
def registry(request: pytest.FixtureRequest) -> Iterator[tuple[list[str], str]]:
    """(the serve flags registering there, the registry URL clients give), one base path per test."""
    base = f"/rpcx-cli-{os.getpid()}-{request.node.name.partition('[')[0][-20:]}"
    if request.param == "etcd":
        endpoint = request.getfixturevalue("etcd_endpoint")
        yield ["--etcd", endpoint, "--base", base], f"etcd://{urlsplit(endpoint).netloc}{base}"
    else:
        url = request.getfixturevalue("redis_url")
        yield ["--redis", url, "--base", base], f"redis://{urlsplit(url).netloc}{base}"


def test_calls_spread_fail_over_and_pick_the_group(registry: tuple[list[str], str]) -> None:
    register, target = registry
    servers = Servers(register)
    try:
        a, a_addr, a_metrics = servers.start()
        b, b_addr, b_metrics = servers.start()

        ok = run_cli("cli.rpc_call", target, "Arith.Mul", '{"A":6,"B":7}')
        assert ok.returncode == 0 and ok.stdout.strip() == '{"C": 42}', ok.stderr

        bench = run_cli("cli.rpc_bench", target, "--example", "arith", "-c", "4", "-n", "40",
                        "--selector", "roundrobin", "--pool", "2")
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert "received requests_OK : 40" in bench.stdout and "errors               : 0" in bench.stdout
        # round robin over both (the bench warms its connections up with a few calls first)
        assert mul_calls(a_metrics) >= 20 and mul_calls(b_metrics) >= 20
        assert mul_calls(a_metrics) + mul_calls(b_metrics) <= 40 + 1 + 2

        # round robin starts at the first address in order: kill that one, it stays registered (TTL 30 s)
        first, second = (a, b) if a_addr < b_addr else (b, a)
        first.kill()
        first.wait(timeout=10)
        failfast = who(target, "--selector", "roundrobin")
        assert failfast.returncode == 1 and failfast.stderr.startswith("(error) "), failfast.stderr
        failover = who(target, "--selector", "roundrobin", "--fail-mode", "failover")
        assert failover.returncode == 0 and failover.stdout.strip() == f'{{"pid": {second.pid}}}', failover.stderr

        canary, _, _ = servers.start("--group", "canary")
        for _ in range(2):
            picked = who(target, "--group", "canary", "--fail-mode", "failover")
            assert picked.returncode == 0 and picked.stdout.strip() == f'{{"pid": {canary.pid}}}', picked.stderr
        base = target[target.index("/", len("redis://")):]
        none = who(target, "--group", "stable")
        assert none.returncode == 1
        assert none.stderr.startswith(f"error: no server of group 'stable' for service Probe under {base} in ")
        assert len(none.stderr.splitlines()) == 1
    finally:
        servers.close()


def test_nothing_registered_is_said_with_the_base_path_and_service(registry: tuple[list[str], str]) -> None:
    _, target = registry
    base = target[target.index("/", len("redis://")):]
    res = run_cli("cli.rpc_call", target, "Arith.Mul", '{"A":6,"B":7}')
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith(f"error: no server registered for service Arith under {base} in ")
    assert len(res.stderr.splitlines()) == 1
    bench = run_cli("cli.rpc_bench", target, "--example", "arith", "-n", "10")
    assert bench.returncode == 1
    assert bench.stderr.startswith(f"error: no server registered for service Arith under {base} in ")
    assert "requests_OK" not in bench.stdout


@pytest.mark.parametrize("scheme", ["etcd", "redis"])
def test_an_unreachable_registry_is_one_line(scheme: str) -> None:
    port = free_port()
    for module in ("cli.rpc_call", "cli.rpc_bench"):
        args = ["Arith.Mul", "{}"] if module == "cli.rpc_call" else ["--example", "arith", "-n", "5"]
        res = run_cli(module, f"{scheme}://127.0.0.1:{port}/rpcx", *args)
        assert res.returncode == 1, res.stderr
        assert res.stderr.startswith(f"error: cannot reach the registry {scheme}://127.0.0.1:{port}: "), res.stderr
        assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["etcd://", "Arith.Mul"], "no host in registry URL 'etcd://'"),
        (["etcd://127.0.0.1:port/rpcx", "Arith.Mul"], "bad port in registry URL"),
        (["etc://127.0.0.1:2379/rpcx", "Arith.Mul"], "not a registry URL: 'etc://127.0.0.1:2379/rpcx'"),
        (["redis://127.0.0.1:6379/rpcx?db=x", "Arith.Mul"], "db must be a number"),
        (["etcd://127.0.0.1:2379/rpcx?db=1", "Arith.Mul"], "takes no query"),
        (["etcd://127.0.0.1:2379/rpcx", "Arith.Mul", "--registry-tls-ca", "ca.pem"],
         "registry TLS options need an etcds:// or rediss:// URL"),
        (["127.0.0.1:8972", "Arith.Mul", "--group", "canary"], "--group: only for a registry target"),
        (["127.0.0.1:8972", "Arith.Mul", "--fail-mode", "failover"], "--fail-mode: only for a registry target"),
        (["etcd://127.0.0.1:2379/rpcx", "Arith.Mul", "--group", ""], "--group needs a name"),
        (["etcd://127.0.0.1:2379/rpcx", "Arith.Mul", "--selector", "fastest"], "unknown selector 'fastest'"),
    ],
)
def test_usage_errors_exit_2_in_one_line(args: list[str], error: str) -> None:
    res = run_cli("cli.rpc_call", *args)
    assert res.returncode == 2 and error in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    if "--selector" not in args:  # argparse adds its usage line
        assert len(res.stderr.splitlines()) == 1, res.stderr


def test_bench_refuses_a_bad_registry_url() -> None:
    res = run_cli("cli.rpc_bench", "redis://127.0.0.1:6379/rpcx?database=1", "-n", "5")
    assert res.returncode == 2 and "unknown query parameter 'database'" in res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_call_through_etcd_over_https_with_a_client_certificate(pki: Any) -> None:
    import shutil

    from tests.rpc.conftest import start_etcd

    etcd = start_etcd(tls=pki.leaf(), ca=str(pki.ca))
    client = pki.leaf("rpc-client")
    tls = ["--registry-tls-ca", str(pki.ca), "--registry-tls-cert", str(client.cert),
           "--registry-tls-key", str(client.key)]
    servers = Servers(["--etcd", etcd.endpoint, "--base", "/tls-cli", *tls])
    try:
        servers.start()
        target = f"etcds://127.0.0.1:{etcd.port}/tls-cli"
        ok = run_cli("cli.rpc_call", target, "Arith.Mul", '{"A":6,"B":7}', *tls)
        assert ok.returncode == 0 and ok.stdout.strip() == '{"C": 42}', ok.stderr
        bench = run_cli("cli.rpc_bench", target, "--example", "arith", "-n", "20", "-c", "2", "--processes", "2",
                        *tls)  # the route, registry TLS included, goes to each client process
        assert bench.returncode == 0 and "received requests_OK : 20" in bench.stdout, bench.stdout + bench.stderr
        untrusted = run_cli("cli.rpc_call", target, "Arith.Mul", '{"A":6,"B":7}')  # the system store: not our CA
        assert untrusted.returncode == 1
        assert untrusted.stderr.startswith(f"error: cannot reach the registry {target.rpartition('/')[0]}: ")
        assert len(untrusted.stderr.splitlines()) == 1
    finally:
        servers.close()
        etcd.stop(timeout=10)
        shutil.rmtree(etcd.dir, ignore_errors=True)
