"""The first hour of a new user, each step driving the real command: the
start lines' hints are followed as printed, and a wrong turn (a TLS port
dialled in clear, a plain port dialled with TLS, the wrong broker) gets a
message that says what to do."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clitools import as_run, cli, run, started
from tests.netutil import free_port, wait_for_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    done = run(cli("tls", "dev-cert", "--out", str(out)))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def tls_up(certs: Path) -> Iterator[tuple[str, str]]:
    """`juggler up` over TLS: (the client command its banner prints, the URL to connect)."""
    port = free_port()
    with started(cli("up", "--listen", f"127.0.0.1:{port}", "--tls-cert", str(certs / "cert.pem"),
                     "--tls-key", str(certs / "key.pem"))) as out:
        out.until(r"^Connect from another terminal:")
        command = out.until(r"^  (juggler client.*)$").group(1)
        url = out.until(r"^  then:  connect (\S+)$").group(1)
        yield command, url


@pytest.fixture(scope="module")
def plain_up() -> Iterator[int]:
    port = free_port()
    with started(cli("up", "--listen", f"127.0.0.1:{port}")) as out:
        out.until(r"^Ctrl-C stops it")
        yield port


def test_the_tls_banner_prints_a_client_command_that_works(tls_up: tuple[str, str], certs: Path) -> None:
    command, url = tls_up
    assert command == f"juggler client --tls-ca {certs / 'ca.pem'}"
    done = run(as_run(command), stdin=f'connect {url}\ncall 1 test.echo 5s "hello"\nexit\n')
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r'<<< RES .*\(test\.echo\): "hello"', done.stdout), done.stdout


def test_the_repl_takes_a_ca_or_insecure_per_connection(tls_up: tuple[str, str], certs: Path) -> None:
    _, url = tls_up
    script = (f"connect --tls-ca {certs / 'ca.pem'} {url}\n"
              f"connect --insecure {url}\n"
              f"connect {url}\n"
              f"connect --tls-ca {certs / 'missing.pem'} {url}\n"
              f"connect --tls-ca {certs / 'ca.pem'} ws://127.0.0.1:1/ws\n"
              "list\nexit\n")
    done = run(cli("client"), stdin=script)
    assert f"[1] connected to {url} (juggler.0)" in done.stdout
    assert f"[2] connected to {url} (juggler.0; the server's certificate was NOT verified (--insecure))" \
        in done.stdout
    errors = done.stderr.splitlines()
    assert "server certificate refused" in errors[0] and "--tls-ca FILE" in errors[0]  # no CA given: refused
    assert "missing.pem: no such file" in errors[1]
    assert "--tls-ca and --insecure are for wss:// URLs" in errors[2]
    assert "[3]" not in done.stdout
    assert done.returncode == 1


def test_ws_to_a_tls_port_and_wss_to_a_plain_port_say_so(tls_up: tuple[str, str], plain_up: int) -> None:
    _, url = tls_up
    plain = url.replace("wss://", "ws://")
    done = run(cli("client"), stdin=f"connect {plain}\nconnect wss://127.0.0.1:{plain_up}/ws\nexit\n")
    errors = done.stderr.splitlines()
    assert errors[0].endswith(f"cannot connect to {plain}: this server speaks TLS: use {url}"), errors
    assert errors[1].endswith("it does not speak TLS on this port "
                              f"(use ws://127.0.0.1:{plain_up}/ws)"), errors
    assert done.returncode == 1
    load = run(cli("load", "--url", plain, "-d", "1s", "-c", "1", "--quiet"))
    assert f"this server speaks TLS: use {url}" in load.stdout + load.stderr


def test_a_timed_out_wait_says_so(plain_up: int) -> None:
    done = run(cli("client"), stdin=f"connect ws://127.0.0.1:{plain_up}/ws\nwait 1 200ms\nexit\n")
    assert "[1] wait: no event within 200ms (timed out)" in done.stdout
    assert done.returncode == 1  # nothing came: a failure for a script


def test_server_on_the_memory_broker_says_why_calls_fail() -> None:
    port = free_port()
    with started(cli("server", "--listen", f"127.0.0.1:{port}")) as out:
        warning = out.until(r"WARNING .*in-memory broker")
        line = warning.string
        assert "no CALL can be served" in line and "juggler up" in line and "--redis URL" in line
        done = run(cli("client"), stdin=f'connect ws://127.0.0.1:{port}/ws\ncall 1 test.echo 5s "x"\nexit\n')
        assert "404: no callee serves test.echo" in done.stdout


@pytest.fixture(scope="module")
def rpc_servers(certs: Path) -> Iterator[tuple[str, int]]:
    """`juggler rpc serve` over TLS and in clear: (the call command the TLS one prints, the plain port)."""
    tls_port, plain_port = free_port(), free_port()
    with started(cli("rpc", "serve", "--example", "arith", "--listen", f"127.0.0.1:{tls_port}",
                     "--tls-cert", str(certs / "cert.pem"), "--tls-key", str(certs / "key.pem"))) as tls, \
            started(cli("rpc", "serve", "--example", "arith", "--listen", f"127.0.0.1:{plain_port}")) as plain:
        tls.until(r"^rpc serve: rpcx over TLS on ")
        command = tls.until(r"^call it with: (.*)$").group(1)
        plain.until(r"^rpc serve: rpcx on ")
        yield command, plain_port
        tls.proc.terminate()
        tls.proc.wait(timeout=20)
        assert tls.drain().count("rpc serve: rpcx") == 1, tls.seen  # one start line


def test_rpc_serve_prints_a_call_command_that_works(rpc_servers: tuple[str, int], certs: Path) -> None:
    command, _ = rpc_servers
    assert command.endswith(f"--tls-ca {certs / 'ca.pem'}"), command
    done = run(as_run(command))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"C": 42}


def test_rpc_call_to_the_wrong_kind_of_port_says_so(rpc_servers: tuple[str, int]) -> None:
    command, plain_port = rpc_servers
    clear = as_run(command)[: as_run(command).index("--tls-ca")]
    done = run(clear, timeout=30)
    assert done.returncode == 1
    assert "speaks TLS: call it over TLS (--tls" in done.stderr, done.stderr
    assert "reconnecting" not in done.stderr
    tls = run(cli("rpc", "call", f"127.0.0.1:{plain_port}", "Arith.Mul", '{"A": 6, "B": 7}', "--tls"), timeout=30)
    assert tls.returncode == 1
    assert f"127.0.0.1:{plain_port} does not speak TLS on this port: call it without --tls" in tls.stderr, \
        tls.stderr


def test_seq_member_over_tls_prints_the_client_command(certs: Path, tmp_path: Path) -> None:
    port = free_port()
    member = cli("seq", "server", "--listen", f"127.0.0.1:{port}", "--data", str(tmp_path / "a"), "--bootstrap",
                 "--tls-cert", str(certs / "cert.pem"), "--tls-key", str(certs / "key.pem"),
                 "--tls-ca", str(certs / "ca.pem"))
    with started(member) as out:
        command = out.until(r"clients connect over TLS: (juggler seq client .*)$").group(1)
        out.until(r"now voting")
        assert command == f"juggler seq client NAME --servers 127.0.0.1:{port} --tls-ca {certs / 'ca.pem'}"
        done = run(as_run(command.replace("NAME", "orders") + " --count 3"))
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1", "2", "3"]
        clear = run(cli("seq", "client", "orders", "--servers", f"127.0.0.1:{port}", "--count", "1",
                        "--timeout", "1"))
        assert clear.returncode == 1
        assert f"127.0.0.1:{port} speaks TLS: connect over TLS (--tls-ca FILE" in clear.stderr, clear.stderr


def test_balancer_admin_root_lists_its_endpoints(certs: Path) -> None:
    port, admin = free_port(), free_port()
    args = cli("balancer", "--listen", f"127.0.0.1:{port}", "--backends", f"127.0.0.1:{free_port()}",
               "--admin", f"127.0.0.1:{admin}", "--workers", "1",
               "--tls-cert", str(certs / "cert.pem"), "--tls-key", str(certs / "key.pem"))
    with started(args) as out:
        hint = out.until(r"clients verify it with the CA that issued its certificate: (curl .*)$").group(1)
        wait_for_port(admin, timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/", timeout=10) as res:
            index = json.load(res)
        paths = [e["path"] for e in index["endpoints"] if e["method"] == "GET"]
        assert {"/backends", "/stats", "/metrics", "/config", "/healthz"} <= set(paths)
        for path in paths:  # every resource it names answers
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}{path}", timeout=10) as res:
                assert res.status == 200, path
        assert hint == f"curl --cacert {certs / 'ca.pem'} https://127.0.0.1:{port}/"
        # the hint verifies: curl's TLS succeeds (nothing listens at the backend: the balancer's own 502)
        done = subprocess.run([*shlex.split(hint), "-s", "-o", "/dev/null", "-w", "%{http_code}"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "502"
