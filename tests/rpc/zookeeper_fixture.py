"""A real ZooKeeper (Debian's ``zookeeper`` package, 3.8) for the rpc tests:
standalone ``ZooKeeperServerMain`` on a free loopback port in a temporary
directory, ready once ``srvr`` reports it serving (``ruok`` answers ``imok``
before sessions can be opened).

The session timeouts it grants are bounded to [1 s, 4 s] (``tickTime`` 500 ms),
so a killed client's ephemeral nodes go within seconds: rpcx-zookeeper asks
for 10 s, which ZooKeeper lowers to the bound. The admin server (port 8080)
is off; of the four-letter words only ``ruok`` and ``srvr`` answer.

Use the ``zookeeper_server`` fixture (session-scoped; import it into a test
module or a conftest).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netutil import ServerProcess, free_port

#: what Debian's zookeeper package installs (scripts/test installs it when this is missing)
ZK_SERVER_SH = Path("/usr/share/zookeeper/bin/zkServer.sh")
ZK_JAR = Path("/usr/share/java/zookeeper.jar")


class ZooKeeperServer(ServerProcess):
    @property
    def hosts(self) -> str:
        """``127.0.0.1:PORT``, as clients are given it."""
        return f"127.0.0.1:{self.port}"


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """ZooKeeper's answer to a four-letter word (``srvr`` → its version, mode, counters)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def start_zookeeper(timeout: float = 30.0, *, port: int | None = None, workdir: str | None = None) -> ZooKeeperServer:
    """A standalone ZooKeeper on a free port, serving sessions (bounded wait);
    ``port`` and ``workdir`` of a stopped one start it again with its data."""
    java = shutil.which("java")
    if java is None or not ZK_SERVER_SH.exists() or not ZK_JAR.exists():
        why = "ZooKeeper is not installed (scripts/test installs Debian's zookeeper package)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    port = port or free_port()
    workdir = workdir or tempfile.mkdtemp(prefix="zookeeper-")
    cfg = Path(workdir) / "zoo.cfg"
    cfg.write_text(
        "tickTime=500\n"
        f"dataDir={workdir}/data\n"
        f"clientPort={port}\n"
        "clientPortAddress=127.0.0.1\n"
        "minSessionTimeout=1000\n"
        "maxSessionTimeout=4000\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok,srvr\n"
    )
    log = open(f"{workdir}/zookeeper.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [java, "-Xmx256m", "-cp", str(ZK_JAR), "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
        stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
    )
    log.close()
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            output = Path(f"{workdir}/zookeeper.log").read_text(errors="replace")
            raise RuntimeError(f"ZooKeeper exited with {proc.returncode}:\n{output}")
        try:
            # "imok" comes before sessions are served; "srvr" names the mode only once they are
            if "Mode: standalone" in four_letter(port, "srvr", timeout=0.5):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=5)
            raise TimeoutError(f"ZooKeeper did not serve on 127.0.0.1:{port} within {timeout:g} s")
        time.sleep(0.05)  # the JVM starting: nothing to wait on but the port
    return ZooKeeperServer(port=port, proc=proc, dir=workdir)


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    server = start_zookeeper()
    yield server
    server.stop(timeout=10)
    shutil.rmtree(server.dir, ignore_errors=True)
