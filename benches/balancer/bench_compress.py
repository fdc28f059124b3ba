"""CPU per compressed response: our gzip against nginx's ``gzip on``, in the same run.

    .venv/bin/python benches/balancer/bench_compress.py --rounds 3 --duration 3 --out benches/balancer/results/compress.json

The backend is nginx (one process, one worker, no compression of its own)
serving a 32 KiB HTML-like text file. In front of it, started side by side
with one worker each:

- ``ours-gzip``: ``[compress] algorithms = ["gzip"], gzip_level = 6``;
- ``nginx-gzip``: a reverse proxy with ``gzip on; gzip_comp_level 6;
  gzip_types text/html …; gzip_proxied any``;
- ``ours-zstd``: ``[compress] algorithms = ["zstd"]`` (level 3), for scale;
- ``ours-hyper``: ``[compress]`` for a type the page is not: nothing is
  compressed, but requests with ``Accept-Encoding`` leave the fast path for
  hyper's (what the hand-over itself costs);
- ``ours-plain`` and ``nginx-plain``: the same proxies, no compression.

``wrk -c10`` (keep-alive) with ``Accept-Encoding: gzip, zstd`` runs against
each in rotating order per round; the balancer's CPU time (user+sys from
/proc) is divided by the responses answered, and the bytes read per response
are recorded (they show the coding happened). Medians over rounds are
printed as a Markdown table.
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
from bench_balancer import Bench, cpu_seconds, descendants, dump_logs, wait_port

from benches.common import loadavg, save
from tests.netutil import free_port

SIZE = 32 * 1024
CONCURRENCY = 10
SETUPS = ("ours-gzip", "nginx-gzip", "ours-zstd", "ours-hyper", "ours-plain", "nginx-plain")
ACCEPT = "Accept-Encoding: gzip, zstd"


@dataclass
class Run:
    setup: str
    round: int
    requests: int
    rps: float
    bytes_per_response: float
    failures: int
    cpu_us_per_req: float


def page() -> bytes:
    """Text as a web page compresses: markup, words, some repetition, some not."""
    words = [f"item{i * 7919 % 1000}" for i in range(4000)]
    rows = "".join(f'<tr><td class="c{i % 5}">{w}</td><td>{i * 31 % 977}</td></tr>\n' for i, w in enumerate(words))
    return (f"<!doctype html><html><body><table>{rows}</table></body></html>".encode() * 2)[:SIZE]


def start_backend(bench: Bench) -> tuple[object, int]:
    www = os.path.join(bench.dir, "www")
    os.makedirs(www, exist_ok=True)
    with open(os.path.join(www, "page.html"), "wb") as f:
        f.write(page())
    port = free_port()
    p = bench.start(["nginx", "-c", bench.nginx_conf("backend", f"server {{ listen 127.0.0.1:{port}; root {www}; }}"),
                     "-e", os.path.join(bench.dir, "be.err")])
    wait_port(port)
    return p, port


def start(bench: Bench, setup: str, port: int, backend: int):
    if setup.startswith("ours"):
        text = f'listen = "127.0.0.1:{port}"\nworkers = 1\nbackends = ["127.0.0.1:{backend}"]\n'
        if setup == "ours-gzip":
            text += '[compress]\nalgorithms = ["gzip"]\ngzip_level = 6\n'
        elif setup == "ours-zstd":
            text += '[compress]\nalgorithms = ["zstd"]\nzstd_level = 3\n'
        elif setup == "ours-hyper":
            text += '[compress]\ntypes = ["application/x-not-this"]\n'
        path = os.path.join(bench.dir, f"{setup}.toml")
        with open(path, "w") as f:
            f.write(text)
        p = bench.start([sys.executable, "-m", "cli", "balancer", "--config", path, "--log-level", "WARNING"],
                        cwd=ROOT)
    else:
        gz = ("gzip on; gzip_comp_level 6; gzip_proxied any; gzip_min_length 256; gzip_vary on;"
              " gzip_types text/css application/json application/javascript text/xml image/svg+xml;"
              if setup == "nginx-gzip" else "")
        body = (f"upstream b {{ server 127.0.0.1:{backend}; keepalive 64; }}\n{gz}\n"
                f"server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://b;"
                " proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; } }")
        p = bench.start(["nginx", "-c", bench.nginx_conf(setup, body), "-e", os.path.join(bench.dir, f"{setup}.err")])
    wait_port(port)
    return p


def measure(setup: str, proc, port: int, rnd: int, duration: float) -> Run:
    url = f"http://127.0.0.1:{port}/page.html"
    subprocess.run(["wrk", "-t1", f"-c{CONCURRENCY}", "-d1s", "-H", ACCEPT, url], capture_output=True, timeout=60, check=False)
    pids = descendants(proc.pid)
    c0 = cpu_seconds(pids)
    out = subprocess.run(["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{max(1, round(duration))}s", "-H", ACCEPT, url],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    cpu = cpu_seconds(pids) - c0
    requests = int(re.search(r"(\d+) requests in [\d.]+\w+, ([\d.]+)(\w+) read", out).group(1))
    m = re.search(r"requests in [\d.]+\w+, ([\d.]+)(\w+) read", out)
    read = float(m.group(1)) * {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}[m.group(2)]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    failures = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        failures += sum(int(x) for x in m.groups())
    return Run(setup, rnd, requests, rps, read / max(requests, 1), failures, cpu * 1e6 / max(requests, 1))


def table(runs: list[Run]) -> str:
    out = ["| setup | req/s | CPU µs/response (min–max) | bytes/response | failures |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for setup in SETUPS:
        rs = [r for r in runs if r.setup == setup]
        if not rs:
            continue
        cpu = [r.cpu_us_per_req for r in rs]
        out.append(f"| {setup} | {statistics.median(r.rps for r in rs):,.0f} | "
                   f"{statistics.median(cpu):.1f} ({min(cpu):.1f}–{max(cpu):.1f}) | "
                   f"{statistics.median(r.bytes_per_response for r in rs):,.0f} | {sum(r.failures for r in rs)} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    args = ap.parse_args()
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            print(f"{tool} is required (apt-get install nginx wrk)", file=sys.stderr)
            return 1
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="lbbench-gz-") as d:
        os.chmod(d, 0o755)  # nginx workers run as an unprivileged user
        bench = Bench(d)
        try:
            be, backend = start_backend(bench)
            ports = {s: free_port() for s in SETUPS}
            procs = {s: start(bench, s, ports[s], backend) for s in SETUPS}
            for rnd in range(args.rounds):
                shift = rnd % len(SETUPS)
                for s in SETUPS[shift:] + SETUPS[:shift]:
                    r = measure(s, procs[s], ports[s], rnd, args.duration)
                    runs.append(r)
                    print(f"{s:12} r{rnd} {r.rps:9.0f} req/s cpu {r.cpu_us_per_req:7.1f} us/resp "
                          f"{r.bytes_per_response:8.0f} B/resp fail {r.failures}", flush=True)
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
                                  "concurrency": CONCURRENCY, "accept": ACCEPT},
                        "runs": [asdict(r) for r in runs], "table": table(runs), "loadavg_after": loadavg()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
