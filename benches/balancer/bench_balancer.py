"""Side-by-side benchmark: our balancer vs HAProxy vs nginx (the seed's scenarios).

    .venv/bin/python benches/balancer/bench_balancer.py --rounds 5 --duration 3 --out benches/balancer/results/run.json

Backends are nginx (one process, one worker) serving fixed-size files on 8
loopback ports. Each scenario starts the three balancers with the same
backends, one thread/process each (ours ``--workers 1``, HAProxy
``nbthread 1``, nginx ``worker_processes 1``, all adding X-Forwarded-For and
keeping backend connections alive), then runs, in rotating order per round,
``wrk`` (keep-alive) and ``ab`` (HTTP/1.0, a connection per request) against
each. Measured per run: requests/s, latency percentiles, failures (wrk:
socket errors + non-2xx; ab: failed + non-2xx, including length failures),
balancer CPU time per request (user+sys from /proc of the balancer's
processes, divided by requests) and peak RSS. Medians over rounds are
printed as a Markdown table; ``--out`` keeps every run and the medians (JSON),
from which ``benches/charts.py`` draws the documentation's charts.

``--tls``: the same over HTTPS. One ECDSA P-256 certificate (``juggler tls
dev-cert``) for all three, TLS 1.3 with ALPN http/1.1; ``wrk`` keeps its
connections (one handshake each), ``ab -f TLS1.3`` makes a full handshake
per request. Backends stay plain HTTP.

``--routing``: ours and HAProxy with a realistic routing configuration, the
same on both sides: three named pools (each with every backend), ten routes
(eight by host, two by path prefix) that the benchmark's requests all pass
over to reach the default pool, one request header set and one response
header deleted (``--balancers ours,haproxy``; nginx is not configured for it).

``--routing --rewrite``: the requests go to ``/app/v1/SIZE`` and one more
route, last, takes them by a regular expression and rewrites the path back
to ``/SIZE`` with a capture: ours with ``path_regex`` and
``rewrite.replace_path``, HAProxy with ``path_reg`` and ``http-request
replace-path``. Against a ``--routing`` run, the cost of a regex route and a
rewrite over the default route.

``--routing --access-log``: the same, both logging every request to a file
in the same format (HAProxy's httplog fields, ``ACCESS_FORMAT``): ours with
``[access_log]``, HAProxy with ``log stdout format raw`` and its standard
output redirected to the file — its cheapest way to a file (no syslog
daemon whose CPU would go uncounted; one ``write`` per line).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from benches.charts import balancer_table  # noqa: E402
from benches.common import loadavg, save  # noqa: E402
from tests.netutil import free_port  # noqa: E402  (distinct ports within one run)
TICK = os.sysconf("SC_CLK_TCK")

SCENARIOS = [
    # name, backends, response size, concurrency, ab requests
    ("1KiB-4be-c10", 4, 1024, 10, 10000),
    ("300KiB-4be-c10", 4, 300 * 1024, 10, 2000),
    ("10KiB-8be-c20", 8, 10 * 1024, 20, 10000),
]
BALANCERS = ["ours", "haproxy", "nginx"]
#: also runnable: "hyper" (ours with the fast path declined, see the module doc), "before" (``--before``)
EXTRA_BALANCERS = ["hyper"]
#: the access log line of ``--access-log``, the same on both sides (HAProxy's ``%{+Q}r`` is ours' ``"%r"``)
ACCESS_FORMAT = "%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %U %tsc %rc "


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing on port {port}")


def dump_logs(d: str) -> None:
    for name in sorted(os.listdir(d)):
        if name.endswith(".log") or name.endswith(".err"):
            text = open(os.path.join(d, name), errors="replace").read()[-2000:]
            if text.strip():
                print(f"--- {name}\n{text}", file=sys.stderr)


def descendants(pid: int) -> list[int]:
    out = [pid]
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return out
    for k in kids:
        out += descendants(int(k))
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / TICK


def rss_kib(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


@dataclass
class Run:
    balancer: str
    scenario: str
    tool: str
    round: int
    requests: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    failures: int
    cpu_us_per_req: float
    rss_mib: float
    extra: dict = field(default_factory=dict)


def parse_wrk(out: str) -> dict:
    def ms(v: str) -> float:
        n, unit = re.match(r"([\d.]+)(\w+)", v).groups()
        return float(n) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]

    pct = {m.group(1): ms(m.group(2)) for m in re.finditer(r"^\s+(\d+)%\s+(\S+)", out, re.M)}
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = 0
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        errors += sum(int(x) for x in m.groups())
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m.group(1))
    return {"requests": requests, "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": pct["50"], "p90": pct["90"], "p99": pct["99"], "failures": errors}


def parse_ab(out: str) -> dict:
    pct = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s+(\d+)%\s+(\d+)", out, re.M)}
    failed = int(re.search(r"Failed requests:\s+(\d+)", out).group(1))
    non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx responses:\s+(\d+)", out)) else 0
    complete = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))
    return {"requests": complete, "rps": float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1)),
            "p50": pct["50"], "p90": pct["90"], "p99": pct["99"], "failures": failed + non2xx}


class Bench:
    def __init__(self, workdir: str) -> None:
        self.dir = workdir
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], stdout_path: str | None = None, **kw) -> subprocess.Popen:
        log = open(stdout_path or os.path.join(self.dir, f"{os.path.basename(args[0])}-{len(self.procs)}.log"), "wb")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, **kw)
        log.close()
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.remove(p)

    def close(self) -> None:
        for p in list(self.procs):
            self.stop(p)

    def nginx_conf(self, name: str, body: str) -> str:
        d = os.path.join(self.dir, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(f"""worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log error;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  keepalive_requests 1000000;
  {body}
}}
""")
        return path

    def start_backends(self, n: int) -> tuple[subprocess.Popen, list[int]]:
        www = os.path.join(self.dir, "www")
        os.makedirs(www, exist_ok=True)
        for _, _, size, _, _ in SCENARIOS:
            with open(os.path.join(www, str(size)), "wb") as f:
                f.write(bytes(range(251)) * (size // 251) + bytes(range(size % 251)))
        ports = [free_port() for _ in range(n)]
        servers = "\n".join(f"server {{ listen 127.0.0.1:{p}; root {www}; }}" for p in ports)
        p = self.start(["nginx", "-c", self.nginx_conf("backends", servers), "-e", os.path.join(self.dir, "be.err")])
        for port in ports:
            wait_port(port)
        return p, ports

    def make_certificate(self) -> None:
        """An ECDSA P-256 certificate for 127.0.0.1 (and the combined PEM HAProxy reads)."""
        from rustext.tls import write_dev_cert

        made = write_dev_cert(os.path.join(self.dir, "tls"), key_type="ec")
        self.tls = (str(made.cert), str(made.key))
        self.tls_combined = os.path.join(self.dir, "tls", "combined.pem")
        with open(self.tls_combined, "wb") as f:
            f.write(made.cert.read_bytes() + made.key.read_bytes())

    def routing_toml(self, port: int, addrs: list[str]) -> str:
        """Ours, routed: the same pools, routes and header rules as :meth:`routing_haproxy`."""
        servers = ", ".join(f'"{a}"' for a in addrs)
        routes = "".join(f'[[routes]]\nhost = "h{i}.example.com"\nbackend = "{"api" if i % 2 else "static"}"\n'
                         for i in range(8))
        routes += '[[routes]]\npath_prefix = "/api/"\nbackend = "api"\n'
        routes += '[[routes]]\npath_prefix = "/static/"\nbackend = "static"\n'
        if getattr(self, "rewrite", False):
            routes += ("[[routes]]\npath_regex = '^/app/v\\d+/'\nbackend = \"web\"\n"
                       "rewrite = { replace_path = { regex = '^/app/v\\d+/(.*)$', replacement = '/$1' } }\n")
        text = (f'listen = "127.0.0.1:{port}"\nworkers = 1\ndefault_backend = "web"\n'
                f'[request_headers]\nset = {{ "X-Env" = "prod" }}\n[response_headers]\ndelete = ["Server"]\n'
                + "".join(f"[backends.{n}]\nservers = [{servers}]\n" for n in ("web", "api", "static")) + routes)
        if getattr(self, "access_log", False):
            fmt = (ACCESS_FORMAT + '"%r"').replace('"', '\\"')
            text += f'[access_log]\npath = "{self.dir}/ours-access.log"\nformat = "{fmt}"\n'

        path = os.path.join(self.dir, f"ours-{port}.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    @staticmethod
    def routing_haproxy(addrs: list[str], rewrite: bool = False) -> tuple[str, str]:
        """(frontend lines, backends) of HAProxy, routed as :meth:`routing_toml`."""
        front = "".join(f"  acl h{i} hdr(host) -i h{i}.example.com\n" for i in range(8))
        front += "  acl api path_beg /api/\n  acl static path_beg /static/\n"
        front += "  http-request set-header X-Env prod\n  http-response del-header Server\n"
        front += "".join(f"  use_backend {'api' if i % 2 else 'static'} if h{i}\n" for i in range(8))
        front += "  use_backend api if api\n  use_backend static if static\n"
        if rewrite:
            front += ("  acl app path_reg ^/app/v[0-9]+/\n  http-request replace-path ^/app/v[0-9]+/(.*)$ /\\1 if app\n"
                      "  use_backend web if app\n")
        front += "  default_backend web\n"
        back = "".join(f"backend {n}\n  balance roundrobin\n  http-reuse always\n"
                       + "".join(f"  server s{i} {a}\n" for i, a in enumerate(addrs)) for n in ("web", "api", "static"))
        return front, back

    def start_balancer(self, kind: str, port: int, backends: list[int]) -> subprocess.Popen:
        addrs = [f"127.0.0.1:{p}" for p in backends]
        # "before": ours, from another checkout (--before), to compare two trees in one run
        tree = getattr(self, "before", None) if kind == "before" else ROOT
        kind = "ours" if kind == "before" else kind
        tls = getattr(self, "tls", None)
        proto = "https" if tls else "http"
        if kind == "ours" and getattr(self, "routing", False):
            p = self.start([sys.executable, "-m", "cli", "balancer", "--config", self.routing_toml(port, addrs),
                            "--log-level", "WARNING"], cwd=tree)
        elif kind == "haproxy" and getattr(self, "routing", False):
            cfg = os.path.join(self.dir, f"haproxy-{port}.cfg")
            front, back = self.routing_haproxy(addrs, getattr(self, "rewrite", False))
            logging = getattr(self, "access_log", False)
            log_global = "  log stdout format raw local0\n" if logging else ""
            log_defaults = "  log global\n" if logging else ""
            log_front = f'  log-format "{ACCESS_FORMAT}%{{+Q}}r"\n' if logging else ""
            with open(cfg, "w") as f:
                f.write(f"global\n  nbthread 1\n  maxconn 4000\n{log_global}defaults\n  mode http\n"
                        f"  timeout connect 3s\n{log_defaults}"
                        "  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n  option forwardfor\n"
                        f"frontend f\n  bind 127.0.0.1:{port}\n  http-request set-header X-Forwarded-Proto {proto}\n"
                        + log_front + front + back)
            p = self.start(["haproxy", "-f", cfg],
                           stdout_path=os.path.join(self.dir, "haproxy-access.log") if logging else None)
        elif kind == "hyper":
            path = os.path.join(self.dir, f"hyper-{port}.toml")
            with open(path, "w") as f:
                f.write(f'listen = "127.0.0.1:{port}"\nworkers = 1\n'
                        f'[request_headers]\nset = {{ "X-Forwarded-Proto" = "{proto}" }}\n'
                        + "".join(f'[[backends]]\naddress = "{a}"\n' for a in addrs))
            extra = ["--tls-cert", tls[0], "--tls-key", tls[1]] if tls else []
            p = self.start([sys.executable, "-m", "cli", "balancer", "--config", path, "--log-level", "WARNING", *extra])
        elif kind == "ours":
            extra = ["--tls-cert", tls[0], "--tls-key", tls[1]] if tls else []
            p = self.start([sys.executable, "-m", "cli", "balancer", "--listen", f"127.0.0.1:{port}",
                            "--backends", ",".join(addrs), "--workers", "1", "--log-level", "WARNING", *extra],
                           cwd=tree)
        elif kind == "haproxy":
            cfg = os.path.join(self.dir, f"haproxy-{port}.cfg")
            ssl = f" ssl crt {self.tls_combined} ssl-min-ver TLSv1.3 alpn http/1.1" if tls else ""
            with open(cfg, "w") as f:
                f.write("global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 3s\n"
                        "  timeout client 60s\n  timeout server 60s\n  option http-keep-alive\n  option forwardfor\n"
                        f"frontend f\n  bind 127.0.0.1:{port}{ssl}\n  http-request set-header X-Forwarded-Proto {proto}\n"
                        "  default_backend b\nbackend b\n  balance roundrobin\n  http-reuse always\n"
                        + "".join(f"  server s{i} {a}\n" for i, a in enumerate(addrs)))
            p = self.start(["haproxy", "-f", cfg])
        else:
            ups = "".join(f"server {a};" for a in addrs)
            ssl = (f" ssl; ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]}; ssl_protocols TLSv1.3;"
                   if tls else ";")
            body = (f"upstream b {{ {ups} keepalive 64; }}\n"
                    f"server {{ listen 127.0.0.1:{port}{ssl} location / {{ proxy_pass http://b;"
                    " proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host;"
                    " proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"
                    f" proxy_set_header X-Forwarded-Proto {proto}; }} }}")
            p = self.start(["nginx", "-c", self.nginx_conf(f"lb-{port}", body), "-e", os.path.join(self.dir, "lb.err")])
        wait_port(port)
        return p


def measure(kind: str, proc: subprocess.Popen, port: int, scenario: tuple, tool: str, rnd: int, duration: float,
            tls: bool = False, prefix: str = "") -> Run:
    name, _, size, conc, ab_n = scenario
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}{prefix}/{size}"
    # warm the backend pools
    subprocess.run(["wrk", "-t1", f"-c{conc}", "-d1s", url], capture_output=True, timeout=60)
    pids = descendants(proc.pid)
    c0 = cpu_seconds(pids)
    if tool == "wrk":
        out = subprocess.run(["wrk", "-t1", f"-c{conc}", f"-d{max(1, round(duration))}s", "--latency", url],
                             capture_output=True, text=True, timeout=120).stdout
        r = parse_wrk(out)
    else:
        done = subprocess.run(["ab", "-q", *(["-f", "TLS1.3"] if tls else []), "-n", str(ab_n), "-c", str(conc), url],
                              capture_output=True, text=True, timeout=300)
        if "Failed requests:" in done.stdout:
            r = parse_ab(done.stdout)
        else:
            # ab gave up (e.g. a reset or its 30 s timeout): every request counts as failed.
            print(f"ab against {kind} aborted: {done.stderr.strip()[-300:]}", file=sys.stderr, flush=True)
            r = {"requests": 0, "rps": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "failures": ab_n}
    cpu = cpu_seconds(pids) - c0
    return Run(kind, name, tool, rnd, r["requests"], r["rps"], r["p50"], r["p90"], r["p99"], r["failures"],
               cpu * 1e6 / max(r["requests"], 1), rss_kib(pids) / 1024)


def median_table(runs: list[Run]) -> list[dict]:
    rows = []
    for sc in SCENARIOS:
        for tool in ("wrk", "ab"):
            for kind in ["ours", "before", "hyper", *BALANCERS[1:]]:
                rs = [r for r in runs if r.scenario == sc[0] and r.tool == tool and r.balancer == kind]
                if not rs:
                    continue
                rows.append({
                    "scenario": sc[0], "tool": tool, "balancer": kind, "rounds": len(rs),
                    "rps": statistics.median(r.rps for r in rs),
                    "p50_ms": statistics.median(r.p50_ms for r in rs),
                    "p90_ms": statistics.median(r.p90_ms for r in rs),
                    "p99_ms": statistics.median(r.p99_ms for r in rs),
                    "cpu_us_per_req": statistics.median(r.cpu_us_per_req for r in rs),
                    "cpu_min": min(r.cpu_us_per_req for r in rs), "cpu_max": max(r.cpu_us_per_req for r in rs),
                    "failures": sum(r.failures for r in rs),
                    "rss_mib": max(r.rss_mib for r in rs),
                })
    return rows


def versus(rows: list[dict]) -> str:
    """Ours against HAProxy, per scenario and tool."""
    before = any(r["balancer"] == "before" for r in rows)
    out = ["| scenario | tool | CPU/req ours ÷ HAProxy | req/s ours ÷ HAProxy | p99 ours ÷ HAProxy | failures ours |"
           + (" CPU/req before ÷ HAProxy | CPU/req ours ÷ before |" if before else ""),
           "| --- | --- | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if before else "")]
    for sc in SCENARIOS:
        for tool in ("wrk", "ab"):
            m = {r["balancer"]: r for r in rows if r["scenario"] == sc[0] and r["tool"] == tool}
            if "ours" not in m or "haproxy" not in m:
                continue
            o, h = m["ours"], m["haproxy"]
            line = (f"| {sc[0]} | {tool} | {o['cpu_us_per_req'] / h['cpu_us_per_req']:.2f} | "
                    f"{o['rps'] / h['rps']:.2f} | {o['p99_ms'] / max(h['p99_ms'], 1e-9):.2f} | {o['failures']} |")
            if "before" in m:
                b = m["before"]
                line += (f" {b['cpu_us_per_req'] / h['cpu_us_per_req']:.2f} |"
                         f" {o['cpu_us_per_req'] / b['cpu_us_per_req']:.2f} |")
            out.append(line)
    return "\n".join(out)


def versus_hyper(rows: list[dict]) -> str:
    """Ours against ours with the fast path declined, per scenario and tool ("" without "hyper" runs)."""
    out = ["| scenario | tool | CPU/req ours ÷ hyper only | req/s ours ÷ hyper only |", "| --- | --- | ---: | ---: |"]
    for sc in SCENARIOS:
        for tool in ("wrk", "ab"):
            m = {r["balancer"]: r for r in rows if r["scenario"] == sc[0] and r["tool"] == tool}
            if "ours" in m and "hyper" in m:
                o, h = m["ours"], m["hyper"]
                out.append(f"| {sc[0]} | {tool} | {o['cpu_us_per_req'] / h['cpu_us_per_req']:.2f} | {o['rps'] / h['rps']:.2f} |")
    return "\n".join(out) if len(out) > 2 else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    ap.add_argument("--scenarios", default=",".join(s[0] for s in SCENARIOS))
    ap.add_argument("--out", metavar="FILE", help="write every run and the medians (JSON) there")
    ap.add_argument("--tls", action="store_true", help="HTTPS termination (TLS 1.3, ECDSA P-256) instead of HTTP")
    ap.add_argument("--balancers", default=",".join(BALANCERS), help="which to run (default ours, haproxy, nginx; also: hyper)")
    ap.add_argument("--before", metavar="TREE",
                    help="also run ours from this checkout (with its built extension) as 'before', "
                         "to compare two versions in the same run")
    ap.add_argument("--routing", action="store_true",
                    help="ours and HAProxy with ten routes and two header rules (see the module doc)")
    ap.add_argument("--rewrite", action="store_true",
                    help="with --routing: one more route, by a regular expression, rewriting the path")
    ap.add_argument("--access-log", action="store_true",
                    help="with --routing: both log every request to a file in the same format")
    args = ap.parse_args()
    if args.routing and ("nginx" in args.balancers.split(",") or args.tls):
        print("--routing compares ours and HAProxy over HTTP: add --balancers ours,haproxy", file=sys.stderr)
        return 2
    if args.rewrite and not args.routing:
        print("--rewrite goes with --routing", file=sys.stderr)
        return 2
    if args.access_log and not args.routing:
        print("--access-log goes with --routing", file=sys.stderr)
        return 2
    for tool in ("nginx", "haproxy", "wrk", "ab"):
        if shutil.which(tool) is None:
            print(f"{tool} is required (apt-get install nginx haproxy wrk apache2-utils)", file=sys.stderr)
            return 1
    wanted = set(args.scenarios.split(","))
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="lbbench-") as d:
        os.chmod(d, 0o755)  # nginx workers run as an unprivileged user
        bench = Bench(d)
        balancers = [b for b in BALANCERS + EXTRA_BALANCERS if b in args.balancers.split(",")]
        if args.before:
            bench.before = os.path.abspath(args.before)
            balancers.insert(1, "before")
        if args.tls:
            bench.make_certificate()
        bench.routing = args.routing
        bench.access_log = args.access_log
        bench.rewrite = args.rewrite
        try:
            for sc in SCENARIOS:
                if sc[0] not in wanted:
                    continue
                be, ports = bench.start_backends(sc[1])
                lbs = {k: (free_port(),) for k in balancers}
                procs = {k: bench.start_balancer(k, lbs[k][0], ports) for k in balancers}
                for rnd in range(args.rounds):
                    shift = rnd % len(balancers)
                    order = balancers[shift:] + balancers[:shift]
                    for tool in ("wrk", "ab"):
                        for k in order:
                            r = measure(k, procs[k], lbs[k][0], sc, tool, rnd, args.duration, tls=args.tls,
                                        prefix="/app/v1" if args.rewrite else "")
                            runs.append(r)
                            print(f"{sc[0]:15} {tool:3} {k:8} r{rnd} {r.rps:9.0f} req/s p99 {r.p99_ms:7.2f} ms "
                                  f"cpu {r.cpu_us_per_req:6.1f} us/req fail {r.failures} rss {r.rss_mib:.1f} MiB",
                                  flush=True)
                for p in procs.values():
                    bench.stop(p)
                bench.stop(be)
        except Exception:
            dump_logs(d)
            raise
        finally:
            bench.close()
    rows = median_table(runs)
    print()
    print(balancer_table(rows) + "\n\n" + versus(rows))
    if versus_hyper(rows):
        print("\n" + versus_hyper(rows))
    if args.out:
        save(args.out, {"setup": {"rounds": args.rounds, "duration": args.duration, "tls": args.tls,
                                  "routing": args.routing, "access_log": args.access_log},
                        "runs": [asdict(r) for r in runs],
                        "medians": rows, "loadavg_after": loadavg()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
