"""Pub-sub fan-out: native fan-out against the per-subscriber Python path, in one run.

Starts ``juggler server`` twice per round (``server.native_fanout`` true and
false, interleaved, the order alternating), runs ``juggler load --mode
fanout`` against each with ``--server-pid``, and records deliveries/s,
latency percentiles, losses and the server's CPU time per delivery (user and
system separately: on loopback the kernel's TCP work for the receiving side
is charged to the sender)::

    python benches/juggler/fanout_compare.py --subscribers 1000 --rate 50 -d 10 --rounds 3
    python benches/juggler/fanout_compare.py --subscribers 10000 --rate 10 -d 10 --rounds 2

``--before TREE`` compares instead the server of this checkout with the one
of another checkout (a ``git worktree`` with its own ``rustext/_native*.so``),
both with the native fan-out, interleaved the same way; the load tool is this
checkout's in both::

    python benches/juggler/fanout_compare.py --before /tmp/before --subscribers 1000 --rate 50 -d 10 --rounds 3

``--perf`` samples each server with ``perf record`` while the load runs and
keeps the profile's top entries (self time, by symbol) in the results; each
run also records the machine's load average, since the machine is shared.

Writes benches/juggler/results/fanout-<subscribers>x<rate>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JUGGLER = [sys.executable, "-m", "cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server on {port} did not start")


def stop_perf(perf: subprocess.Popen, data: Path, top: int = 20) -> list[str]:
    """Stop `perf record` and return the top entries of its report (self time by symbol)."""
    perf.send_signal(signal.SIGINT)
    try:
        perf.wait(60)
    except subprocess.TimeoutExpired:
        perf.kill()
        return []
    rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "-g", "none",
                          "--sort", "dso,symbol", "--percent-limit", "0.5"],
                         capture_output=True, text=True, timeout=300)
    data.unlink(missing_ok=True)
    lines = [" ".join(ln.split()).removesuffix(" - -") for ln in rep.stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return lines[:top]


def one(native: bool, args: argparse.Namespace, tree: Path = ROOT) -> dict:
    """One run against a fresh server of the checkout `tree`."""
    port = free_port()
    cmd = [*JUGGLER, "server", "--listen", f"127.0.0.1:{port}", "--set",
           f"server.native_fanout={'true' if native else 'false'}", "--set", "server.max_connections=0",
           # 10,000 subscribers connect at once: on a busy machine their handshakes take longer than the default
           "--set", f"server.handshake_timeout={max(10, args.subscribers // 200)}"]
    for setting in args.set or ():
        cmd += ["--set", setting]
    if args.redis:
        cmd += ["--redis", args.redis]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    server = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        u0, s0 = cpu(server.pid)
        load0 = os.getloadavg()[0]
        load = subprocess.Popen(
            [*JUGGLER, "load", "--mode", "fanout", "--url", f"ws://127.0.0.1:{port}/ws",
             "--subscribers", str(args.subscribers), "--rate", str(args.rate), "-d", f"{args.duration}s",
             "--payload-bytes", str(args.payload_bytes), "--procs", str(args.procs),
             "--server-pid", str(server.pid), "--json"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        perf = None
        perf_data = Path(f"/tmp/fanout-perf-{server.pid}.data")
        if args.perf:
            # profile the publishing only: from the publisher's connection (after every subscriber's) on
            while load.poll() is None and len(os.listdir(f"/proc/{server.pid}/fd")) < args.subscribers + 2:
                time.sleep(0.2)
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-g", "-p", str(server.pid),
                                     "-o", str(perf_data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stdout, stderr = load.communicate(timeout=args.duration + 300)
        out = subprocess.CompletedProcess(load.args, load.returncode, stdout, stderr)
        u1, s1 = cpu(server.pid)
        load1 = os.getloadavg()[0]
        profile = stop_perf(perf, perf_data) if perf is not None else None
        if out.returncode not in (0, 1):
            raise RuntimeError(out.stderr)
        report = json.loads(out.stdout)
        d = max(1, report["delivered"])
        report["server_user_us_per_delivery"] = report["server_cpu_us_per_delivery"] and None
        report["native"] = native
        report["tree"] = str(tree)
        # whole-run split (includes subscribing): the proportion applies to the window figure
        total = (u1 - u0) + (s1 - s0)
        if total > 0 and report["server_cpu_us_per_delivery"] is not None:
            per = report["server_cpu_us_per_delivery"]
            report["server_user_us_per_delivery"] = per * (u1 - u0) / total
            report["server_system_us_per_delivery"] = per * (s1 - s0) / total
        report["delivered_check"] = d
        report["loadavg"] = [round(load0, 1), round(load1, 1)]
        if profile is not None:
            report["profile"] = profile
        return report
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--rate", type=float, default=50)
    p.add_argument("-d", "--duration", type=float, default=10)
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--redis", metavar="URL", help="through this Redis instead of the in-memory broker")
    p.add_argument("--before", type=Path, metavar="TREE",
                   help="compare with the server of this checkout (native fan-out both) instead of the Python path")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a server setting for every run (repeatable)")
    p.add_argument("--perf", action="store_true", help="profile each server with perf record while the load runs")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.before is not None and not list(args.before.resolve().glob("rustext/_native*.so")):
        p.error(f"{args.before}: no rustext/_native*.so (build it or copy one of its revision there)")
    # (label, native fan-out, checkout) of the two servers compared, interleaved
    pair = ([("ours", True, ROOT), ("before", True, args.before.resolve())] if args.before is not None
            else [("native", True, ROOT), ("python", False, ROOT)])
    runs = []
    for r in range(args.rounds):
        for label, native, tree in (pair if r % 2 == 0 else pair[::-1]):
            rep = one(native, args, tree)
            rep["label"] = label
            runs.append(rep)
            if rep["server_cpu_us_per_delivery"] is None:
                print(f"round {r + 1}: no figure: {json.dumps(rep)[:2000]}", flush=True)
                continue
            print(f"round {r + 1} {label}: {rep['deliveries_per_s']:,.0f}/s "
                  f"lost {rep['lost']} p50 {rep['latency_ms'].get('median', 0):.1f} ms "
                  f"p99 {rep['latency_ms'].get('p99', 0):.1f} ms max {rep['latency_ms'].get('max', 0):.1f} ms "
                  f"server {rep['server_cpu_us_per_delivery']:.2f} µs/delivery "
                  f"(user {rep.get('server_user_us_per_delivery') or 0:.2f}, "
                  f"system {rep.get('server_system_us_per_delivery') or 0:.2f}) "
                  f"load average {rep['loadavg'][0]}→{rep['loadavg'][1]}", flush=True)
            for line in rep.get("profile") or ():
                print(f"    {line}", flush=True)
    out = args.out or ROOT / "benches" / "juggler" / "results" / (
        f"fanout-{args.subscribers}x{args.rate:g}{'-redis' if args.redis else ''}"
        f"{'-before' if args.before is not None else ''}.json")
    out.write_text(json.dumps({"command": " ".join(sys.argv), "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
