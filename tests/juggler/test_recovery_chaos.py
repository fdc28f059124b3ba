"""Recovery under failures, with real processes: a browser client (juggler.js
under Node) subscribed through one server, a publisher at a steady rate
through another, both over a real Redis or a real 6-node Redis Cluster. The
client's server is killed (SIGKILL) and restarted; on the cluster, the
master holding the channel's history is killed and a replica takes over.
The client must end with every acknowledged event exactly once, in order,
or have been told explicitly that events were not recovered."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from juggler.broker.cluster import key_slot
from juggler.broker.history import history_key
from juggler.client import connect
from juggler.errors import JugglerError

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "tests" / "js"
CHANNEL = "chaos.1"

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("node") is None or not (JS / "node_modules" / "ws").exists(),
                       reason="needs node and tests/js/node_modules (npm ci in tests/js)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    """``juggler server`` with a config file, on a fixed port (restartable)."""

    def __init__(self, tmp: Path, broker_toml: str) -> None:
        self.port = free_port()
        self.config = tmp / f"juggler-{self.port}.toml"
        self.config.write_text(
            f'[server]\nlisten = "127.0.0.1:{self.port}"\nlog_connections = false\n{broker_toml}\n'
            '[[channels]]\nmatch = "chaos.*"\nhistory_size = 100000\nhistory_ttl = 600\n')
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "server", "--config", str(self.config)],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert self.proc.poll() is None, "the server exited at start"
                time.sleep(0.05)
        raise TimeoutError(f"server on {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Subscriber:
    """The browser client under Node, its event lines collected by a thread."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(["node", "subscriber.mjs", url, CHANNEL], cwd=JS, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"output": raw.decode(errors="replace")}
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, pred: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    notes = [x for x in self.lines if "args" not in x]
                    raise AssertionError(f"no {what} within {timeout}s; {len(self.lines)} lines, last: "
                                         f"{self.lines[-3:]}; other lines: {notes[:20]}")
                self.cond.wait(left)

    def events(self) -> list[Any]:
        with self.cond:
            return [line["args"] for line in self.lines if "args" in line]

    def unrecovered(self) -> int:
        with self.cond:
            return sum(1 for line in self.lines if "unrecovered" in line)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        self._thread.join(10)
        self.proc.stdout.close()


class Publisher:
    """Publishes 0, 1, 2, … at a steady rate through its own server; remembers what was ACKed."""

    def __init__(self, url: str, rate: float = 100.0) -> None:
        self.url = url
        self.rate = rate
        self.acked: list[int] = []
        self.uncertain: list[int] = []  # no answer: may or may not have been published
        self.stop = asyncio.Event()

    async def run(self) -> None:
        seq = 0
        async with connect(self.url) as client:
            t0 = time.monotonic()
            while not self.stop.is_set():
                try:
                    await client.pub(CHANNEL, seq, timeout=2.0)
                    self.acked.append(seq)
                except (JugglerError, TimeoutError):
                    self.uncertain.append(seq)
                seq += 1
                await asyncio.sleep(max(0.0, t0 + seq / self.rate - time.monotonic()))


def check(sub: Subscriber, pub: Publisher) -> None:
    got = sub.events()
    assert len(got) == len(set(got)), "an event was delivered twice"
    assert got == sorted(got), "events out of order"
    allowed = set(pub.acked) | set(pub.uncertain)
    assert set(got) <= allowed, "an event nobody published"
    missing = set(pub.acked) - set(got)
    if missing:
        assert sub.unrecovered() > 0, f"{len(missing)} acknowledged events lost without a notice"


async def chaos(tmp: Path, broker_toml: str, failover: Any = None) -> tuple[Subscriber, Publisher]:
    near = ServerProc(tmp, broker_toml)  # the client's server: killed and restarted
    far = ServerProc(tmp, broker_toml)  # the publisher's
    near.start()
    far.start()
    sub = Subscriber(near.url)
    pub = Publisher(far.url)
    loop = asyncio.get_running_loop()
    task: asyncio.Task[None] | None = None
    try:
        await loop.run_in_executor(None, sub.wait_for, lambda ls: any("subscribed" in x for x in ls), 30,
                                   "subscription")
        task = loop.create_task(pub.run())  # from now on, every event is the subscriber's
        await loop.run_in_executor(None, sub.wait_for, lambda ls: sum("args" in x for x in ls) >= 50, 30,
                                   "first events")
        near.kill()
        await asyncio.sleep(1.0)  # published meanwhile: to be recovered
        await loop.run_in_executor(None, near.start)
        n = len(sub.events())
        await loop.run_in_executor(None, sub.wait_for, lambda ls: sum("args" in x for x in ls) >= n + 100, 30,
                                   "events after the restart")
        if failover is not None:
            await failover()
            n = len(sub.events())
            await loop.run_in_executor(None, sub.wait_for, lambda ls: sum("args" in x for x in ls) >= n + 100,
                                       60, "events after the failover")
        pub.stop.set()
        await task

        def settled(lines: list[dict[str, Any]]) -> bool:
            seen = {x["args"] for x in lines if "args" in x}
            return set(pub.acked) <= seen or any("unrecovered" in x for x in lines)

        try:
            await loop.run_in_executor(None, sub.wait_for, settled, 30, "every acknowledged event")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; published {len(pub.acked)} acked, {len(pub.uncertain)} uncertain, "
                                 f"last acked {pub.acked[-1:]}, missing {sorted(set(pub.acked) - set(sub.events()))[:30]}") from None
        await asyncio.sleep(0.3)  # stragglers would show as duplicates
        return sub, pub
    finally:
        pub.stop.set()
        if task is not None and not task.done():
            task.cancel()
        sub.close()
        near.stop()
        far.stop()


async def test_server_killed_and_restarted_on_redis(tmp_path: Path, redis_url: str) -> None:
    sub, pub = await chaos(tmp_path, f'[redis]\nurl = "{redis_url}"\n')
    check(sub, pub)
    # a server restart loses nothing that Redis kept: recovered, not just reported
    assert sub.unrecovered() == 0
    assert set(pub.acked) <= set(sub.events())


async def test_server_restart_and_master_failover_on_cluster(tmp_path: Path, redis_cluster: Any,
                                                             cluster_seeds: str) -> None:
    seeds = ", ".join(f'"{s}"' for s in cluster_seeds.split(","))
    slot = key_slot(history_key(CHANNEL))
    killed: list[Any] = []

    async def failover() -> None:
        victim = redis_cluster.slot_owner(slot)
        killed.append(redis_cluster.kill(victim))
        await asyncio.get_running_loop().run_in_executor(None, redis_cluster.wait_promoted, slot, victim, 60.0)

    try:
        sub, pub = await chaos(tmp_path, f"[redis]\ncluster = [{seeds}]\ncluster_retry_timeout = 30\n", failover)
    finally:
        for node in killed:
            redis_cluster.restart(node)
        redis_cluster.wait_ok(60)
    check(sub, pub)
    # the replica's replication id differs: positions from before are not trusted
    assert sub.unrecovered() >= 1 or set(pub.acked) <= set(sub.events())

