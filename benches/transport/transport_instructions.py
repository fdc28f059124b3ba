"""Instructions per request of the transport's echo, server and client side,
for comparing two trees.

CPU time per request swings by tens of percent on a shared machine; callgrind's
instruction counts do not. For each tree, the echo server of ``juggler rpc
transport-bench`` (``python -m rpc.transport.bench transport ENDPOINT``) and a
client making ``-n`` requests of ``--payload`` bytes, one at a time on one
connection (nothing batched, so the count does not depend on timing), both run
under callgrind; each once idle (the client connects and makes no request) and
once busy. The differences over the requests are each side's cost per request,
start-up removed.

    python benches/transport/transport_instructions.py /tmp/before . -n 1500 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benches.common import free_port, instructions, under_callgrind, wait_port  # noqa: E402

# The client, run with ``python -c`` from the tree under test (so that it
# imports that tree's transport): N requests one at a time on one connection.
CLIENT = """
import os, sys
import uvloop
from rpc.transport import TransportPool

async def main(endpoint, n, payload):
    data = os.urandom(payload)
    async with TransportPool("rpcx") as pool:
        conn = await pool.get(endpoint)
        for _ in range(n):
            r = await conn.request(data)
            if len(r.payload) != payload:
                raise SystemExit("echo mismatch")

uvloop.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def run(tree: str, n: int, payload: int) -> tuple[int, int]:
    """One server and one client under callgrind: their instructions."""
    port = free_port()
    py = sys.executable
    # the echo server runs until its stdin closes (instructions() closes it)
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         py, "-m", "rpc.transport.bench", "transport", f"tcp://127.0.0.1:{port}"],
        cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_port(port)
        client = under_callgrind([py, "-c", CLIENT, f"tcp://127.0.0.1:{port}", str(n), str(payload)], tree)
        client_err = client.communicate(timeout=3600)[1]
        if client.returncode != 0:
            raise SystemExit(f"client failed:\n{client_err[-2000:]}")
        found = re.search(r"Collected : (\d+)", client_err)
        if not found:
            raise SystemExit(f"callgrind printed no total for the client:\n{client_err[-2000:]}")
        return instructions(server), int(found.group(1))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="checkouts to compare (the first is the reference)")
    parser.add_argument("-n", "--requests", type=int, default=1500)
    parser.add_argument("--payload", type=int, default=4096)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for tree in args.trees:
        tree = os.path.abspath(tree)
        s0, c0 = run(tree, 0, args.payload)
        s1, c1 = run(tree, args.requests, args.payload)
        row = {"tree": tree, "requests": args.requests, "payload": args.payload,
               "server_per_request": round((s1 - s0) / args.requests),
               "client_per_request": round((c1 - c0) / args.requests)}
        results.append(row)
        first = results[0]
        print(f"{tree}: server {row['server_per_request'] / 1000:.1f}k, client {row['client_per_request'] / 1000:.1f}k "
              f"instructions per request ({row['server_per_request'] / first['server_per_request']:.3f}×, "
              f"{row['client_per_request'] / first['client_per_request']:.3f}× the first)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results}, f, indent=2)


if __name__ == "__main__":
    main()
