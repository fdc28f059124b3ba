"""Every long-running command as a user runs it (real subprocesses): a busy
port is one line and status 2; the first SIGINT/SIGTERM drains and says
what it waits for, the second stops at once; an idle process stops on the
first; batch tools print their partial report on Ctrl-C and leave no child."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.netutil import free_port, wait_for_port

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def juggler(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


class Run:
    """A `juggler …` subprocess with stdout and stderr kept in files (read
    them at any time, never blocking on a pipe)."""

    def __init__(self, args: list[str], cwd: Path | str = ROOT) -> None:
        self.out = tempfile.NamedTemporaryFile("w+", prefix="juggler-out-", delete=False)  # noqa: SIM115
        self.err = tempfile.NamedTemporaryFile("w+", prefix="juggler-err-", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=self.err, cwd=cwd,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def stdout(self) -> str:
        return Path(self.out.name).read_text(errors="replace")

    def stderr(self) -> str:
        return Path(self.err.name).read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30) -> None:
        """Until `text` shows up in stdout or stderr (the process must not exit first)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.stdout() or text in self.stderr():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"{text!r} never came (exit {self.proc.poll()}):\n{self.stdout()}\n{self.stderr()}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for f in (self.out, self.err):
            f.close()
            os.unlink(f.name)


@contextmanager
def running(args: list[str], cwd: Path | str = ROOT) -> Iterator[Run]:
    r = Run(args, cwd)
    try:
        yield r
    finally:
        r.close()


@contextmanager
def busy_port() -> Iterator[int]:
    """A port something else listens on (without SO_REUSEPORT)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def long_running(port: int, tmp: Path, redis_url: str) -> dict[str, list[str]]:
    addr = f"127.0.0.1:{port}"
    return {
        "up": juggler("up", "--listen", addr),
        "server": juggler("server", "--listen", addr),
        "callee": juggler("callee", "--redis", redis_url, "--metrics-port", str(port)),
        "rpc serve": juggler("rpc", "serve", "--listen", addr, "--example", "arith"),
        "seq server": juggler("seq", "server", "--listen", addr, "--data", str(tmp / "seq"), "--bootstrap"),
        "balancer": juggler("balancer", "--listen", addr, "--backends", "127.0.0.1:9"),
    }


@pytest.mark.parametrize("command", ["up", "server", "callee", "rpc serve", "seq server", "balancer"])
def test_a_busy_port_is_one_line_and_status_2(command: str, tmp_path: Path, redis_url: str) -> None:
    with busy_port() as port:
        args = long_running(port, tmp_path, redis_url)[command]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"juggler {command}: cannot listen on 127.0.0.1:{port}: address already in use" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["up", "server", "callee", "rpc serve", "seq server", "balancer"])
def test_an_idle_process_stops_on_the_first_signal(command: str, tmp_path: Path, redis_url: str) -> None:
    port = free_port()
    with running(long_running(port, tmp_path, redis_url)[command]) as r:
        if command == "callee":
            r.wait_for("serving")
        elif command == "seq server":  # its port opens before it has finished starting
            r.wait_for("seq server listening on")
        else:
            wait_for_port(port, timeout=30, proc=r.proc)
        r.signal(signal.SIGTERM)
        assert r.wait(timeout=15) == 0, r.stderr()
        assert f"juggler {command}: stopping" in r.stderr()
        assert "Traceback" not in r.stderr()


async def acked_call(url: str, ms: int, signal_after_ack: Callable[[], None]) -> Any:
    """Call test.delay for `ms` ms; once the server has ACKed it (the call is
    in flight), run `signal_after_ack`; returns the call's outcome."""
    import asyncio

    from juggler.client import ACK, connect

    acked = asyncio.Event()

    def on_message(msg: dict[str, Any], _frame: str) -> None:
        if msg.get("meta", {}).get("type") == ACK:
            acked.set()

    async with connect(url, on_message=on_message) as c:
        call = asyncio.ensure_future(c.call("test.delay", str(ms), timeout=60))
        await asyncio.wait_for(acked.wait(), 10)
        signal_after_ack()
        try:
            return await asyncio.wait_for(call, 30)
        except Exception as exc:
            return exc


