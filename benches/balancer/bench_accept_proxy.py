"""What reading a PROXY protocol header costs: accept_proxy on vs off.

    .venv/bin/python benches/balancer/bench_accept_proxy.py --rounds 5 --duration 3

A connection per request (the worst case: one header per request), 1 KiB
responses from an nginx backend. Four measured balancers, one thread each:
ours and HAProxy, each with ``accept_proxy`` / ``bind … accept-proxy`` and
without. Each sits behind its own HAProxy front (``server … send-proxy`` to
the accept-proxy ones), which ``wrk -H "Connection: close"`` loads, so both
sides of a pair do the same work but for the header. Started once, measured
in rotating order per round. Reported: medians over rounds of requests/s
and the measured balancer's CPU time per request (user+sys from /proc; the
fronts are not counted), failures (socket errors + non-2xx).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from bench_balancer import Bench, cpu_seconds, descendants, parse_wrk, wait_port  # noqa: E402

from benches.common import loadavg, save  # noqa: E402

from tests.netutil import free_port  # noqa: E402

def start_all(b: Bench, backend: int) -> dict[str, tuple[list[int], int]]:
    """Each measured balancer (its pids) behind its own HAProxy front, which
    sends the PROXY header to the accept_proxy ones; the port wrk loads."""
    out = {}
    for proxy in (False, True):
        targets = {}
        port = free_port()
        cfg = os.path.join(b.dir, f"ours-{port}.toml")
        with open(cfg, "w") as f:
            f.write(f'workers = 1\nbackends = ["127.0.0.1:{backend}"]\n[[listeners]]\naddress = "127.0.0.1:{port}"\n'
                    f'default_backend = "default"\naccept_proxy = {"true" if proxy else "false"}\n')
        p = b.start([sys.executable, "-m", "cli", "balancer", "--config", cfg, "--log-level", "WARNING"], cwd=ROOT)
        targets[f"ours{' accept_proxy' if proxy else ''}"] = (p, port)
        port = free_port()
        cfg = os.path.join(b.dir, f"haproxy-{port}.cfg")
        with open(cfg, "w") as f:
            f.write(HAPROXY + f"frontend f\n  bind 127.0.0.1:{port}{' accept-proxy' if proxy else ''}\n"
                    f"  default_backend b\nbackend b\n  http-reuse always\n  server s 127.0.0.1:{backend}\n")
        targets[f"haproxy{' accept-proxy' if proxy else ''}"] = (b.start(["haproxy", "-f", cfg]), port)
        for name, (p, port) in targets.items():
            wait_port(port)
            front = free_port()
            cfg = os.path.join(b.dir, f"front-{front}.cfg")
            with open(cfg, "w") as f:
                f.write(HAPROXY + f"frontend f\n  bind 127.0.0.1:{front}\n  default_backend b\n"
                        f"backend b\n  server s 127.0.0.1:{port}{' send-proxy' if proxy else ''}\n")
            b.start(["haproxy", "-f", cfg])
            out[name] = (p, front)
    for _, port in out.values():
        wait_port(port)
    return {name: (descendants(p.pid), port) for name, (p, port) in out.items()}


HAPROXY = ("global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 3s\n"
           "  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    args = ap.parse_args()
    load_before = loadavg()
    d = tempfile.mkdtemp(prefix="bench-pp-")
    os.chmod(d, 0o755)  # nginx workers run as an unprivileged user
    b = Bench(d)
    try:
        _, (backend,) = b.start_backends(1)
        balancers = start_all(b, backend)
        results: dict[str, list[tuple[float, float, int]]] = {k: [] for k in balancers}
        names = list(balancers)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                pids, port = balancers[name]
                cpu0 = cpu_seconds(pids)
                run = subprocess.run(["wrk", "--latency", "-t1", f"-c{args.connections}", f"-d{args.duration:g}s",
                                      "-H", "Connection: close", f"http://127.0.0.1:{port}/1024"],
                                     capture_output=True, text=True, check=False)
                if run.returncode != 0:
                    raise SystemExit(f"wrk failed against {name}: {run.stdout}{run.stderr}")
                out = run.stdout
                cpu = cpu_seconds(pids) - cpu0
                r = parse_wrk(out)
                results[name].append((r["rps"], cpu * 1e6 / max(r["requests"], 1), r["failures"]))
                time.sleep(0.2)
        print(f"| balancer | requests/s | CPU µs/request | failures |  ({args.rounds} rounds of "
              f"{args.duration:g} s, {args.connections} connections, a connection per request)")
        print("| --- | --- | --- | --- |")
        for name, rows in results.items():
            print(f"| {name} | {statistics.median(r[0] for r in rows):,.0f} | "
                  f"{statistics.median(r[1] for r in rows):.1f} | {sum(r[2] for r in rows)} |")
        if args.out:
            save(args.out, {
                "setup": {"rounds": args.rounds, "duration": args.duration, "connections": args.connections,
                          "loadavg_before": load_before, "loadavg_after": loadavg()},
                "runs": {name: [{"rps": r[0], "cpu_us_per_req": r[1], "failures": r[2]} for r in rows]
                         for name, rows in results.items()},
                "medians": {name: {"rps": statistics.median(r[0] for r in rows),
                                   "cpu_us_per_req": statistics.median(r[1] for r in rows),
                                   "failures": sum(r[2] for r in rows)} for name, rows in results.items()}})
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
