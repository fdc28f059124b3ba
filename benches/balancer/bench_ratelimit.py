"""What a refused request costs: our rate limit vs HAProxy's stick table, in the same run.

    .venv/bin/python benches/balancer/bench_ratelimit.py --rounds 5 --duration 3 --out benches/balancer/results/ratelimit.json

Backends are nginx (one process, one worker) serving a 1 KiB file on four
loopback ports; ours runs ``--workers 1`` and HAProxy ``nbthread 1``, each
in three configurations, started side by side:

- ``plain``: no rate limit (the baseline proxied request);
- ``pass``: a rate limit per client address so high that every request
  passes (the table's cost on a proxied request);
- ``deny``: a limit of one request per second per client address, so that
  wrk's requests (at tens of thousands per second) are nearly all refused
  with 429 (the cost of a refusal: no backend is asked).

Ours: ``[rate_limit] rate = "…/s"``. HAProxy: ``stick-table type ip size 100k
expire 10s store http_req_rate(1s)``, ``http-request track-sc0 src`` and
``http-request deny deny_status 429 if { sc_http_req_rate(0) gt N }``.
``wrk -c10`` (keep-alive) runs against each in rotating order per round;
the balancer's CPU time (user+sys from /proc) is divided by the requests
answered. 429s are expected in ``deny`` and counted apart; socket errors
are failures. Medians over rounds are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from bench_balancer import Bench, cpu_seconds, descendants, dump_logs, wait_port  # noqa: E402
from benches.common import loadavg, save  # noqa: E402
from tests.netutil import free_port  # noqa: E402

SIZE = 1024
CONCURRENCY = 10
MODES = ("plain", "pass", "deny")
#: requests per second per client address of each mode (None: no limit)
RATES = {"plain": None, "pass": 100_000_000, "deny": 1}


@dataclass
class Run:
    balancer: str
    mode: str
    round: int
    requests: int
    rps: float
    status_429: int
    failures: int
    cpu_us_per_req: float


def start(bench: Bench, kind: str, mode: str, port: int, backends: list[int]):
    addrs = [f"127.0.0.1:{p}" for p in backends]
    rate = RATES[mode]
    if kind == "ours":
        text = f'listen = "127.0.0.1:{port}"\nworkers = 1\nbackends = [{", ".join(repr(a) for a in addrs)}]\n'
        text = text.replace("'", '"')
        if rate is not None:
            text += f'[rate_limit]\nrate = "{rate}/s"\n'
        path = os.path.join(bench.dir, f"ours-{port}.toml")
        with open(path, "w") as f:
            f.write(text)
        p = bench.start([sys.executable, "-m", "cli", "balancer", "--config", path, "--log-level", "WARNING"],
                        cwd=ROOT)
    else:
        limit = ""
        if rate is not None:
            limit = ("  stick-table type ip size 100k expire 10s store http_req_rate(1s)\n"
                     "  http-request track-sc0 src\n"
                     f"  http-request deny deny_status 429 if {{ sc_http_req_rate(0) gt {rate} }}\n")
        cfg = os.path.join(bench.dir, f"haproxy-{port}.cfg")
        with open(cfg, "w") as f:
            f.write("global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 3s\n"
                    "  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n  option forwardfor\n"
                    f"frontend f\n  bind 127.0.0.1:{port}\n{limit}"
                    "  default_backend b\nbackend b\n  balance roundrobin\n  http-reuse always\n"
                    + "".join(f"  server s{i} {a}\n" for i, a in enumerate(addrs)))
        p = bench.start(["haproxy", "-f", cfg])
    wait_port(port)
    return p


def measure(kind: str, mode: str, proc, port: int, rnd: int, duration: float) -> Run:
    url = f"http://127.0.0.1:{port}/{SIZE}"
    subprocess.run(["wrk", "-t1", f"-c{CONCURRENCY}", "-d1s", url], capture_output=True, timeout=60)
    pids = descendants(proc.pid)
    c0 = cpu_seconds(pids)
    out = subprocess.run(["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{max(1, round(duration))}s", url],
                         capture_output=True, text=True, timeout=120).stdout
    cpu = cpu_seconds(pids) - c0
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    errors = 0
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        errors = sum(int(x) for x in m.groups())
    # in "deny" the non-2xx are the expected 429s; elsewhere any is a failure
    failures = errors + (0 if mode == "deny" else non2xx)
    return Run(kind, mode, rnd, requests, rps, non2xx if mode == "deny" else 0, failures,
               cpu * 1e6 / max(requests, 1))


def table(runs: list[Run]) -> str:
    out = ["| balancer | mode | req/s | CPU µs/req (min–max) | 429 share | failures |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
    for kind in ("ours", "haproxy"):
        for mode in MODES:
            rs = [r for r in runs if r.balancer == kind and r.mode == mode]
            if not rs:
                continue
            cpu = [r.cpu_us_per_req for r in rs]
            share = sum(r.status_429 for r in rs) / max(sum(r.requests for r in rs), 1)
            out.append(f"| {kind} | {mode} | {statistics.median(r.rps for r in rs):,.0f} | "
                       f"{statistics.median(cpu):.1f} ({min(cpu):.1f}–{max(cpu):.1f}) | {share:.4f} | "
                       f"{sum(r.failures for r in rs)} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    args = ap.parse_args()
    for tool in ("nginx", "haproxy", "wrk"):
        if shutil.which(tool) is None:
            print(f"{tool} is required (apt-get install nginx haproxy wrk)", file=sys.stderr)
            return 1
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="lbbench-rl-") as d:
        os.chmod(d, 0o755)  # nginx workers run as an unprivileged user
        bench = Bench(d)
        try:
            be, ports = bench.start_backends(4)
            setups = [(k, m) for m in MODES for k in ("ours", "haproxy")]
            lbs = {s: free_port() for s in setups}
            procs = {s: start(bench, s[0], s[1], lbs[s], ports) for s in setups}
            for rnd in range(args.rounds):
                shift = rnd % len(setups)
                for s in setups[shift:] + setups[:shift]:
                    r = measure(s[0], s[1], procs[s], lbs[s], rnd, args.duration)
                    runs.append(r)
                    print(f"{s[0]:8} {s[1]:6} r{rnd} {r.rps:9.0f} req/s cpu {r.cpu_us_per_req:6.1f} us/req "
                          f"429 {r.status_429} fail {r.failures}", flush=True)
            for p in procs.values():
                bench.stop(p)
            bench.stop(be)
        except Exception:
            dump_logs(d)
            raise
        finally:
            bench.close()
    print()
    print(table(runs))
    if args.out:
        save(args.out, {"setup": {"rounds": args.rounds, "duration": args.duration, "size": SIZE,
                                  "concurrency": CONCURRENCY, "rates": RATES},
                        "runs": [asdict(r) for r in runs], "table": table(runs), "loadavg_after": loadavg()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