def test_the_first_ctrl_c_drains_the_second_stops_now() -> None:
    import asyncio

    from juggler.errors import ConnectionClosed

    port = free_port()
    with running(juggler("up", "--listen", f"127.0.0.1:{port}")) as r:
        wait_for_port(port, timeout=30, proc=r.proc)

        def twice() -> None:
            r.signal(signal.SIGINT)
            r.wait_for("juggler up: draining 1 call for up to 10 s; Ctrl-C again to stop now")
            assert r.proc.poll() is None  # still draining
            r.signal(signal.SIGINT)

        outcome = asyncio.run(acked_call(f"ws://127.0.0.1:{port}/ws", 30000, twice))
        assert isinstance(outcome, ConnectionClosed)
        assert r.wait(timeout=15) == 130
        assert "juggler up: stopping now" in r.stderr()


def test_a_drain_lets_the_call_in_flight_finish() -> None:
    import asyncio

    port = free_port()
    with running(juggler("up", "--listen", f"127.0.0.1:{port}")) as r:
        wait_for_port(port, timeout=30, proc=r.proc)
        outcome = asyncio.run(acked_call(f"ws://127.0.0.1:{port}/ws", 700, lambda: r.signal(signal.SIGTERM)))
        assert outcome == 700  # answered before the server closed the connection
        assert r.wait(timeout=15) == 0
        assert "juggler up: draining 1 call for up to 10 s" in r.stderr()


