"""Helpers of the juggler tests: real `juggler` processes on free ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.netutil import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]


def juggler(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


class Proc:
    """A `juggler ...` subprocess whose output goes to a temp file (read it on failure)."""

    def __init__(self, args: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="juggler-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()
        code = self.proc.returncode
        try:
            os.unlink(self.log.name)
        except OSError:
            pass
        return code


@contextmanager
def juggler_listening(*args: str, exits_clean: bool = False) -> Iterator[str]:
    """`juggler *args --listen` on a free port; yields its ws URL once it
    accepts connections, stops it after (``exits_clean``: and checks it
    exited 0). A process that does not come up fails with its output."""
    port = free_port()
    p = Proc(juggler(*args, "--listen", f"127.0.0.1:{port}"))
    try:
        try:
            wait_for_port(port, timeout=30, proc=p.proc)
        except Exception as exc:
            raise RuntimeError(f"juggler {args[0]} did not start: {exc}\n{p.output()}") from exc
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        code = p.stop()
    assert not exits_clean or code == 0, f"juggler {args[0]} exited with {code}"


def juggler_up() -> contextlib.AbstractContextManager[str]:
    """`juggler up` (server + in-memory broker + test callees); yields the ws URL."""
    return juggler_listening("up")


def juggler_server(redis_url: str, *extra: str) -> contextlib.AbstractContextManager[str]:
    """`juggler server --redis URL` on a free port; yields the ws URL."""
    return juggler_listening("server", "--redis", redis_url, *extra)
