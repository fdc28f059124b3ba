"""Helpers of the juggler tests: real `juggler` processes on free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import free_port, wait_for_port

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
def juggler_up() -> Iterator[str]:
    """`juggler up` (server + in-memory broker + test callees); yields the ws URL."""
    port = free_port()
    p = Proc(juggler("up", "--listen", f"127.0.0.1:{port}"))
    try:
        try:
            wait_for_port(port, timeout=30, proc=p.proc)
        except Exception as exc:
            raise RuntimeError(f"juggler up did not start: {exc}\n{p.output()}") from exc
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        p.stop()


@contextmanager
def juggler_server(redis_url: str, *extra: str) -> Iterator[str]:
    """`juggler server --redis URL` on a free port; yields the ws URL."""
    port = free_port()
    p = Proc(juggler("server", "--redis", redis_url, "--listen", f"127.0.0.1:{port}", *extra))
    try:
        try:
            wait_for_port(port, timeout=30, proc=p.proc)
        except Exception as exc:
            raise RuntimeError(f"juggler server did not start: {exc}\n{p.output()}") from exc
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        p.stop()
