"""The raw-request battery (tests/balancer/hostile.py) against our balancer
and against HAProxy, each in front of a strict h11 origin.

Ours must refuse every case marked ``refuse``, forward every valid one,
never let a malformed request reach the origin, refuse everything HAProxy
refuses, and keep serving afterwards. The outcomes of both are written to
``artifacts/hostile-requests.md`` (the table of the docs' security page).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from balancer_helpers import lb_config
from hostile import CASES, Outcome, StrictOrigin, run_case

import rustext
from tests.netutil import free_port, wait_for_port

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

#: refused on the fast path; on hyper's path forwarded normalized, well-formed: Content-Length
#: dropped for Transfer-Encoding (RFC 9112 §6.3 allows it), the fragment dropped from the target
NORMALIZED_BY_HYPER = {"Content-Length and Transfer-Encoding", "Transfer-Encoding and Content-Length",
                       "fragment in target"}


@pytest.fixture
async def origin() -> AsyncIterator[StrictOrigin]:
    o = StrictOrigin()
    await o.start()
    yield o
    await o.aclose()


def start_haproxy(origin_port: int) -> tuple[subprocess.Popen[bytes], int]:
    if shutil.which("haproxy") is None:
        why = "HAProxy is not installed: the comparison cannot run"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"{why} (the test command installs it)")
        pytest.skip(why)
    port = free_port()
    cfg = Path(tempfile.mkdtemp(prefix="haproxy-")) / "haproxy.cfg"
    cfg.write_text(
        "global\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 3s\n  timeout client 5s\n"
        "  timeout server 5s\n  timeout http-request 5s\n  option http-keep-alive\n"
        f"frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n"
        f"backend b\n  server s 127.0.0.1:{origin_port}\n")
    proc = subprocess.Popen(["haproxy", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc=proc)
    return proc, port


def check_ours(case_name: str, expect: str, o: Outcome) -> list[str]:
    problems = []
    if o.forwarded_malformed:
        problems.append(f"{case_name}: a malformed request reached the origin ({o.forwarded[0].what})")
    if expect == "refuse" and not o.refused:
        problems.append(f"{case_name}: not refused ({o.describe()})")
    if expect == "forward" and not o.forwarded_ok:
        problems.append(f"{case_name}: not forwarded ({o.describe()})")
    return problems


async def test_battery_against_ours_and_haproxy(origin: StrictOrigin) -> None:
    assert len(CASES) >= 40
    lb = rustext.Balancer(lb_config([f"127.0.0.1:{origin.port}"], workers=1, retries=0))
    lb.start()
    haproxy, hport = start_haproxy(origin.port)
    rows = ["| case | expected | ours | HAProxy 2.6 |", "| --- | --- | --- | --- |"]
    problems: list[str] = []
    try:
        for case in CASES:
            ours = await run_case(lb.address[1], origin, case)
            theirs = await run_case(hport, origin, case)
            problems += check_ours(case.name, case.expect, ours)
            if theirs.refused and not ours.refused:
                problems.append(f"{case.name}: HAProxy refuses it, ours does not ({ours.describe()})")
            rows.append(f"| {case.name} | {case.expect} | {ours.describe()} | {theirs.describe()} |")
        # and the balancer goes on serving
        valid = next(c for c in CASES if c.name == "GET")
        assert (await run_case(lb.address[1], origin, valid)).forwarded_ok
    finally:
        haproxy.kill()
        haproxy.wait(timeout=10)
        lb.close()
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "hostile-requests.md").write_text("\n".join(rows) + "\n")
    assert not problems, "\n".join(problems)


async def test_battery_over_the_hyper_path(origin: StrictOrigin) -> None:
    """With TLS to backends off but the fast path left after a first
    request that it does not take (a chunked POST), the rest of a keep-alive
    connection is served by hyper: the same cases, each after such a
    request on one connection, are refused or forwarded well-formed."""
    import asyncio
    import socket

    lb = rustext.Balancer(lb_config([f"127.0.0.1:{origin.port}"], workers=1, retries=0))
    lb.start()
    first = b"POST /ok HTTP/1.1\r\nHost: origin.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    problems: list[str] = []
    try:
        for case in CASES:
            if case.name in ("leading empty line", "a TLS ClientHello"):
                continue  # only meaningful at the start of a connection
            before = len(origin.received)

            def exchange() -> bytes:
                with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=5) as s:
                    s.sendall(first)
                    got = b""
                    while b"\r\n\r\nok" not in got:
                        chunk = s.recv(65536)
                        if not chunk:
                            return got
                        got += chunk
                    s.sendall(case.raw)
                    s.shutdown(socket.SHUT_WR)
                    rest = b""
                    try:
                        while chunk := s.recv(65536):
                            rest += chunk
                    except OSError:
                        pass
                    return rest

            rest = await asyncio.to_thread(exchange)
            await asyncio.sleep(0.05)
            arrived = origin.received[before + 1:]
            status = rest[9:12].decode("latin-1") if rest.startswith(b"HTTP/1.") else "closed"
            o = Outcome(status, arrived)
            if o.forwarded_malformed:
                problems.append(f"{case.name}: a malformed request reached the origin")
            if case.expect == "refuse" and arrived and case.name not in NORMALIZED_BY_HYPER:
                problems.append(f"{case.name}: forwarded on hyper's path ({o.describe()})")
    finally:
        lb.close()
    assert not problems, "\n".join(problems)


def test_per_client_connection_limit(backends: object) -> None:
    """``max_client_connections``: past it, a client's new connections are
    closed at accept; others, and the same client once below it, are served."""
    import socket
    import time

    bks = backends(1)  # type: ignore[operator]
    lb = rustext.Balancer(lb_config(bks, limits={"max_client_connections": 2}))
    lb.start()
    port = lb.address[1]

    def open_served() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(b"GET /whoami HTTP/1.1\r\nHost: t\r\n\r\n")
            got = b""
            while not got.endswith(b"b0"):
                chunk = s.recv(4096)
                assert chunk, "closed before the response"
                got += chunk
        except BaseException:
            s.close()  # refused (the slot not given back yet): not left to the garbage collector
            raise
        return s

    try:
        first, second = open_served(), open_served()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as third:
            third.sendall(b"GET /whoami HTTP/1.1\r\nHost: t\r\n\r\n")
            try:
                assert third.recv(4096) == b""
            except ConnectionResetError:
                pass
        assert lb.stats()["clients_refused"] == 1
        first.close()
        deadline = time.monotonic() + 10
        while True:  # the slot is given back when the balancer sees the close
            try:
                open_served().close()
                break
            except (AssertionError, ConnectionResetError):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        second.close()
    finally:
        lb.close()
    with pytest.raises(rustext.BalancerConfigError, match="max_client_connections"):
        lb_config(limits={"max_client_connections": -1})


def test_open_connection_limit_queues_new_connections(backends: object) -> None:
    """``max_open_connections`` (HAProxy's maxconn): with two connections open
    over two listeners and two workers, a third is not accepted (its request
    waits in the kernel's queue, unanswered); once one of the two closes, it
    is served, as is every connection after."""
    import socket

    bks = backends(1)  # type: ignore[operator]
    listeners = [{"address": "127.0.0.1:0", "default_backend": "p"} for _ in range(2)]
    lb = rustext.Balancer(lb_config(listeners=listeners, backends={"p": {"servers": [bks[0].address]}},
                                    limits={"max_open_connections": 2}))
    lb.start()
    ports = [a[1] for a in lb.addresses]
    request = b"GET /whoami HTTP/1.1\r\nHost: t\r\n\r\n"

    def answer(s: socket.socket) -> bytes:
        got = b""
        while not got.endswith(b"b0"):
            chunk = s.recv(4096)
            assert chunk, f"closed before the response: {got!r}"
            got += chunk
        return got

    conns: list[socket.socket] = []
    try:
        for port in ports:
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            conns[-1].sendall(request)
            assert answer(conns[-1]).startswith(b"HTTP/1.1 200")
        waiting = socket.create_connection(("127.0.0.1", ports[1]), timeout=10)  # the kernel completes it
        conns.append(waiting)
        waiting.sendall(request)
        waiting.settimeout(1.0)
        with pytest.raises(TimeoutError):
            waiting.recv(4096)  # not accepted: nothing read, nothing answered
        conns.pop(0).close()
        waiting.settimeout(10)
        assert answer(waiting).startswith(b"HTTP/1.1 200")
        # two open again (the second and the one that waited): the first listener waits too
        late = socket.create_connection(("127.0.0.1", ports[0]), timeout=10)
        conns.append(late)
        late.sendall(request)
        late.settimeout(1.0)
        with pytest.raises(TimeoutError):
            late.recv(4096)
        conns.pop(0).close()
        late.settimeout(10)
        assert answer(late).startswith(b"HTTP/1.1 200")
    finally:
        for s in conns:
            s.close()
        lb.close()
    with pytest.raises(rustext.BalancerConfigError, match="max_open_connections"):
        lb_config(limits={"max_open_connections": -1})
