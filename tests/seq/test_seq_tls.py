"""seq over TLS: a real 3-member cluster of ``juggler seq server`` processes
started with ``--tls-cert/--tls-key/--tls-ca`` (certificates of the test
CA). RRSeq and grpcio's TLS channel draw IDs; a client without TLS, or
trusting another CA, is refused; the peer listener wants a member's
certificate; SIGHUP serves a new certificate to new connections."""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rpc.transport.connection import connect
from rpc.transport.errors import TransportLayerError
from rustext.tls import ClientTls
from seq import RRSeq
from seq._proto import rrseq_pb2 as pb
from seq.errors import SeqUnavailable
from seq.localcluster import LocalCluster
from seq.wire import ApiStub, grpc_credentials
from tests.tlsutil import TestPKI, served_serial

pytestmark = [pytest.mark.timeout(180)]


class TlsCluster:
    def __init__(self, cluster: LocalCluster, pki: TestPKI, cert: Path, key: Path) -> None:
        self.cluster, self.pki, self.cert, self.key = cluster, pki, cert, key


@pytest.fixture
async def tls_cluster(pki: TestPKI, tmp_path: Path) -> AsyncIterator[TlsCluster]:
    leaf = pki.leaf()
    # files of their own, so that a test can replace them and send SIGHUP
    cert, key = tmp_path / "member.pem", tmp_path / "member-key.pem"
    cert.write_bytes(leaf.cert.read_bytes())
    key.write_bytes(leaf.key.read_bytes())
    c = LocalCluster(3, tls=ClientTls(ca=str(pki.ca)))
    c.start_all("--bootstrap", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(pki.ca))
    try:
        await c.wait_ready(timeout=60)
        yield TlsCluster(c, pki, cert, key)
    finally:
        c.close()


async def serial_of(addr: str, ca: Path) -> int:
    host, _, port = addr.rpartition(":")
    return await served_serial(host, int(port), ca, alpn=["h2"])


async def test_rrseq_and_grpcio_draw_ids_over_tls(tls_cluster: TlsCluster) -> None:
    c, pki = tls_cluster.cluster, tls_cluster.pki
    async with RRSeq("tls", 0, c.addrs, tls=ClientTls(ca=str(pki.ca)), timeout=10) as s:
        ids = [await s.next() for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    async with grpc.aio.secure_channel(c.addrs[1], grpc_credentials(ClientTls(ca=str(pki.ca)))) as ch:
        rep = await ApiStub(ch).NextID(pb.NextIDRequest(name="tls", range_size=10), timeout=10)
    assert rep.from_id > ids[-1]


async def test_clients_that_cannot_verify_are_refused(tls_cluster: TlsCluster, tmp_path: Path) -> None:
    c = tls_cluster.cluster
    other = TestPKI(tmp_path / "other")
    with pytest.raises(SeqUnavailable, match="server certificate refused: unable to get local issuer"):
        async with RRSeq("tls", 0, c.addrs, tls=ClientTls(ca=str(other.ca)), timeout=2) as s:
            await s.next()
    with pytest.raises(SeqUnavailable):
        async with RRSeq("tls", 0, c.addrs, timeout=2) as s:  # plaintext HTTP/2 to a TLS port
            await s.next()


async def test_the_peer_listener_wants_a_member_certificate(tls_cluster: TlsCluster) -> None:
    """The member-to-member transport is mutual TLS: a client that trusts
    the CA but shows no certificate is refused."""
    from rpc.transport.timer import DeadlineScheduler
    from seq import peerlink

    c, pki = tls_cluster.cluster, tls_cluster.pki
    log = c.output(0)
    port = int(log.split("peer port ", 1)[1].split(" ", 1)[0].rstrip(","))
    scheduler = DeadlineScheduler(asyncio.get_running_loop(), lambda key: None)
    ctx = ClientTls(ca=str(pki.ca)).context()
    with pytest.raises((TransportLayerError, ssl.SSLError, ConnectionError, OSError)):
        conn = await asyncio.wait_for(
            connect(f"tcp://127.0.0.1:{port}", peerlink.PROTOCOL, peerlink.CONNECTION_CONFIG, scheduler, tls=ctx), 5)
        # TLS 1.3: the refusal of a missing client certificate arrives after the handshake
        await conn.request(peerlink.pack([0]), timeout=5)


async def test_sighup_serves_a_new_certificate(tls_cluster: TlsCluster) -> None:
    c, pki = tls_cluster.cluster, tls_cluster.pki
    before = await serial_of(c.addrs[0], pki.ca)
    fresh = pki.leaf(name="fresh")
    tls_cluster.cert.write_bytes(fresh.cert.read_bytes())
    tls_cluster.key.write_bytes(fresh.key.read_bytes())
    proc: Any = c.members[0].proc
    proc.send_signal(signal.SIGHUP)
    for _ in range(100):
        if "TLS certificate reloaded" in c.output(0):
            break
        await asyncio.sleep(0.05)
    assert "TLS certificate reloaded" in c.output(0)
    assert await serial_of(c.addrs[0], pki.ca) != before
    async with RRSeq("after-hup", 0, c.addrs, tls=ClientTls(ca=str(pki.ca)), timeout=10) as s:
        assert await s.next() >= 1


async def test_member_commands_over_tls(tls_cluster: TlsCluster) -> None:
    """juggler seq member talks to the members' peer listeners, which want a member's certificate."""
    import json
    import subprocess
    import sys

    c, pki = tls_cluster.cluster, tls_cluster.pki
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(tls_cluster.cert), "--tls-key", str(tls_cluster.key)]

    def member(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", "seq", "member", *args], capture_output=True,
                              text=True, timeout=60, check=False)

    out = await asyncio.to_thread(member, "list", "--servers", c.addrs[0], "--json", *tls)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["members"] == sorted(c.addrs)
    out = await asyncio.to_thread(member, "list", "--servers", c.addrs[0], "--timeout", "1")
    assert out.returncode == 1 and "no member of a cluster answered" in out.stderr
    out = await asyncio.to_thread(member, "list", "--servers", c.addrs[0], "--tls-ca", str(pki.ca))
    assert out.returncode == 2 and "--tls-cert" in out.stderr
    d = c.add_member()
    c.start(d, "--join", "--tls-cert", str(tls_cluster.cert), "--tls-key", str(tls_cluster.key),
            "--tls-ca", str(pki.ca))
    out = await asyncio.to_thread(member, "add", c.addrs[d], "--servers", ",".join(c.addrs[:3]), *tls)
    assert out.returncode == 0, out.stderr
    await c.wait_ready(d)
    async with RRSeq("tls-members", 0, [c.addrs[d]], tls=ClientTls(ca=str(pki.ca)), timeout=10) as s:
        assert await s.next() == 1
