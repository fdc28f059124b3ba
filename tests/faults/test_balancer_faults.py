"""The balancer under backend faults: a real balancer process (``juggler balancer``)
in front of real backends, toxiproxy between them, and small hand-made backends for
what toxiproxy cannot do (slow headers, a reset mid-body).

Promises checked (docs/balancer.md, "Under faults"): every request is answered
or its connection closed within the configured timeouts (502/503/504, never a
hang); idempotent requests are retried on another server; the balancer does
not crash; it serves again as soon as the fault ends; its descriptors come back
to their level; a client that stops reading does not grow its memory.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.balancer.balancer_helpers import BackendProc, start_backend
from tests.faults.conftest import fd_count, rss_kib
from tests.faults.toxiproxy import Toxiproxy
from tests.netutil import free_port, wait_for_port
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]

#: the balancer's timeouts in these tests (seconds): short, so that a fault shows within a test
CONNECT, RESPONSE = 1.0, 1.5
#: how long a failing server is ejected (passive health): the bound on recovery
COOLDOWN = 2.0
#: slack over a timeout for a loaded machine
SLACK = 3.0


@dataclass
class Balancer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str = "/whoami", timeout: float = 15.0) -> tuple[int, bytes, float]:
        """(status, body, seconds taken) of one GET on a new connection."""
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read(), time.monotonic() - t0
        finally:
            c.close()

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the balancer exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}"


@pytest.fixture
def balancer(tmp_path: Path) -> Iterator[Callable[..., Balancer]]:
    """``balancer(servers, retries=0, tables="")``: a balancer process in front of ``servers``
    (``tables``: more TOML tables of its file)."""
    started: list[Balancer] = []

    def start(servers: list[str], retries: int = 0, tables: str = "") -> Balancer:
        port = free_port()
        cfg = tmp_path / f"lb{len(started)}.toml"
        listed = ", ".join(f'"{s}"' for s in servers)
        cfg.write_text(
            f'listen = "127.0.0.1:{port}"\nworkers = 1\nbackends = [{listed}]\nretries = {retries}\n'
            f"[timeouts]\nconnect = {CONNECT}\nresponse = {RESPONSE}\n"
            f"[passive]\ncooldown = {COOLDOWN}\n{tables}\n")
        log = tmp_path / f"lb{len(started)}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", str(cfg)],
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        lb = Balancer(proc, port, log)
        started.append(lb)
        wait_for_port(port, timeout=30, proc=proc)
        return lb

    yield start
    for lb in started:
        if lb.proc.poll() is None:
            lb.proc.terminate()
            try:
                lb.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                lb.proc.kill()
                lb.proc.wait(timeout=5)


@pytest.fixture
def backend() -> Iterator[BackendProc]:
    b = start_backend("b0")
    yield b
    b.kill()


def settle(lb: Balancer, level: int, timeout: float = 10.0) -> None:
    """Wait until the balancer holds no more descriptors than ``level`` (bounded)."""
    deadline = time.monotonic() + timeout
    while fd_count(lb.pid) > level:
        assert time.monotonic() < deadline, f"descriptors stay at {fd_count(lb.pid)} > {level}"
        time.sleep(0.05)  # another process's descriptor table: there is no event to await


def baseline(lb: Balancer) -> int:
    """The balancer's descriptors once warm, plus room for pooled backend connections."""
    assert lb.get()[0] == 200
    return fd_count(lb.pid) + 2


def recovers(lb: Balancer, bound: float = COOLDOWN + SLACK) -> float:
    """Seconds until a request is served again (fails after ``bound``)."""
    t0 = time.monotonic()
    while True:
        try:
            status, _, _ = lb.get(timeout=bound)
            if status == 200:
                return time.monotonic() - t0
        except (OSError, http.client.HTTPException):
            pass
        assert time.monotonic() - t0 < bound, f"not served again within {bound}s"
        time.sleep(0.05)  # a new request is the only way to see it served


def test_a_backend_that_stops_answering_is_a_504_within_the_response_timeout(
        toxiproxy: Toxiproxy, backend: BackendProc, balancer: Callable[..., Balancer]) -> None:
    link = toxiproxy.link("lb-silent", backend.address)
    lb = balancer([link.address])
    level = baseline(lb)
    link.toxic("timeout", timeout=0)  # accepted, forwarded, never answered
    for _ in range(3):
        status, _, took = lb.get()
        assert status == 504 and took < RESPONSE + SLACK, (status, took)
    link.clear()
    assert recovers(lb) < COOLDOWN + SLACK
    settle(lb, level)
    lb.alive()


def test_a_backend_gone_is_a_502_or_503_at_once_and_back_when_it_is(
        toxiproxy: Toxiproxy, backend: BackendProc, balancer: Callable[..., Balancer]) -> None:
    link = toxiproxy.link("lb-gone", backend.address)
    lb = balancer([link.address])
    level = baseline(lb)
    link.disable()
    for _ in range(3):
        status, _, took = lb.get()
        assert status in (502, 503) and took < CONNECT + SLACK, (status, took)
    link.enable()
    assert recovers(lb) < COOLDOWN + SLACK  # an ejected server is back after its cooldown at most
    settle(lb, level)
    lb.alive()


