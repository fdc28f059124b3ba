"""A real Consul agent for the rpc tests: ``consul agent -dev`` (an in-memory
single server) on free loopback ports, DNS and gRPC off, ready once it logs
that it synced its node (it has a leader, so the KV store and sessions work).

The binary is the one ``scripts/install-consul`` builds from Consul's Go
module (v1.14.8, the last MPL-2.0 line buildable from the module proxy;
Debian has no Consul). When it is missing and Go is here, the fixture builds
it (minutes, once); without Go the tests skip, or fail in CI.

Use the ``consul_server`` fixture (session-scoped; import it into a test
module or a conftest).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.netutil import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-consul"
BINARY = ROOT / "build" / "consul" / "v1.14.8" / "consul"

#: the line of the agent's log that says it serves KV and sessions
READY_LINE = "agent: Synced node info"


class ConsulServer(ServerProcess):
    #: the thread copying the agent's output to consul.log (ends with the agent)
    copier: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` of its HTTP API, as Go's plugin and our CLI are given it."""
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the agent, then close the pipe of its output once the copying thread has read it all."""
        super().stop(timeout)
        if self.copier is not None:
            self.copier.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"{why} (in CI the Consul registry tests must run)")
    pytest.skip(why)


def consul_binary() -> Path:
    """The Consul binary, built by scripts/install-consul if missing."""
    if BINARY.is_file():
        return BINARY
    if shutil.which("go") is None:
        _unavailable("Consul is not built and Go is not installed to build it (scripts/install-consul)")
    res = subprocess.run([str(INSTALL)], check=False, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0 or not BINARY.is_file():
        pytest.fail(f"scripts/install-consul failed:\n{res.stderr[-3000:]}")
    return BINARY


def _copy_log(stream: IO[str], sink: IO[str], ready: threading.Event) -> None:
    """Copy the agent's log to ``sink`` and set ``ready`` at ``READY_LINE``
    (or at the end of the log, when the agent exited); closes ``sink`` at the end."""
    with sink:
        for line in stream:
            sink.write(line)
            sink.flush()
            if READY_LINE in line:
                ready.set()
    ready.set()


def start_consul(timeout: float = 30.0) -> ConsulServer:
    exe = consul_binary()
    workdir = tempfile.mkdtemp(prefix="consul-")
    http, server, lan, wan = free_port(), free_port(), free_port(), free_port()
    args = [
        str(exe), "agent", "-dev", "-node", "rpc-test", "-bind", "127.0.0.1", "-client", "127.0.0.1",
        "-http-port", str(http), "-server-port", str(server), "-serf-lan-port", str(lan), "-serf-wan-port", str(wan),
        "-dns-port", "-1", "-grpc-port", "-1", "-data-dir", workdir, "-log-level", "info",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir)
    assert proc.stdout is not None
    ready = threading.Event()
    sink = open(f"{workdir}/consul.log", "w")  # noqa: SIM115 - the copying thread closes it
    copier = threading.Thread(target=_copy_log, args=(proc.stdout, sink, ready), daemon=True)
    copier.start()
    if not ready.wait(timeout) or proc.poll() is not None:
        proc.kill()
        proc.wait(timeout=10)
        copier.join(timeout=5)
        proc.stdout.close()
        log = Path(f"{workdir}/consul.log").read_text()[-2000:]
        raise TimeoutError(f"consul did not become ready in {timeout} s:\n{log}")
    server = ConsulServer(port=http, proc=proc, dir=workdir)
    server.copier = copier
    return server


@pytest.fixture(scope="session")
def consul_server() -> Iterator[ConsulServer]:
    server = start_consul()
    yield server
    server.stop(timeout=10)
    shutil.rmtree(server.dir, ignore_errors=True)
