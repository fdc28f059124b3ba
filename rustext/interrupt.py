"""The two-step Ctrl-C of batch tools (benchmarks, load generators): the
first SIGINT/SIGTERM asks the tool to stop early and keep what it measured
(its partial report is printed), the second stops it now
(KeyboardInterrupt). Worker processes of such tools ignore SIGINT (the
terminal sends it to the whole process group) and follow their parent."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ignore_sigint", "two_step_interrupt"]


@contextlib.contextmanager
def two_step_interrupt(on_first: Callable[[], None], *, prog: str | None = None) -> Iterator[None]:
    """Within the block, the first SIGINT/SIGTERM calls ``on_first`` (and, with
    ``prog``, says so on stderr); the second raises KeyboardInterrupt. Outside
    the main thread it does nothing (signals are the main thread's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    count = 0

    def handler(signum: int, frame: Any) -> None:
        nonlocal count
        count += 1
        if count > 1:
            raise KeyboardInterrupt
        if prog is not None:
            print(f"\n{prog}: stopping early; Ctrl-C again to stop now", file=sys.stderr, flush=True)
        on_first()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def ignore_sigint() -> None:
    """For worker processes: the parent handles Ctrl-C and tells them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
