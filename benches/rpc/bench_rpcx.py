"""rpcx vs grpc.aio in one run: `juggler rpc serve --example bench` (rpcx on
--listen, grpc.aio on --grpc, one server process) loaded by `juggler rpc bench`
(Hello.Say, 581-byte BenchmarkMessage), printing both reports and the
server's CPU time for each part.

    python benches/rpc/bench_rpcx.py -c 100 -n 200000 --pool 10 --processes 2 --grpc-n 20000

``--pool`` is the total number of connections: rpcx gets ``pool / processes``
per client process (10 = 2 × 5), grpc.aio one process with all of them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from tests.conftest import free_port, wait_for_port  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-c", type=int, default=100)
    p.add_argument("-n", type=int, default=200_000)
    p.add_argument("--pool", type=int, default=10, help="connections in total (split across rpcx client processes)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--grpc-n", type=int, default=20_000)
    a = p.parse_args()
    rpcx, grpc = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cli", "rpc", "serve", "--example", "bench", "--listen", f"127.0.0.1:{rpcx}",
         "--grpc", f"127.0.0.1:{grpc}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(rpcx, proc=server)
        wait_for_port(grpc, proc=server)
        per_process = max(1, a.pool // a.processes)
        for label, addr, n, procs, pool in (("rpcx", f"127.0.0.1:{rpcx}", a.n, a.processes, per_process),
                                            ("grpc.aio", f"grpc://127.0.0.1:{grpc}", a.grpc_n, 1, a.pool)):
            cmd = [sys.executable, "-m", "cli", "rpc", "bench", addr, "-c", str(a.c), "-n", str(n),
                   "--pool", str(pool), "--processes", str(procs)]
            print(f"== {label}: {' '.join(cmd[2:])}", flush=True)
            c0, t0 = cpu_seconds(server.pid), time.monotonic()
            subprocess.run(cmd, cwd=ROOT, check=False)
            c1, t1 = cpu_seconds(server.pid), time.monotonic()
            print(f"server CPU during the run: {c1 - c0:.2f} s over {t1 - t0:.2f} s wall "
                  f"(incl. client start-up)\n", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
