"""Helpers of the tests that run `juggler` as a user does: real
subprocesses, their output read line by line with bounded waits."""

from __future__ import annotations

import queue
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


def run(args: list[str], *, stdin: str = "", cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def as_run(printed: str) -> list[str]:
    """A command line as a start line printed it, with `juggler` run from this checkout."""
    words = shlex.split(printed)
    assert words[0] == "juggler", printed
    return cli(*words[1:])


class Lines:
    """The output lines of a process, read by a thread (waits are bounded)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        self.reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def drain(self, timeout: float = 10) -> str:
        """Once the process ended: every line it printed (read or not yet), as one text."""
        self.reader.join(timeout=timeout)
        while True:
            try:
                line = self._q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.seen.append(line)
        return "\n".join(self.seen)

    def until(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """The first line (from here on) matching `pattern`."""
        while True:
            try:
                line = self._q.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + "\n".join(self.seen)) from None
            if line is None:
                raise AssertionError(f"the process ended before {pattern!r}:\n" + "\n".join(self.seen))
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found


@contextmanager
def started(args: list[str], cwd: Path | None = None) -> Iterator[Lines]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    lines = Lines(proc)
    try:
        yield lines
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        lines.reader.join(timeout=10)  # to the end of its output, then the pipe is closed
        assert proc.stdout is not None
        proc.stdout.close()