def test_get_is_retried_on_another_server_after_a_reset(
        toxiproxy: Toxiproxy, backend: BackendProc, balancer: Callable[..., Balancer]) -> None:
    bad = toxiproxy.link("lb-reset", backend.address)
    bad.toxic("reset_peer", timeout=0)  # every connection reset as soon as it carries data
    good = start_backend("b1")
    try:
        lb = balancer([bad.address, good.address], retries=2)
        for _ in range(10):
            status, body, took = lb.get()
            assert (status, body) == (200, b"b1") and took < SLACK, (status, body, took)
        lb.alive()
    finally:
        good.kill()


class HandMade:
    """A one-thread backend misbehaving in a way toxiproxy cannot: ``mode`` is
    ``slow-headers`` (a header line every 0.2 s, never the end of the head) or
    ``reset-mid-body`` (half of a promised body, then RST)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                if self.mode == "slow-headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    while not self.stop.wait(0.2):
                        conn.sendall(b"X-Slow: 1\r\n")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 500000)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass  # the balancer gave up on us: what is tested

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def test_slow_headers_are_a_504_within_the_response_timeout(balancer: Callable[..., Balancer]) -> None:
    slow = HandMade("slow-headers")
    try:
        lb = balancer([slow.address])
        for _ in range(2):
            status, _, took = lb.get()
            assert status == 504 and took < RESPONSE + SLACK, (status, took)
        lb.alive()
    finally:
        slow.close()


def test_a_reset_mid_body_ends_the_client_response_and_nothing_hangs(balancer: Callable[..., Balancer]) -> None:
    bad = HandMade("reset-mid-body")
    try:
        lb = balancer([bad.address])
        level = fd_count(lb.pid) + 2
        for _ in range(3):
            t0 = time.monotonic()
            c = http.client.HTTPConnection("127.0.0.1", lb.port, timeout=15)
            try:
                c.request("GET", "/big")
                r = c.getresponse()
                assert r.status == 200  # the head was forwarded before the reset
                with pytest.raises((http.client.IncompleteRead, ConnectionError)):
                    r.read()  # cut short, never a complete-looking body
            finally:
                c.close()
            assert time.monotonic() - t0 < SLACK
        settle(lb, level)
        lb.alive()
    finally:
        bad.close()


def test_a_tls_backend_failing_its_handshake_is_a_502_and_one_that_stalls_a_timeout(
        toxiproxy: Toxiproxy, balancer: Callable[..., Balancer], pki: TestPKI, tmp_path: Path) -> None:
    stranger = TestPKI(tmp_path / "other").leaf("127.0.0.1")  # a certificate the balancer does not trust
    s = start_backend("stranger", tls=(str(stranger.cert), str(stranger.key)))
    leaf = pki.leaf("127.0.0.1")
    t = start_backend("trusted", tls=(str(leaf.cert), str(leaf.key)))
    try:
        tls = f'[tls]\nbackend = true\nbackend_ca = "{pki.ca}"'
        lb = balancer([s.address], tables=tls)
        for _ in range(2):
            status, _, took = lb.get()
            assert status in (502, 503) and took < SLACK, (status, took)
        link = toxiproxy.link("lb-tls", t.address)
        lb2 = balancer([link.address], tables=tls)
        level = baseline(lb2)
        link.toxic("timeout", timeout=0)  # the handshake's ServerHello never comes
        status, _, took = lb2.get()
        assert status in (502, 503, 504) and took < CONNECT + RESPONSE + SLACK, (status, took)
        link.clear()
        assert recovers(lb2) < COOLDOWN + SLACK
        settle(lb2, level)
        lb.alive()
        lb2.alive()
    finally:
        s.kill()
        t.kill()


def test_clients_that_stop_reading_hold_no_memory_and_others_are_served(
        backend: BackendProc, balancer: Callable[..., Balancer]) -> None:
    lb = balancer([backend.address])
    level = baseline(lb)
    rss0 = rss_kib(lb.pid)
    size = 16_000_000
    stalled = []
    try:
        for _ in range(8):  # 128 MB asked for, none of it read
            s = socket.create_connection(("127.0.0.1", lb.port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(f"GET /size/{size} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            s.recv(1)  # the response has begun
            stalled.append(s)
        for _ in range(20):  # meanwhile, other clients are served in full
            status, body, _ = lb.get("/size/100000")
            assert status == 200 and len(body) == 100000
        grown = rss_kib(lb.pid) - rss0
        assert grown < 48_000, f"the balancer grew by {grown} KiB for clients that do not read"
    finally:
        for s in stalled:
            s.close()
    settle(lb, level)
    lb.alive()
