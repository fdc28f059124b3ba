"""Instructions the rpcx server executes per call, for comparing two trees.

The rpc twin of ``benches/juggler/server_instructions.py`` (see there why
instruction counts: CPU time per call swings ±10% between runs here, and a
change to the request path moves it by a few percent). ``juggler rpc serve
--example`` runs under valgrind's callgrind twice per tree, once idle and
once answering ``-n`` calls from ``juggler rpc bench`` with one caller on
one connection (one call at a time: nothing is batched, so the count does
not depend on timing); the difference over the calls is the server's cost
per call, start-up removed.

Each tree is a checkout with the native extension in ``rustext/``. Needs
``valgrind``::

    python benches/rpc/server_instructions.py /tmp/before . /tmp/before . --out results.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benches.common import compare_instructions, free_port, instructions, under_callgrind, wait_port  # noqa: E402


def run(tree: str, example: str, calls: int) -> int:
    """One server lifetime under callgrind, answering `calls` calls: its instructions."""
    port = free_port()
    py = sys.executable
    server = under_callgrind([py, "-m", "cli", "rpc", "serve", "--example", example,
                              "--listen", f"127.0.0.1:{port}"], tree)
    try:
        wait_port(port)
        if calls:
            subprocess.run(
                [py, "-m", "cli", "rpc", "bench", "--example", example, "-c", "1", "--pool", "1",
                 "-n", str(calls), "--timeout", "60", f"127.0.0.1:{port}"],
                capture_output=True, text=True, check=True,
            )
        return instructions(server)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="checkouts to compare (the first is the reference)")
    parser.add_argument("--example", choices=("arith", "bench"), default="arith",
                        help="arith: Arith.Mul in JSON; bench: Hello.Say with the 581-byte protobuf message")
    parser.add_argument("-n", "--calls", type=int, default=5000, help="calls per busy run")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = compare_instructions(
        args.trees, lambda tree, busy: (run(tree, args.example, args.calls if busy else 0), args.calls))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"example": args.example, "calls": args.calls, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
