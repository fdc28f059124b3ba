"""Fixtures of the rpc tests: a real etcd (Debian's etcd-server) on free ports."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.netutil import ServerProcess, free_port, wait_for_port


class EtcdServer(ServerProcess):
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_etcd() -> EtcdServer:
    exe = shutil.which("etcd")
    if exe is None:
        pytest.fail("etcd is not installed (scripts/test installs Debian's etcd-server)")
    port, peer = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix="etcd-")
    client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
    args = [
        exe, "--name", "rpc-test", "--data-dir", workdir,
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"rpc-test={peer_url}", "--initial-cluster-state", "new",
        "--log-level", "error", "--logger", "zap",
    ]
    log = open(f"{workdir}/etcd.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    wait_for_port(port, proc=proc, timeout=20)
    # listening is not ready: wait until the member serves requests
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{client_url}/health", timeout=1) as r:
                if b"true" in r.read():
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("etcd did not become healthy")
        time.sleep(0.05)
    return EtcdServer(port=port, proc=proc, dir=workdir)


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
