"""Instructions the juggler server (or callee) executes per call, for comparing two trees.

CPU time per call on a shared 2-core machine swings by ±10% between runs,
which hides the few-percent changes a refactor of the hot path can make.
Instruction counts under valgrind's callgrind do not swing: the same tree
gives the same count to within a fraction of a percent. So this runs the
server under callgrind twice per tree (once idle, once serving a fixed
number of calls at a fixed rate from ``juggler load``) and reports the
difference divided by the calls: the server's own cost per call, start-up
removed. Redis and the callee run natively beside it. With ``--process
callee`` the callee is the one counted, the server running natively.

Keep the rate low: callgrind slows the server some fifty times, and a
server that cannot keep up batches several messages per wake-up, which
lowers the count per call by as much as a fifth and makes it depend on
timing again. At 50 calls/s two runs of one tree agree within 0.2%.

Each tree is a checkout (``git worktree add /tmp/before <rev>``) with the
native extension in ``rustext/`` (copy the built ``_native*.so`` across when
the Rust side did not change). Needs ``valgrind``::

    python benches/juggler/server_instructions.py /tmp/before . /tmp/before . --out results.json
    python benches/juggler/server_instructions.py --process callee /tmp/before . --out results.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benches.common import compare_instructions, free_port, instructions, under_callgrind, wait_port  # noqa: E402


def wait_blocked(redis_port: int, timeout: float) -> None:
    """Until two clients of Redis block on a pop (the server's results
    listener and the callee's calls): the callee is ready."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = subprocess.run(["redis-cli", "-p", str(redis_port), "CLIENT", "LIST"], capture_output=True, text=True)
        if out.stdout.count("cmd=blmpop") + out.stdout.count("cmd=brpop") >= 2:
            return
        time.sleep(1)
    raise SystemExit(f"no callee blocked on Redis within {timeout:.0f}s")


def run(tree: str, seconds: int, rate: int, process: str = "server") -> tuple[int, int]:
    """One lifetime of `process` (server or callee) under callgrind: (instructions, calls answered)."""
    redis_port, ws_port = free_port(), free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    py = sys.executable
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    procs = [redis]
    try:
        wait_port(redis_port)
        callee_argv = [py, "-m", "cli", "callee", "--redis", redis_url, "--workers", "50", "--log-level", "WARNING"]
        server_argv = [py, "-m", "cli", "server", "--redis", redis_url, "--listen", f"127.0.0.1:{ws_port}",
                       "--log-level", "WARNING"]
        native, counted = (callee_argv, server_argv) if process == "server" else (server_argv, callee_argv)
        procs.append(subprocess.Popen(native, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        server = under_callgrind(counted, tree)
        procs.append(server)
        wait_port(ws_port, timeout=900)  # under callgrind, on a busy machine, start-up takes minutes
        if process == "callee":
            wait_blocked(redis_port, 900)  # the calls go out once it waits for them
        calls = 0
        if seconds:
            out = subprocess.run(
                [py, "-m", "cli", "load", "--url", f"ws://127.0.0.1:{ws_port}/ws",
                 "-d", f"{seconds}s", "-c", "4", "-r", str(rate), "--quiet", "--json",
                 "--timeout", "60s"],
                capture_output=True, text=True, check=True,
            )
            calls = int(json.loads(out.stdout)["results"])
        return instructions(server), calls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="checkouts to compare (the first is the reference)")
    parser.add_argument("--seconds", type=int, default=30, help="how long to send calls")
    parser.add_argument("--rate", type=int, default=50, help="calls per second in total (keep it low: see above)")
    parser.add_argument("--process", choices=("server", "callee"), default="server",
                        help="the process whose instructions are counted [%(default)s]")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = compare_instructions(args.trees, lambda tree, busy: run(tree, args.seconds if busy else 0, args.rate, args.process))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"process": args.process, "seconds": args.seconds, "rate": args.rate, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
