"""gRPC through the balancer vs through HAProxy: unary calls at C concurrent calls.

    .venv/bin/python benches/balancer/bench_grpc.py --rounds 5 --calls 40000 --out benches/balancer/results/grpc.json

One backend, a light grpc-go server (``benches/balancer/grpcpeer``, built
with ``go build``: it answers any method with its request message), faced
by both balancers, each with one thread: ours ``--workers 1 --backend-proto
h2`` (h2c from the client, detected by its preface; h2c to the backend),
HAProxy 2.6 ``nbthread 1`` with ``bind ... proto h2`` and ``server ...
proto h2`` (``mode http``, ``http-reuse always``). The load generator is
``h2load`` (nghttp2), much lighter than a gRPC library client: ``-c C -m 1``
(C connections, one call in flight on each), POSTing one gRPC-framed
message (``content-type: application/grpc``, ``te: trailers``).

Each round runs both balancers in rotating order, after a warm-up. Per run:
calls/s, mean latency, failures and the balancer's CPU time per call (user
+ system from ``/proc``, ours: the whole process, its idle Python control
plane included). ``h2load`` counts an HTTP 200 as a success whatever its
``grpc-status``; so the backend counts the calls it answered with OK
(``/bench.Echo/Count``, asked directly) and a failure is any call h2load
did not see succeed or the backend did not serve. Medians over rounds are
printed as a Markdown table, with the median of each round's CPU ratio
(ours ÷ HAProxy, the two runs of a round being close in time, which cancels
part of a shared machine's drift); ``--out`` keeps every run and the medians.

``--before TREE`` adds ours from another checkout (its extension built) as
"before", in the same rotation, to compare two versions in one run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from benches.balancer.bench_balancer import Bench, cpu_seconds, descendants, dump_logs, wait_port  # noqa: E402
from benches.common import loadavg, save  # noqa: E402
from tests.netutil import free_port  # noqa: E402

BALANCERS = ["ours", "haproxy"]
METHOD = "/bench.Echo/Unary"


@dataclass
class Run:
    balancer: str
    round: int
    calls: int
    cps: float
    mean_ms: float
    failures: int
    cpu_us_per_call: float


def served(port: int) -> int:
    """Calls the backend answered with OK so far (asked directly)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return int(ch.unary_unary("/bench.Echo/Count")(b"", timeout=10))


def parse_h2load(out: str) -> dict:
    m = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    if m is None:
        raise RuntimeError(f"h2load said:\n{out}")
    total, _done, ok, _failed, _errored = (int(x) for x in m.groups())
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out).group(1)
    n, unit = re.match(r"([\d.]+)(\w+)", mean).groups()
    return {"total": total, "succeeded": ok, "rps": rps,
            "mean_ms": float(n) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]}


class GrpcBench(Bench):
    def build_peer(self) -> str:
        go = shutil.which("go")
        if go is None:
            raise SystemExit("bench_grpc: needs Go to build its backend (benches/balancer/grpcpeer)")
        out = os.path.join(self.dir, "grpcpeer")
        subprocess.run([go, "build", "-o", out, "."], cwd=os.path.join(HERE, "grpcpeer"), check=True,
                       env={**os.environ, "CGO_ENABLED": "0"}, timeout=600)
        return out

    def start_grpc_balancer(self, kind: str, port: int, backend: int, tree: str = ROOT) -> subprocess.Popen:
        if kind in ("ours", "before"):
            return self.start([sys.executable, "-m", "cli", "balancer", "--listen", f"127.0.0.1:{port}",
                               "--backends", f"127.0.0.1:{backend}", "--backend-proto", "h2", "--workers", "1",
                               "--log-level", "WARNING"], cwd=tree)
        cfg = os.path.join(self.dir, f"haproxy-{port}.cfg")
        with open(cfg, "w") as f:
            f.write("global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 3s\n"
                    "  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n  option forwardfor\n"
                    f"frontend f\n  bind 127.0.0.1:{port} proto h2\n  default_backend grpc\n"
                    f"backend grpc\n  http-reuse always\n  server s0 127.0.0.1:{backend} proto h2\n")
        return self.start(["haproxy", "-f", cfg])


