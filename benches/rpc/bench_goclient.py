"""The rpcx server under rpcx's own Go client: CPU per call, calls/s and
syscalls per call, for one or more checkouts (interleaved rounds) and,
with ``--go-server``, the Go rpcx server under the same client.

The client is the Go interop peer's ``bench`` mode (``tests/rpc/interop/go``,
built here with ``go build``): 100 goroutines share one rpcx XClient (one
connection, calls multiplexed) and make ``-n`` ``Arith.Mul`` calls (JSON) in
all. Each round starts a fresh server per peer (``juggler rpc serve --example
arith`` run from the checkout), runs the client once, and reads the server's
CPU time and read/write syscalls from ``/proc`` over that run. The peers'
order rotates between rounds; the load average is recorded with each round.

    python benches/rpc/bench_goclient.py /tmp/before . --go-server --rounds 5 -n 200000 \\
        --out benches/rpc/results/goclient.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benches.common import free_port, loadavg, proc_cpu_seconds, save, wait_port  # noqa: E402

PEER = ROOT / "tests" / "rpc" / "interop" / "go"


def build_peer(out_dir: str) -> str:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("go is not installed: the Go rpcx client cannot be built")
    out = os.path.join(out_dir, "gopeer")
    subprocess.run([go, "build", "-o", out, "."], cwd=PEER, check=True, timeout=600,
                   env={**os.environ, "CGO_ENABLED": "0"})
    return out


def syscalls(pid: int) -> tuple[int, int]:
    """Read and write syscalls of a live process so far (``/proc/PID/io``)."""
    counts = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            counts[key] = int(value)
    return counts["syscr"], counts["syscw"]


def start_server(peer: str, gopeer: str, port: int) -> subprocess.Popen[bytes]:
    if peer == "go":
        argv = [gopeer, "server", f"127.0.0.1:{port}"]
        cwd, env = None, dict(os.environ)
    else:
        argv = [sys.executable, "-m", "cli", "rpc", "serve", "--example", "arith", "--listen", f"127.0.0.1:{port}"]
        cwd, env = peer, {**os.environ, "PYTHONPATH": peer}
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_round(peer: str, gopeer: str, callers: int, calls: int) -> dict[str, Any]:
    port = free_port()
    server = start_server(peer, gopeer, port)
    try:
        wait_port(port, 60)
        cpu0, (r0, w0), load0 = proc_cpu_seconds(server.pid), syscalls(server.pid), loadavg()
        out = subprocess.run([gopeer, "bench", f"127.0.0.1:{port}", str(callers), str(calls)],
                             capture_output=True, text=True, check=True, timeout=600).stdout.split()
        cpu1, (r1, w1), load1 = proc_cpu_seconds(server.pid), syscalls(server.pid), loadavg()
    finally:
        server.kill()
        server.wait(10)
    seconds = float(out[3])
    return {
        "peer": peer, "calls": calls, "seconds": seconds, "calls_per_s": calls / seconds,
        "server_cpu_us_per_call": (cpu1 - cpu0) / calls * 1e6,
        "reads_per_call": (r1 - r0) / calls, "writes_per_call": (w1 - w0) / calls,
        "load_before": load0, "load_after": load1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="checkouts whose server to measure (native extension in rustext/)")
    parser.add_argument("--go-server", action="store_true", help="also measure the Go rpcx server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", "--calls", type=int, default=200_000, help="calls per round")
    parser.add_argument("-c", "--callers", type=int, default=100, help="goroutines calling at once")
    parser.add_argument("--out", help="write the rounds and medians as JSON here")
    args = parser.parse_args()
    peers = [os.path.abspath(t) for t in args.trees] + (["go"] if args.go_server else [])
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        gopeer = build_peer(tmp)
        for i in range(args.rounds):
            for peer in peers[i % len(peers):] + peers[:i % len(peers)]:
                r = one_round(peer, gopeer, args.callers, args.calls)
                rounds.append(r)
                print(f"round {i + 1} {peer}: {r['calls_per_s']:,.0f} calls/s, server "
                      f"{r['server_cpu_us_per_call']:.2f} µs CPU/call, {r['reads_per_call']:.3f} reads "
                      f"{r['writes_per_call']:.3f} writes per call, load {r['load_after'][0]}", flush=True)
    summary = []
    print("\n| server | calls/s, median [min – max] | server CPU µs/call, median [min – max] | reads / writes per call |")
    print("| --- | ---: | ---: | ---: |")
    for peer in peers:
        rs = [r for r in rounds if r["peer"] == peer]
        tps = [r["calls_per_s"] for r in rs]
        cpu = [r["server_cpu_us_per_call"] for r in rs]
        row = {"peer": peer, "calls_per_s": statistics.median(tps), "server_cpu_us_per_call": statistics.median(cpu),
               "reads_per_call": statistics.median(r["reads_per_call"] for r in rs),
               "writes_per_call": statistics.median(r["writes_per_call"] for r in rs)}
        summary.append(row)
        print(f"| {peer} | {row['calls_per_s']:,.0f} [{min(tps):,.0f} – {max(tps):,.0f}] | "
              f"{row['server_cpu_us_per_call']:.2f} [{min(cpu):.2f} – {max(cpu):.2f}] | "
              f"{row['reads_per_call']:.3f} / {row['writes_per_call']:.3f} |")
    if args.out:
        save(args.out, {"callers": args.callers, "rounds": rounds, "summary": summary})


if __name__ == "__main__":
    main()
