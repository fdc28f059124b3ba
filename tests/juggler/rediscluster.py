"""A real Redis Cluster for the tests and the benchmark: 3 masters + 3 replicas.

Six ``redis-server --cluster-enabled yes`` processes on free loopback ports,
joined with ``redis-cli --cluster create ... --cluster-replicas 1
--cluster-yes``; ready once every node reports ``cluster_state:ok`` and
agrees on the slot map. ``cluster-node-timeout`` is short (1 s) so a killed
master's replica is promoted within a few seconds.

With ``announce``, each node announces another client port (a fault proxy in
front of it: ``cluster-announce-port``), so that clients reach every node,
through redirections and the slot map too, at that port; the cluster bus
stays direct. The helpers below speak to the nodes directly.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.netutil import free_port, redis_tls_args, wait_for_port
from tests.tlsutil import Leaf


@dataclass
class Node:
    port: int
    bus_port: int  # explicit (cluster-port): port + 10000 may not exist
    dir: str
    proc: subprocess.Popen | None = None
    scheme: str = "redis"
    #: the client port the node announces to the cluster (a proxy's), if not its own
    announce_port: int | None = None

    @property
    def public_port(self) -> int:
        """The port clients reach the node at (the slot map and redirections name it)."""
        return self.announce_port or self.port

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.public_port}"


@dataclass
class RedisCluster:
    nodes: list[Node] = field(default_factory=list)
    node_timeout_ms: int = 1000
    #: TLS only (client, cluster bus and replication links): the nodes' certificate and the CA
    tls: tuple[Leaf, str] | None = None

    def _client_kw(self) -> dict[str, Any]:
        if self.tls is None:
            return {}
        return {"ssl": True, "ssl_ca_certs": self.tls[1]}

    @property
    def seeds(self) -> str:
        """Comma-separated seed URLs (what --redis-cluster takes)."""
        return ",".join(n.url for n in self.nodes if n.proc is not None and n.proc.poll() is None)

    @property
    def seed_list(self) -> list[str]:
        return self.seeds.split(",")

    # processes ------------------------------------------------------------

    def _start_node(self, node: Node) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None, "redis-server is not installed"
        ports = ["--port", str(node.port)]
        if self.tls is not None:
            leaf, ca = self.tls
            ports = ["--port", "0", "--tls-port", str(node.port), "--tls-cluster", "yes", "--tls-replication", "yes",
                     *redis_tls_args(leaf, ca)]
        args = [
            exe, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", node.dir, "--logfile", os.path.join(node.dir, "redis.log"),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", str(node.bus_port),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-require-full-coverage", "no", "--cluster-replica-validity-factor", "0",
        ]
        if node.announce_port is not None:
            args += ["--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", str(node.announce_port),
                     "--cluster-announce-bus-port", str(node.bus_port)]
        node.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(node.port, proc=node.proc)

    @classmethod
    def create(cls, masters: int = 3, replicas: int = 1, timeout: float = 60.0,
               tls: tuple[Leaf, str] | None = None, announce: Callable[[Node], int] | None = None) -> RedisCluster:
        """``tls``: (the nodes' certificate, the CA file) for a cluster spoken to
        over TLS only (``rediss://`` seeds). ``announce(node)``: the client port
        ``node`` announces (e.g. a proxy to ``node.port`` made there and then)."""
        cluster = cls(tls=tls)
        scheme = "rediss" if tls else "redis"
        try:
            for _ in range(masters * (1 + replicas)):
                node = Node(port=free_port(), bus_port=free_port(), dir=tempfile.mkdtemp(prefix="redis-cluster-"),
                            scheme=scheme)
                if announce is not None:
                    node.announce_port = announce(node)
                cluster._start_node(node)
                cluster.nodes.append(node)
            cli = shutil.which("redis-cli")
            assert cli is not None, "redis-cli is not installed"
            tls_cli = ["--tls", "--cacert", tls[1]] if tls else []
            subprocess.run(
                [cli, *tls_cli, "--cluster", "create", *(f"127.0.0.1:{n.public_port}" for n in cluster.nodes),
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
            )
            cluster.wait_ok(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(timeout=5)
        for n in self.nodes:
            shutil.rmtree(n.dir, ignore_errors=True)

    # state ----------------------------------------------------------------

    def node_at(self, port: int) -> Node:
        """The node whose own or announced port is ``port``."""
        return next(n for n in self.nodes if port in (n.port, n.public_port))

    def command(self, port: int, *args: str, timeout: float = 2.0) -> str:
        """``args`` run on the node at ``port`` (its own or its announced one), spoken to directly."""
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.node_at(port).port, socket_timeout=timeout, socket_connect_timeout=timeout,
                        decode_responses=True, **self._client_kw())
        try:
            return r.execute_command(*args)  # type: ignore[no-any-return]
        finally:
            r.close()

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def cluster_nodes(self, port: int) -> list[dict[str, str]]:
        raw = self.command(port, "CLUSTER", "NODES")
        if isinstance(raw, dict):  # redis-py may parse it
            out = []
            for addr, info in raw.items():
                out.append({"addr": addr.split("@")[0], "flags": info.get("flags", ""),
                            "slots": " ".join("-".join(s) for s in info.get("slots", [])),
                            "connected": str(info.get("connected"))})
            return out
        rows = []
        for line in raw.splitlines():
            parts = line.split()
            rows.append({"addr": parts[1].split("@")[0], "flags": parts[2], "slots": " ".join(parts[8:]),
                         "connected": str(parts[7] == "connected")})
        return rows

    def masters(self) -> list[int]:
        """Ports of the masters that serve slots, as a live node sees it."""
        port = self.live()[0].port
        out = []
        for row in self.cluster_nodes(port):
            if "master" in row["flags"] and "fail" not in row["flags"] and row["slots"]:
                out.append(int(row["addr"].rsplit(":", 1)[1]))
        return sorted(out)

    def slot_owner(self, slot: int) -> int:
        import redis

        port = self.live()[0].port
        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True, **self._client_kw())
        try:
            for start, end, master, *_ in r.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        finally:
            r.close()
        raise LookupError(f"slot {slot} not served")

    def wait_ok(self, timeout: float = 30.0, *, masters: int = 3) -> None:
        """Until every live node says cluster_state:ok and sees `masters` masters serving slots."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                ok = True
                for n in self.live():
                    info = self.command(n.port, "CLUSTER", "INFO")
                    text = info if isinstance(info, str) else "\r\n".join(f"{k}:{v}" for k, v in info.items())
                    if "cluster_state:ok" not in text:
                        ok = False
                        last = f"{n.port}: not ok"
                        break
                if ok and len(self.masters()) == masters:
                    return
            except Exception as exc:  # a node still starting
                last = str(exc)
            time.sleep(0.1)
        raise TimeoutError(f"cluster not ok after {timeout}s: {last}")

    def kill(self, port: int) -> Node:
        """SIGKILL the node on `port` (its own or its announced one)."""
        node = self.node_at(port)
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=5)
        return node

    def wait_promoted(self, slot: int, old_master: int, timeout: float = 30.0) -> int:
        """Until a live node other than `old_master` serves `slot` as a master
        and the cluster is ok again; returns its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                owner = self.slot_owner(slot)
                if owner != old_master:
                    self.wait_ok(max(0.1, deadline - time.monotonic()))
                    return owner
            except (LookupError, OSError, Exception):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"slot {slot} still not served by a promoted replica after {timeout}s")

    def restart(self, node: Node) -> None:
        """Start a killed node again (it rejoins as a replica)."""
        self._start_node(node)

    def flushall(self) -> None:
        for port in self.masters():
            self.command(port, "FLUSHALL")
