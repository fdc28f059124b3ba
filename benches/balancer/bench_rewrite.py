"""The cost of a regex route and a path rewrite on the fast path, in the
balancer's CPU time per request, against a plain prefix route; and HAProxy
doing the same (``path_reg`` + ``http-request replace-path``) against its
``path_beg``.

    .venv/bin/python benches/balancer/bench_rewrite.py --rounds 5 --duration 3

Each balancer (ours ``workers = 1``, HAProxy ``nbthread 1``) serves
``wrk -c10`` keep-alive GETs of a 1 KiB file from one nginx backend; the four
cases run in rotating order per round and the balancer's own CPU time
(user + sys from /proc) is divided by the requests served. Ours'
configuration:

- ``prefix``: ``path_prefix = "/app/"`` to the pool, the path forwarded as sent;
- ``regex``: ``path_regex = '^/app/v\\d+/'`` and ``rewrite.replace_path``
  (``'^/app/v\\d+/(.*)$'`` to ``'/app/$1'``), so that the backend gets the
  same path in both cases.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
import bench_balancer  # noqa: E402
from bench_balancer import Bench  # noqa: E402

from benches.common import free_port, save, wait_port  # noqa: E402

CASES = ("ours-prefix", "ours-regex", "haproxy-prefix", "haproxy-regex")
#: name, backends, response size, concurrency, ab requests (as bench_balancer's scenarios)
SCENARIO = ("1KiB-1be-c10", 1, 1024, 10, 0)


def config(case: str, port: int, backend: str, d: str) -> list[str]:
    """The command line of `case`, its configuration written in `d`."""
    kind, routing = case.split("-")
    if kind == "ours":
        route = ('path_prefix = "/app/"\n' if routing == "prefix" else
                 "path_regex = '^/app/v\\d+/'\n"
                 "rewrite = { replace_path = { regex = '^/app/v\\d+/(.*)$', replacement = '/app/$1' } }\n")
        path = os.path.join(d, f"{case}.toml")
        with open(path, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\nworkers = 1\n[backends.web]\nservers = ["{backend}"]\n'
                    f'[[routes]]\n{route}backend = "web"\n')
        return [sys.executable, "-m", "cli", "balancer", "--config", path, "--log-level", "WARNING"]
    rule = ("  use_backend web if { path_beg /app/ }\n" if routing == "prefix" else
            "  acl app path_reg ^/app/v[0-9]+/\n  http-request replace-path ^/app/v[0-9]+/(.*)$ /app/\\1 if app\n"
            "  use_backend web if app\n")  # evaluated after the rewrite: default_backend takes it
    path = os.path.join(d, f"{case}.cfg")
    with open(path, "w") as f:
        f.write("global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 3s\n"
                "  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n  option forwardfor\n"
                f"frontend f\n  bind 127.0.0.1:{port}\n{rule}"
                f"  default_backend web\nbackend web\n  http-reuse always\n  server s0 {backend}\n")
    return ["haproxy", "-f", path]


def measure(case: str, proc: subprocess.Popen, port: int, rnd: int, duration: float) -> float:
    """Microseconds of the balancer's CPU per request of `case` (wrk, keep-alive)."""
    prefix = "/app" if case.endswith("prefix") else "/app/v1"
    r = bench_balancer.measure(case, proc, port, SCENARIO, "wrk", rnd, duration, prefix=prefix)
    if r.failures or not r.requests:
        raise SystemExit(f"{case}: {r.failures} failures, {r.requests} requests")
    return r.cpu_us_per_req


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lbrewrite-") as d:
        os.chmod(d, 0o755)  # nginx workers run as an unprivileged user
        bench = Bench(d)
        be, ports = bench.start_backends(1)
        os.makedirs(os.path.join(d, "www", "app"), exist_ok=True)
        os.link(os.path.join(d, "www", "1024"), os.path.join(d, "www", "app", "1024"))
        backend = f"127.0.0.1:{ports[0]}"
        runs: list[dict] = []
        procs = {}
        try:
            for case in CASES:
                port = free_port()
                procs[case] = (bench.start(config(case, port, backend, d), cwd=ROOT), port)
                wait_port(port)
            for rnd in range(args.rounds):
                order = CASES[rnd % len(CASES):] + CASES[:rnd % len(CASES)]
                for case in order:
                    us = measure(case, *procs[case], rnd, args.duration)
                    runs.append({"case": case, "round": rnd, "cpu_us_per_req": us})
                    print(f"{case:15} r{rnd} {us:6.1f} us/req", flush=True)
        finally:
            for p, _ in procs.values():
                bench.stop(p)
            bench.stop(be)
    med = {c: statistics.median(r["cpu_us_per_req"] for r in runs if r["case"] == c) for c in CASES}
    print("\n| case | CPU µs/req (median) |\n| --- | ---: |")
    for c in CASES:
        print(f"| {c} | {med[c]:.1f} |")
    print(f"\nregex + rewrite ÷ prefix: ours {med['ours-regex'] / med['ours-prefix']:.3f}, "
          f"HAProxy {med['haproxy-regex'] / med['haproxy-prefix']:.3f}; "
          f"ours ÷ HAProxy with regex + rewrite: {med['ours-regex'] / med['haproxy-regex']:.3f}")
    if args.out:
        save(args.out, {"rounds": args.rounds, "duration": args.duration, "runs": runs, "medians": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
