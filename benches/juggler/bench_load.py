"""Juggler end-to-end benchmark: `juggler load` against server + callee + Redis.

Everything runs on this one machine: a fresh
redis-server, `juggler server --redis`, `juggler callee --redis`, then
`juggler load` (20 connections, closed loop, test.echo). A raw-Redis
reference is measured in the same run with redis-benchmark: the ceiling of
the commands one call costs (the push script via EVALSHA, LPUSH/RPOP).

    .venv/bin/python benches/juggler/bench_load.py                 # 10 s, 20 connections
    .venv/bin/python benches/juggler/bench_load.py -d 20s -c 20 --workers 200 --json
    .venv/bin/python benches/juggler/bench_load.py --runs 3 --out benches/juggler/results/load.json

Each run starts everything afresh; ``--out`` keeps every run with the load
average before and after it. ``--tls`` alternates plaintext runs with runs
over ``wss://`` (the server with an ECDSA P-256 certificate of ``juggler tls
dev-cert``, the load tool verifying it), so the two sit side by side.
``--before TREE`` alternates runs of this checkout's server and callee with
runs of another checkout's (a ``git worktree`` with its own
``rustext/_native*.so``), the same load tool driving both.

Not a test: it measures and prints, and exits 0 unless something failed to run.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benches.common import loadavg, proc_cpu_seconds, save  # noqa: E402
from juggler.broker.redis import PUSH_SCRIPT  # noqa: E402  (upstream's, byte for byte)
from tests.netutil import free_port, wait_for_port  # noqa: E402

PUSH_SHA = PUSH_SCRIPT.sha.decode()
PUSH_SHA_BODY = PUSH_SCRIPT.body.decode()


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    wait_for_port(port, timeout=timeout, proc=proc)


def juggler_cmd() -> list[str]:
    return [sys.executable, "-m", "cli"]


def redis_reference(port: int, clients: int, n: int) -> dict[str, dict[str, float]]:
    """redis-benchmark figures: requests/s and p50/p99 (ms) per test."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    tests = {
        "LPUSH": ["-t", "lpush"],
        "RPOP": ["-t", "rpop"],
        "EVALSHA push script": ["-r", "100000", "EVALSHA", PUSH_SHA, "2",
                                "juggler:calls:timeout:{bench}:__rand_int__", "juggler:calls:{bench}",
                                # a payload of a call's size, without quotes (they break redis-benchmark's CSV)
                                "5000", "p" * 130, "0"],
    }
    subprocess.run(["redis-cli", "-p", str(port), "SCRIPT", "LOAD", PUSH_SHA_BODY], capture_output=True, timeout=30)
    for name, args in tests.items():
        cmd = [exe, "-p", str(port), "-c", str(clients), "-n", str(n), "--csv", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        rows = [r for r in csv.reader(io.StringIO(res.stdout)) if r and r[0] != "test"]
        if not rows:
            continue
        cols = rows[-1]
        # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        try:
            out[name] = {"rps": float(cols[1]), "p50_ms": float(cols[4]), "p99_ms": float(cols[6])}
        except (IndexError, ValueError):
            continue
    subprocess.run(["redis-cli", "-p", str(port), "FLUSHALL"], capture_output=True, timeout=30)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-d", "--duration", default="10s")
    ap.add_argument("-c", "--connections", type=int, default=20)
    ap.add_argument("--workers", type=int, default=200, help="callee workers")
    ap.add_argument("--callees", type=int, default=1, help="callee processes")
    ap.add_argument("--procs", type=int, default=1, help="load tool processes")
    ap.add_argument("--uri", default="test.echo")
    ap.add_argument("--payload", default='"hello"')
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="fresh runs, one after the other [%(default)s]")
    ap.add_argument("--out", metavar="FILE", help="write the raw results of every run (JSON) there")
    ap.add_argument("--tls", action="store_true", help="alternate ws:// runs with wss:// runs")
    ap.add_argument("--before", type=Path, metavar="TREE",
                    help="alternate runs with the server and callee of this other checkout")
    args = ap.parse_args(argv)
    runs = []
    if args.before is not None and not list(args.before.resolve().glob("rustext/_native*.so")):
        ap.error(f"{args.before}: no rustext/_native*.so (build it or copy one of its revision there)")
    trees = [("ours", ROOT)] + ([("before", args.before.resolve())] if args.before is not None else [])
    modes = [(tls, label, tree) for tls in ([False, True] if args.tls else [False]) for label, tree in trees]
    for i in range(args.runs):
        for tls, label, tree in modes if i % 2 == 0 else modes[::-1]:
            load0 = loadavg()
            if len(trees) > 1:
                print(f"-- {label} ({tree})", flush=True)
            result = run_once(args, tls=tls, tree=tree)
            if result is None:
                return 1
            runs.append({**result, "tls": tls, "tree": label, "loadavg_before": load0, "loadavg_after": loadavg()})
    if args.out:
        save(args.out, {"setup": {"connections": args.connections, "duration": args.duration, "workers": args.workers,
                                  "callees": args.callees, "load_procs": args.procs, "uri": args.uri,
                                  "payload": args.payload}, "runs": runs})
    return 0


