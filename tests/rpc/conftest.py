"""Fixtures of the rpc tests: a real etcd (Debian's etcd-server) on free ports."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netutil import ServerProcess, free_port, wait_for_port


class EtcdServer(ServerProcess):
    #: whether clients reach it over HTTPS
    https: bool = False

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.https else 'http'}://127.0.0.1:{self.port}"


def start_etcd(tls: Any = None, ca: str | None = None) -> EtcdServer:
    """A one-member etcd on free ports; with ``tls`` (a tests.tlsutil.Leaf)
    its client URL is HTTPS, and with ``ca`` clients must present a
    certificate signed by it."""
    exe = shutil.which("etcd")
    if exe is None:
        pytest.fail("etcd is not installed (scripts/test installs Debian's etcd-server)")
    port, peer = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix="etcd-")
    client_url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    peer_url = f"http://127.0.0.1:{peer}"
    args = [
        exe, "--name", "rpc-test", "--data-dir", workdir,
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"rpc-test={peer_url}", "--initial-cluster-state", "new",
        "--log-level", "error", "--logger", "zap",
    ]
    context = None
    if tls is not None:
        args += ["--cert-file", str(tls.cert), "--key-file", str(tls.key)]
        if ca is not None:
            args += ["--client-cert-auth", "--trusted-ca-file", ca]
        # the health probe below only waits for the member to serve; it shows the server's own
        # certificate (valid for clients too) where client certificates are required
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(str(tls.cert), str(tls.key))
    log = open(f"{workdir}/etcd.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    wait_for_port(port, proc=proc, timeout=20)
    # listening is not ready: wait until the member serves requests
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{client_url}/health", timeout=1, context=context) as r:
                if b"true" in r.read():
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("etcd did not become healthy")
        time.sleep(0.05)
    server = EtcdServer(port=port, proc=proc, dir=workdir)
    server.https = tls is not None
    return server


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    server = start_etcd()
    yield server
    server.stop(timeout=10)
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    """Endpoint (``http://127.0.0.1:PORT``) of the session's etcd."""
    return etcd_server.endpoint


# a real standalone ZooKeeper for the ZooKeeper registry tests (session-scoped)
from tests.rpc.zookeeper_fixture import zookeeper_server  # noqa: F401
