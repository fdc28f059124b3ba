"""LocalCluster: N ``juggler seq server`` processes on loopback, for tests, benches and
``juggler seq bench``. Real processes, real data directories; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from seq._proto import rrpeer_pb2 as peer_pb
from seq.wire import PeerStub


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free right now: all sockets are held until every port is
    picked (a port freed by one close can be handed out again by the next bind)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Member:
    addr: str
    data: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0  # where the current run's output starts in log_path
    http_addr: str | None = None  # HOST:PORT of its HTTP API (--http), when the cluster has one
    #: its transport port for the other members (--peer-port): chosen with the others, so that
    #: no member's port 0 can be handed a port another member is about to listen on
    peer_port: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """`n` members with data dirs under `root` (a temp dir by default)."""

    n: int = 3
    root: str = ""
    members: list[Member] = field(default_factory=list)
    python: str = sys.executable
    #: members over TLS: a ``rustext.tls.ClientTls`` (CA) to reach them with; start them with the TLS flags
    tls: Any = None
    #: give every member an HTTP API (``--http`` on a free port: ``http_urls``)
    http: bool = False
    _own_root: bool = False

    def __post_init__(self) -> None:
        if not self.root:
            self.root = tempfile.mkdtemp(prefix="seq-cluster-")
            self._own_root = True
        if not self.members:
            n = self.n
            ports = free_ports(3 * n if self.http else 2 * n)
            for i, port in enumerate(ports[:n]):
                self.members.append(
                    Member(
                        addr=f"127.0.0.1:{port}",
                        data=os.path.join(self.root, f"node{i}"),
                        log_path=os.path.join(self.root, f"node{i}.log"),
                        http_addr=f"127.0.0.1:{ports[2 * n + i]}" if self.http else None,
                        peer_port=ports[n + i],
                    )
                )

    @classmethod
    def on(cls, addrs: list[str], *, root: str, http: list[str] | None = None) -> LocalCluster:
        """Members on the given gRPC addresses (and HTTP addresses, when
        given) with their data under `root`, which is kept (``juggler seq
        up``); the peer ports are picked free."""
        peer_ports = free_ports(len(addrs))
        members = [
            Member(addr=addr, data=os.path.join(root, f"node{i}"), log_path=os.path.join(root, f"node{i}.log"),
                   http_addr=http[i] if http else None, peer_port=peer_ports[i])
            for i, addr in enumerate(addrs)
        ]
        return cls(n=len(addrs), root=root, members=members, http=http is not None)

    def busy_ports(self) -> str:
        """The first of the members' addresses something already listens on
        (``HOST:PORT``), or "" when all are free."""
        for m in self.members:
            for addr in (m.addr, m.http_addr):
                if addr is None:
                    continue
                host, _, port = addr.rpartition(":")
                with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        s.bind((host.strip("[]"), int(port)))
                    except OSError:
                        return addr
        return ""

    @property
    def addrs(self) -> list[str]:
        return [m.addr for m in self.members]

    @property
    def http_urls(self) -> list[str]:
        """``http://HOST:PORT`` of each member's HTTP API (a cluster made with ``http=True``)."""
        return [f"http://{m.http_addr}" for m in self.members if m.http_addr is not None]

    def command(self, i: int, *flags: str, peers: list[str] | None = None) -> list[str]:
        """Member i's command line; ``--peers`` lists every other member unless `peers` is given."""
        m = self.members[i]
        peers_arg = ",".join(a for j, a in enumerate(self.addrs) if j != i) if peers is None else ",".join(peers)
        http = ["--http", m.http_addr] if m.http_addr is not None else []
        peer_port = ["--peer-port", str(m.peer_port)] if m.peer_port and "--peer-port" not in flags else []
        # -P: the package installed (or the checkout, in an editable install), never a `cli`
        # folder that happens to be in the working directory
        return [self.python, "-P", "-m", "cli", "seq", "server", "--listen", m.addr, "--data", m.data,
                "--peers", peers_arg, *http, *peer_port, *flags]

    def start(self, i: int, *flags: str, peers: list[str] | None = None) -> subprocess.Popen[bytes]:
        m = self.members[i]
        assert not m.alive, f"member {i} already running"
        logf = open(m.log_path, "ab")
        m.log_offset = logf.seek(0, os.SEEK_END)
        try:
            # a process group of its own: a Ctrl-C at the terminal is the owner's to handle (close()).
            # Not a session of its own: with the kernel's autogroup scheduling each session is
            # scheduled as one group, which cost the cluster ~15% throughput in benchmarks.
            m.proc = subprocess.Popen(self.command(i, *flags, peers=peers), stdout=logf, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, process_group=0)
        finally:
            logf.close()
        return m.proc

    def start_all(self, *flags: str) -> None:
        for i in range(self.n):
            self.start(i, *flags)

    def kill(self, i: int) -> None:
        """kill -9."""
        m = self.members[i]
        if m.proc is not None and m.proc.poll() is None:
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(timeout=10)

    def stop(self, i: int, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; the exit code."""
        m = self.members[i]
        if m.proc is None:
            return None
        if m.proc.poll() is None:
            m.proc.send_signal(signal.SIGTERM)
            try:
                m.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait(timeout=10)
        return m.proc.returncode

    def wipe(self, i: int) -> None:
        assert not self.members[i].alive
        shutil.rmtree(self.members[i].data, ignore_errors=True)

    def output(self, i: int, *, all_runs: bool = False) -> str:
        """What member i printed in its current (or last) run; every run with `all_runs`."""
        try:
            with open(self.members[i].log_path, "rb") as f:
                if not all_runs:
                    f.seek(self.members[i].log_offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def add_member(self) -> int:
        """One more member slot (a free port, a data dir); start it with ``start(i, "--join")``."""
        i = len(self.members)
        port, peer_port, http_port = free_ports(3)
        self.members.append(Member(addr=f"127.0.0.1:{port}", data=os.path.join(self.root, f"node{i}"),
                                   log_path=os.path.join(self.root, f"node{i}.log"),
                                   http_addr=f"127.0.0.1:{http_port}" if self.http else None, peer_port=peer_port))
        self.n = len(self.members)
        return i

    async def state(self, i: int, timeout: float = 1.0) -> int | None:
        """The member's RRPeer state (peer_pb.READY, ...), or None if it does not answer."""
        if self.tls is None:
            channel = grpc.aio.insecure_channel(self.addrs[i])
        else:
            from seq.wire import grpc_credentials

            channel = grpc.aio.secure_channel(self.addrs[i], grpc_credentials(self.tls))
        async with channel as ch:
            try:
                rep = await PeerStub(ch).Snapshot(peer_pb.SnapshotRequest(endpoint_only=True), timeout=timeout)
            except grpc.aio.AioRpcError:
                return None
        return rep.state

    async def wait_ready(self, *indices: int, timeout: float = 30.0) -> None:
        """Until the given members (default: all) vote; raises TimeoutError with their logs."""
        idx = indices or tuple(range(self.n))
        deadline = time.monotonic() + timeout
        for i in idx:
            while True:
                m = self.members[i]
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"member {i} exited with {m.proc.returncode}:\n{self.output(i)}")
                if await self.state(i) == peer_pb.READY:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"member {i} not ready after {timeout}s:\n{self.output(i)}")
                await asyncio.sleep(0.05)

    def close(self, timeout: float = 5.0) -> None:
        """Stop every member (SIGTERM, then SIGKILL after `timeout` s) and remove a temp root."""
        for i in range(self.n):
            self.stop(i, timeout=timeout)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