def run_once(args: argparse.Namespace, tls: bool = False, tree: Path = ROOT) -> dict | None:
    """One run from a fresh redis-server (``tls``: the server on wss://), the
    server and callee of the checkout `tree`; the figures, or None if
    something failed to run."""
    workdir = tempfile.mkdtemp(prefix="jbench-")
    server_tls: list[str] = []
    load_tls: list[str] = []
    if tls:
        from rustext.tls import write_dev_cert

        made = write_dev_cert(os.path.join(workdir, "certs"))
        server_tls = ["--tls-cert", str(made.cert), "--tls-key", str(made.key)]
        load_tls = ["--tls-ca", str(made.ca)]
    rport, wport = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    logs = []
    try:
        redis = subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(redis)
        wait_port(rport, redis)
        url = f"redis://127.0.0.1:{rport}/0"
        reference = {} if args.no_reference else redis_reference(rport, args.connections, 200_000)

        def start(name: str, cmd: list[str]) -> subprocess.Popen:
            log = open(os.path.join(workdir, f"{name}.log"), "wb")
            logs.append(log)
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**env, "PYTHONPATH": str(tree)},
                                 cwd=tree)
            procs.append(p)
            return p

        server = start("server", [*juggler_cmd(), "server", "--redis", url, "--listen", f"127.0.0.1:{wport}",
                                  *server_tls])
        for i in range(args.callees):
            start(f"callee{i}", [*juggler_cmd(), "callee", "--redis", url, "--workers", str(args.workers)])
        wait_port(wport, server)
        time.sleep(1.0)  # let the callees block on their lists
        roles = {"server": [server], "callees": procs[2:], "redis": [redis]}
        cpu_before = {k: sum(proc_cpu_seconds(p.pid) for p in ps) for k, ps in roles.items()}
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = subprocess.run(
            [*juggler_cmd(), "load", "--url", f"{'wss' if tls else 'ws'}://127.0.0.1:{wport}/ws", *load_tls,
             "-c", str(args.connections),
             "-d", args.duration, "--uri", args.uri, "--payload", args.payload, "--procs", str(args.procs),
             "--json", "--quiet"],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
        )
        if load.returncode not in (0, 1) or not load.stdout.strip():
            print(load.stderr, file=sys.stderr)
            return None
        report = json.loads(load.stdout)
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = {k: sum(proc_cpu_seconds(p.pid) for p in ps) - cpu_before[k] for k, ps in roles.items()}
        cpu["load tool"] = (children_after.ru_utime + children_after.ru_stime
                            - children_before.ru_utime - children_before.ru_stime)
        calls = max(1, report["results"])
        cpu_us = {k: round(v / calls * 1e6, 1) for k, v in cpu.items()}
        result = {"juggler": report, "cpu_us_per_call": cpu_us, "redis_reference": reference}
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            lat = report["latency_ms"]
            print(f"juggler{' over wss://' if tls else ''} (python server + callee x{args.callees} ({args.workers} workers) + redis, "
                  f"{args.connections} connections closed loop on {args.uri}, {report['duration_s']:g}s):")
            print(f"  {report['throughput']:,.0f} calls/s  calls {report['calls']} results {report['results']} "
                  f"nacks {report['nacks']} expired {report['expired']}")
            if lat:
                print("  latency ms: " + "  ".join(f"{k} {v:.2f}" for k, v in lat.items()))
            print("  CPU µs per call: " + "  ".join(f"{k} {v:.1f}" for k, v in cpu_us.items()))
            for name, fig in reference.items():
                print(f"redis-benchmark {name} (-c {args.connections}): {fig['rps']:,.0f} req/s  "
                      f"p50 {fig['p50_ms']:.3f} ms  p99 {fig['p99_ms']:.3f} ms")
        return result
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for f in logs:
            f.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
