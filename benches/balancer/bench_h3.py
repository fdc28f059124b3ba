"""HTTP/2 against HTTP/3 through the balancer, in the same run.

    .venv/bin/python benches/balancer/bench_h3.py --rounds 5 --duration 3

One balancer (``--workers 1``) terminating TLS (a ``juggler tls dev-cert``
certificate) in front of one nginx backend serving a 1 KiB file; one client
program (``benches/balancer/h3load``, Go: ``net/http`` for HTTP/2, quic-go
for HTTP/3, built with ``go build``) keeps ``--concurrency`` requests in
flight over one connection. HTTP/2 and HTTP/3 alternate within each round
(the order rotating per round). Reported: medians over rounds of requests/s
and the balancer's CPU time per request (user+sys from /proc of the
balancer's process; the client's and the backend's are not counted),
failures (errors and non-2xx).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from bench_balancer import Bench, cpu_seconds, descendants, wait_port  # noqa: E402

from benches.common import loadavg, save  # noqa: E402

from tests.netutil import free_port  # noqa: E402

PROTOS = ("h2", "h3")


def build_client(b: Bench) -> str:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("bench_h3: needs Go to build its client (benches/balancer/h3load)")
    out = os.path.join(b.dir, "h3load")
    subprocess.run([go, "build", "-o", out, "."], cwd=os.path.join(HERE, "h3load"), check=True, timeout=600)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    args = ap.parse_args()
    load_before = loadavg()
    d = tempfile.mkdtemp(prefix="bench-h3-")
    os.chmod(d, 0o755)  # nginx workers run as an unprivileged user
    b = Bench(d)
    try:
        client = build_client(b)
        from rustext.tls import write_dev_cert
        made = write_dev_cert(os.path.join(d, "tls"), key_type="ec")
        _, (backend,) = b.start_backends(1)
        port = free_port()
        cfg = os.path.join(b.dir, "lb.toml")
        with open(cfg, "w") as f:
            f.write(f'workers = 1\nlisten = "127.0.0.1:{port}"\nbackends = ["127.0.0.1:{backend}"]\n'
                    f'[tls]\ncertificates = [{{ cert = "{made.cert}", key = "{made.key}" }}]\n')
        p = b.start([sys.executable, "-m", "cli", "balancer", "--config", cfg, "--log-level", "WARNING"], cwd=ROOT)
        wait_port(port)
        pids = descendants(p.pid)
        url = f"https://localhost:{port}/1024"
        runs = []
        for rnd in range(args.rounds):
            order = PROTOS if rnd % 2 == 0 else PROTOS[::-1]
            for proto in order:
                before = cpu_seconds(pids)
                out = subprocess.run([client, "-proto", proto, "-url", url, "-ca", str(made.ca),
                                      "-c", str(args.concurrency), "-d", f"{args.duration}s"],
                                     capture_output=True, text=True, timeout=args.duration + 60)
                cpu = cpu_seconds(pids) - before
                if out.returncode != 0:
                    raise SystemExit(f"bench_h3: the client failed: {out.stderr.strip()}")
                got = json.loads(out.stdout)
                n = max(got["requests"], 1)
                runs.append({"round": rnd, "proto": proto, "rps": got["requests"] / got["seconds"],
                             "cpu_us_per_req": cpu / n * 1e6, "failures": got["failures"]})
                print(f"round {rnd} {proto}: {runs[-1]['rps']:.0f} req/s, "
                      f"{runs[-1]['cpu_us_per_req']:.1f} µs CPU/req, {got['failures']} failed", flush=True)
        medians = {proto: {k: statistics.median(r[k] for r in runs if r["proto"] == proto)
                           for k in ("rps", "cpu_us_per_req", "failures")} for proto in PROTOS}
        print("\n| protocol | requests/s | balancer CPU per request | failures |\n| --- | ---: | ---: | ---: |")
        for proto in PROTOS:
            m = medians[proto]
            print(f"| {'HTTP/2' if proto == 'h2' else 'HTTP/3'} | {m['rps']:.0f} | {m['cpu_us_per_req']:.1f} µs "
                  f"| {m['failures']:.0f} |")
        if args.out:
            save(args.out, {"runs": runs, "medians": medians, "load_before": load_before, "load_after": loadavg(),
                            "settings": vars(args)})
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