def h2load(port: int, calls: int, conc: int, body: str) -> str:
    cmd = ["h2load", "-n", str(calls), "-c", str(conc), "-m", "1", "-d", body,
           "-H", "content-type: application/grpc", "-H", "te: trailers", f"http://127.0.0.1:{port}{METHOD}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=40000, help="calls per run")
    ap.add_argument("--concurrency", type=int, default=100, help="calls in flight (h2load connections)")
    ap.add_argument("--size", type=int, default=16, help="bytes of the request message (echoed back)")
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    ap.add_argument("--before", metavar="TREE", help="also run ours from this checkout (its extension built) as 'before'")
    args = ap.parse_args()
    balancers = BALANCERS + (["before"] if args.before else [])
    for tool in ("h2load", "haproxy"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench_grpc: {tool} is not installed")
    workdir = tempfile.mkdtemp(prefix="bench-grpc-")
    bench = GrpcBench(workdir)
    runs: list[Run] = []
    try:
        peer = bench.build_peer()
        body = os.path.join(workdir, "call.bin")
        with open(body, "wb") as f:
            f.write(b"\0" + struct.pack(">I", args.size) + b"x" * args.size)
        backend = free_port()
        bench.start([peer, f"127.0.0.1:{backend}"])
        wait_port(backend)
        procs = {}
        ports = {}
        for kind in balancers:
            ports[kind] = free_port()
            tree = os.path.abspath(args.before) if kind == "before" else ROOT
            procs[kind] = bench.start_grpc_balancer(kind, ports[kind], backend, tree)
            wait_port(ports[kind])
        for kind in balancers:  # warm-up: connections, caches, the backend's JIT-free but lazy paths
            h2load(ports[kind], max(args.calls // 10, args.concurrency), args.concurrency, body)
        for r in range(args.rounds):
            shift = r % len(balancers)
            order = balancers[shift:] + balancers[:shift]
            for kind in order:
                pids = descendants(procs[kind].pid)
                before, cpu0 = served(backend), cpu_seconds(pids)
                out = parse_h2load(h2load(ports[kind], args.calls, args.concurrency, body))
                cpu1, after = cpu_seconds(pids), served(backend)
                ok = min(out["succeeded"], after - before)
                run = Run(kind, r, out["total"], out["rps"], out["mean_ms"], out["total"] - ok,
                          (cpu1 - cpu0) / max(ok, 1) * 1e6)
                runs.append(run)
                print(f"round {r} {kind:8} {run.cps:9,.0f} calls/s  mean {run.mean_ms:6.2f} ms  "
                      f"CPU {run.cpu_us_per_call:5.1f} µs/call  failures {run.failures}", flush=True)
                time.sleep(0.5)
    except BaseException:
        dump_logs(workdir)
        raise
    finally:
        bench.close()
    rows = []
    print("\n| balancer | calls/s | mean ms | CPU µs/call (min–max) | failures |\n| --- | ---: | ---: | ---: | ---: |")
    for kind in balancers:
        mine = [x for x in runs if x.balancer == kind]
        cpu = [x.cpu_us_per_call for x in mine]
        row = {"balancer": kind, "cps": statistics.median(x.cps for x in mine),
               "mean_ms": statistics.median(x.mean_ms for x in mine), "cpu_us_per_call": statistics.median(cpu),
               "cpu_min": min(cpu), "cpu_max": max(cpu), "failures": sum(x.failures for x in mine)}
        rows.append(row)
        print(f"| {kind} | {row['cps']:,.0f} | {row['mean_ms']:.2f} | {row['cpu_us_per_call']:.1f} "
              f"({row['cpu_min']:.1f}–{row['cpu_max']:.1f}) | {row['failures']} |")
    # each round's two runs are minutes apart at most: their ratio cancels part of the machine's drift
    ratios = sorted(o.cpu_us_per_call / h.cpu_us_per_call for o, h in (
        ([x for x in runs if x.round == r and x.balancer == "ours"][0],
         [x for x in runs if x.round == r and x.balancer == "haproxy"][0]) for r in range(args.rounds)))
    paired = {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}
    print(f"\nCPU per call, ours ÷ HAProxy in the same round: median {paired['median']:.2f} "
          f"({paired['min']:.2f}–{paired['max']:.2f})")
    if args.before:
        vs = sorted(o.cpu_us_per_call / b.cpu_us_per_call for o, b in (
            ([x for x in runs if x.round == r and x.balancer == "ours"][0],
             [x for x in runs if x.round == r and x.balancer == "before"][0]) for r in range(args.rounds)))
        paired["ours_vs_before"] = {"median": statistics.median(vs), "min": vs[0], "max": vs[-1]}
        print(f"CPU per call, ours ÷ before in the same round: median {statistics.median(vs):.2f} "
              f"({vs[0]:.2f}–{vs[-1]:.2f})")
    if args.out:
        save(args.out, {"paired_cpu_ratio": paired,"setup": {"rounds": args.rounds, "calls": args.calls, "concurrency": args.concurrency,
                                  "size": args.size, "haproxy": "2.6", "backend": "grpc-go (grpcpeer)"},
                        "runs": [asdict(x) for x in runs], "medians": rows, "loadavg_after": loadavg()})
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
