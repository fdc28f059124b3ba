"""What Python's cyclic garbage collector does inside a long-running server.

Runs one ``juggler`` command (``server``, ``callee``, ``rpc serve``, ...) in
this process with a ``gc.callbacks`` hook that counts the collections of
each generation and the time they take, and appends one JSON line per
interval to ``--out`` (time, process CPU, per generation the collections,
their CPU time and their wall time, which also counts the time the process
was not scheduled while it collected: the event loop waited that long): the lines show *when* the collector runs (while connections are
set up, while events are published, at shutdown), which a sampling profile
of a whole run does not separate. Drive the server with the usual load tool
from another shell; stop it with Ctrl-C (the last line is written at exit).

``--tune N`` applies ``cli.lifecycle.settle_collector(N)`` once the command
has started, whatever the command (``juggler server`` does it by itself,
``--gc-threshold``): ``gc.collect()``, ``gc.freeze()`` (start-up objects out
of every later collection) and a first-generation threshold of N instead of
700::

    python benches/gc_activity.py --out /tmp/gc.jsonl -- server --listen 127.0.0.1:8080 --gc-threshold 0
    python benches/gc_activity.py --tune 10000 --out /tmp/gc.jsonl -- rpc serve --example arith
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class Tally:
    """Collections per generation with their CPU and wall time, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.cpu = [0.0, 0.0, 0.0]
        self.wall = [0.0, 0.0, 0.0]
        self._started = (0.0, 0.0)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = (time.thread_time(), time.perf_counter())
        else:
            g = info["generation"]
            self.count[g] += 1
            self.cpu[g] += time.thread_time() - self._started[0]
            self.wall[g] += time.perf_counter() - self._started[1]

    def line(self, t0: float) -> str:
        return json.dumps({"t": round(time.monotonic() - t0, 2), "cpu_s": round(time.process_time(), 3),
                           "collections": self.count, "gc_cpu_s": [round(s, 4) for s in self.cpu],
                           "gc_wall_s": [round(s, 4) for s in self.wall]})


def tune_after_start(threshold: int) -> None:
    """Apply the tried settings once the command's service has started (wraps cli.lifecycle.serve)."""
    from cli import lifecycle

    original = lifecycle.serve

    async def serve(prog: str, start: Any, **kwargs: Any) -> int:
        ready = kwargs.get("ready")

        def settled(service: Any) -> None:
            lifecycle.settle_collector(threshold)
            if ready is not None:
                ready(service)

        kwargs["ready"] = settled
        return await original(prog, start, **kwargs)

    lifecycle.serve = serve  # type: ignore[assignment]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="append one JSON line per interval here")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between lines")
    p.add_argument("--tune", type=int, metavar="N", help="after start-up: collect, freeze, first threshold N")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the juggler command and its arguments, after --")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the juggler command to run after --")
    sys.path.insert(0, str(ROOT))
    tally = Tally()
    gc.callbacks.append(tally)
    if args.tune:
        tune_after_start(args.tune)
    t0 = time.monotonic()
    out = args.out.open("a", buffering=1)

    def tick() -> None:
        while True:
            time.sleep(args.interval)
            out.write(tally.line(t0) + "\n")

    threading.Thread(target=tick, daemon=True, name="gc-activity").start()
    atexit.register(lambda: out.write(tally.line(t0) + "\n"))
    from cli.main import main as juggler

    sys.argv = ["juggler", *command]
    return juggler()


if __name__ == "__main__":
    sys.exit(main())