def test_app_modules_are_found_in_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(
        "class Arith:\n"
        "    async def Mul(self, ctx, args):\n"
        "        return {'C': args['A'] * args['B']}\n"
    )
    port = free_port()
    with running(juggler("rpc", "serve", "--listen", f"127.0.0.1:{port}", "--app", "myapp:Arith"), cwd=tmp_path) as r:
        wait_for_port(port, timeout=30, proc=r.proc)
        done = subprocess.run(juggler("rpc", "call", f"tcp@127.0.0.1:{port}", "Arith.Mul", '{"A":6,"B":7}'),
                              capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert done.stdout.strip() == '{"C": 42}', done.stderr
    missing = subprocess.run(juggler("rpc", "serve", "--listen", "127.0.0.1:0", "--app", "nope:Arith"),
                             capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "cannot import 'nope'" in missing.stderr and str(tmp_path) in missing.stderr


def test_callee_apps_are_found_in_the_current_directory(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "mycallee.py").write_text("def hello(args):\n    return b'\"hi\"'\napp = {'my.hello': hello}\n")
    with running(juggler("callee", "--redis", redis_url, "--app", "mycallee:app"), cwd=tmp_path) as r:
        r.wait_for("serving 1 URIs (my.hello)")
        r.signal(signal.SIGTERM)
        assert r.wait(timeout=15) == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["server", "--set", "server.read_limit=abc"], "juggler server: server.read_limit: expected an integer, got 'abc'"),
        (["server", "--set", "server.nope=1"], "unknown option(s) in [server]: nope"),
        (["up", "--listen", "nowhere"], "listen address must be HOST:PORT"),
        (["load", "--payload", "hello"], "the payload must be JSON"),
        (["server", "--redis", "http://x"], "unsupported Redis URL scheme"),
        (["server", "--bogus"], "unrecognized arguments: --bogus"),
        (["tls", "dev-cert"], "the following arguments are required: --out"),
        (["server", "--gc-threshold", "-1"], "--gc-threshold: expected an integer of 0 or more, got '-1'"),
    ],
)
def test_user_mistakes_are_one_line_and_status_2(args: list[str], says: str) -> None:
    done = subprocess.run(juggler(*args), capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def test_an_unreachable_redis_is_one_line_and_status_1() -> None:
    port = free_port()
    done = subprocess.run(juggler("server", "--redis", f"redis://127.0.0.1:{port}/0", "--listen", "127.0.0.1:0"),
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 1
    assert f"cannot connect to Redis at redis://127.0.0.1:{port}/0" in done.stderr
    assert "Traceback" not in done.stderr


def test_version() -> None:
    from importlib.metadata import version

    done = subprocess.run(juggler("--version"), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == f"juggler {version('juggler-suite')}"


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def test_load_prints_its_partial_report_on_ctrl_c_and_leaves_no_child() -> None:
    port = free_port()
    with running(juggler("up", "--listen", f"127.0.0.1:{port}")) as up:
        wait_for_port(port, timeout=30, proc=up.proc)
        with running(juggler("load", "--url", f"ws://127.0.0.1:{port}/ws", "-c", "4", "--procs", "2",
                             "-d", "60s")) as load:
            load.wait_for("] calls")  # a progress line: the calls are flowing
            kids = children_of(load.proc.pid)
            assert kids  # the worker processes
            load.signal(signal.SIGINT)
            assert load.wait(timeout=30) == 130, load.stderr()
            assert "juggler load: stopping early; Ctrl-C again to stop now" in load.stderr()
            assert "(stopped early)" in load.stdout() and "throughput" in load.stdout()
            assert _all_gone(kids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _all_gone(pids: list[int], timeout: float = 10.0) -> bool:
    """Whether every process in ``pids`` has ended within ``timeout`` seconds
    (multiprocessing's resource tracker ends when it sees its parent's pipe
    close, a moment after the parent exits; a leaked worker never does)."""
    import time

    deadline = time.monotonic() + timeout
    while any(_alive(k) for k in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_rpc_bench_stops_early_with_its_report_and_no_child() -> None:
    with running(juggler("rpc", "bench", "inproc:arith", "-n", "1000000000", "-c", "8", "--processes", "2")) as b:
        import time

        deadline = time.monotonic() + 60
        kids: list[int] = []
        while len(kids) < 2 and time.monotonic() < deadline:
            kids = children_of(b.proc.pid)  # the two client processes (and multiprocessing's helper)
            time.sleep(0.05)
        assert len(kids) >= 2, b.stderr()
        b.signal(signal.SIGINT)
        assert b.wait(timeout=60) == 130, b.stderr()
        assert "(stopped early)" in b.stdout() and "throughput" in b.stdout()
        assert _all_gone(kids), [open(f"/proc/{k}/cmdline").read() for k in kids if _alive(k)]


# -- the garbage collector, settled once a server has started -------------------------


@contextmanager
def _collector_restored() -> Iterator[None]:
    """The test process's collector as it was, whatever the test did to it."""
    import gc

    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_settle_collector_freezes_and_raises_the_first_threshold() -> None:
    import gc

    from cli.lifecycle import settle_collector

    with _collector_restored():
        before = gc.get_threshold()
        settle_collector(0)  # 0: Python's settings untouched
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
        settle_collector(12_345)
        assert gc.get_threshold() == (12_345, *before[1:])
        assert gc.get_freeze_count() > 0
        with pytest.raises(ValueError, match="0 or more"):
            settle_collector(-1)


def test_serve_settles_the_collector_before_ready() -> None:
    import asyncio
    import gc

    from cli.lifecycle import serve

    class Idle:
        async def drain(self, timeout: float | None = None) -> None:
            return None

        def abort(self) -> None:
            return None

    async def start() -> Idle:
        return Idle()

    seen: list[int] = []

    def ready(_: Idle) -> None:
        seen.extend((gc.get_threshold()[0], gc.get_freeze_count()))
        os.kill(os.getpid(), signal.SIGINT)  # handled by serve(): the drain, then status 0

    with _collector_restored():
        status = asyncio.run(serve("test", start, ready=ready, gc_threshold=4_321))
    assert status == 0
    assert seen[0] == 4_321 and seen[1] > 0


def test_a_server_starts_and_stops_with_either_collector_setting() -> None:
    """With --gc-threshold N and with 0 (Python's defaults) the server starts and drains as usual."""
    for threshold in ("20000", "0"):
        port = free_port()
        with running(juggler("server", "--listen", f"127.0.0.1:{port}", "--gc-threshold", threshold)) as r:
            wait_for_port(port)
            r.signal(signal.SIGINT)
            assert r.wait(timeout=30) == 0, r.stderr()
