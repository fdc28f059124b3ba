"""rpcx against grpc.aio (and the HTTP gateway), like for like, in one run.

One ``juggler rpc serve --example bench`` process serves rpcx (``--listen``),
the HTTP gateway (``--gateway``) and grpc.aio (``--grpc``) with the same
``Hello.Say`` work (rpcx-benchmark's: the 581-byte protobuf
``BenchmarkMessage``, set two fields, send it back). Every peer is loaded by
the same client setup: ``--processes`` client processes with ``--pool``
connections (rpcx connections, grpc channels, HTTP/1.1 keep-alive
connections) each, ``-c`` concurrent callers in all. The processes open their
connections first and start together; each peer's rounds are interleaved
with the others' (the order rotates every round), and each run records calls/s,
latency, the client processes' CPU time and the server's CPU time
(``/proc``), and the load average.

    python benches/rpc/bench_rpcx.py --rounds 5 --out benches/rpc/results/rpcx-vs-grpc.json

HTTP/1.1 carries one request at a time per connection, so the gateway has at
most ``processes × pool`` calls in flight where rpcx and gRPC multiplex all
``-c`` of them.

``--tls`` adds ``rpcx-tls``: a second server, the same but serving rpcx over
TLS (an ECDSA P-256 certificate of ``juggler tls dev-cert``), loaded the same
way in the same rounds, so TLS's cost shows beside the plaintext figures.

``--quic`` adds ``rpcx-quic``: a server serving rpcx over QUIC (``quic@``,
the same certificate), loaded the same way in the same rounds (``--quic-n``
calls per round: QUIC costs far more CPU per call, see the results page).

    python benches/rpc/bench_rpcx.py --quic --tls --peers rpcx,rpcx-tls,rpcx-quic --rounds 5

``--kcp`` adds ``rpcx-kcp``: a server serving rpcx over KCP (``kcp@``, AES
with the key of rpcx's examples, 10 + 3 shards as Go rpcx), loaded the same
way in the same rounds (``--kcp-n`` calls per round).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benches.charts import rpc_table  # noqa: E402
from benches.common import loadavg, proc_cpu_seconds, save  # noqa: E402
from rpc.bench import BenchTarget, run_bench  # noqa: E402
from rpc.examples import benchmark_request  # noqa: E402
from rpc.message import SerializeType  # noqa: E402
from tests.netutil import free_port, wait_for_port  # noqa: E402

PEERS = ("rpcx", "rpcx-tls", "rpcx-quic", "rpcx-kcp", "grpc.aio", "gateway")


def measure(peer: str, address: str, server_pid: int, *, calls: int, concurrency: int, processes: int,
            pool: int, tls: Any = None, kcp: Any = None) -> dict[str, Any]:
    target = BenchTarget(address, "Hello", "Say", SerializeType.PROTOBUF,
                         benchmark_request().SerializeToString(), pool=pool, tls=tls, kcp=kcp)
    load0 = loadavg()
    cpu0 = proc_cpu_seconds(server_pid)
    result = run_bench(target, concurrency=concurrency, total=calls, processes=processes)
    server_cpu = proc_cpu_seconds(server_pid) - cpu0
    ok = max(result.ok, 1)
    lat = {k: v / 1e6 for k, v in result.summary().items()}
    return {
        "peer": peer, "calls": result.sent, "ok": result.ok, "errors": result.errors,
        "seconds": round(result.elapsed, 3), "calls_per_s": round(result.tps, 1),
        "latency_ms": {k: round(v, 3) for k, v in lat.items()},
        "client_cpu_us_per_call": round((result.cpu_user + result.cpu_sys) / ok * 1e6, 2),
        # the server's CPU also covers the clients' connection warm-up: a few calls per connection
        "server_cpu_us_per_call": round(server_cpu / ok * 1e6, 2),
        "loadavg_before": load0, "loadavg_after": loadavg(),
    }


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for peer in PEERS:
        rs = [r for r in runs if r["peer"] == peer]
        if not rs:
            continue
        tps = [r["calls_per_s"] for r in rs]
        rows.append({
            "peer": peer, "rounds": len(rs),
            "calls_per_s": statistics.median(tps), "calls_per_s_min": min(tps), "calls_per_s_max": max(tps),
            "p50_ms": statistics.median(r["latency_ms"]["median"] for r in rs),
            "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in rs),
            "client_cpu_us_per_call": statistics.median(r["client_cpu_us_per_call"] for r in rs),
            "server_cpu_us_per_call": statistics.median(r["server_cpu_us_per_call"] for r in rs),
            "errors": sum(r["errors"] for r in rs),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", type=int, default=100, help="concurrent callers in all [%(default)s]")
    p.add_argument("--processes", type=int, default=2, help="client processes, for every peer [%(default)s]")
    p.add_argument("--pool", type=int, default=5, help="connections per client process, for every peer [%(default)s]")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rpcx-n", type=int, default=100_000, help="calls per rpcx round [%(default)s]")
    p.add_argument("--grpc-n", type=int, default=10_000, help="calls per grpc.aio round [%(default)s]")
    p.add_argument("--gateway-n", type=int, default=30_000, help="calls per gateway round; 0 = skip [%(default)s]")
    p.add_argument("--out", metavar="FILE", help="write the raw results (JSON) there")
    p.add_argument("--tls", action="store_true", help="also rpcx over TLS (a second server), in the same rounds")
    p.add_argument("--quic", action="store_true", help="also rpcx over QUIC (a third server), in the same rounds")
    p.add_argument("--quic-n", type=int, default=20_000, help="calls per rpcx-quic round [%(default)s]")
    p.add_argument("--kcp", action="store_true", help="also rpcx over KCP (another server), in the same rounds")
    p.add_argument("--kcp-n", type=int, default=20_000, help="calls per rpcx-kcp round [%(default)s]")
    p.add_argument("--peers", default="", help="only these peers, comma-separated (default: all)")
    a = p.parse_args(argv)
    ports = {"rpcx": free_port(), "grpc.aio": free_port(), "gateway": free_port()}
    server = subprocess.Popen(
        [sys.executable, "-m", "cli", "rpc", "serve", "--example", "bench", "--no-http",
         "--listen", f"127.0.0.1:{ports['rpcx']}", "--grpc", f"127.0.0.1:{ports['grpc.aio']}",
         "--gateway", f"127.0.0.1:{ports['gateway']}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    plan = {"rpcx": (f"127.0.0.1:{ports['rpcx']}", a.rpcx_n), "grpc.aio": (f"grpc://127.0.0.1:{ports['grpc.aio']}", a.grpc_n)}
    if a.gateway_n:
        plan["gateway"] = (f"http://127.0.0.1:{ports['gateway']}", a.gateway_n)
    pids = {peer: server.pid for peer in plan}
    tls_server = quic_server = kcp_server = None
    kcp = None
    client_tls = None
    if a.tls or a.quic:
        import tempfile

        from rustext.tls import ClientTls, write_dev_cert

        made = write_dev_cert(tempfile.mkdtemp(prefix="rpc-bench-tls-"))
        client_tls = ClientTls(ca=str(made.ca))
    if a.quic:
        quic_port = free_port()
        quic_server = subprocess.Popen(
            [sys.executable, "-m", "cli", "rpc", "serve", "--example", "bench",
             "--listen", f"quic@127.0.0.1:{quic_port}", "--tls-cert", str(made.cert), "--tls-key", str(made.key)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        assert quic_server.stdout is not None
        if "quic@" not in quic_server.stdout.readline():  # it says where it listens once it does
            raise SystemExit("the QUIC server did not start")
        plan["rpcx-quic"] = (f"quic@127.0.0.1:{quic_port}", a.quic_n)
        pids["rpcx-quic"] = quic_server.pid
    if a.kcp:
        from rpc.transport.kcpchannel import KcpOptions
        from rpc.transport.kcpwire import KcpCrypt

        kcp = KcpOptions(crypt=KcpCrypt.from_passphrase("rpcx-key"))
        kcp_port = free_port()
        kcp_server = subprocess.Popen(
            [sys.executable, "-m", "cli", "rpc", "serve", "--example", "bench",
             "--listen", f"kcp@127.0.0.1:{kcp_port}", "--kcp-key", "rpcx-key"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        assert kcp_server.stdout is not None
        if "kcp@" not in kcp_server.stdout.readline():  # it says where it listens once it does
            raise SystemExit("the KCP server did not start")
        plan["rpcx-kcp"] = (f"kcp@127.0.0.1:{kcp_port}", a.kcp_n)
        pids["rpcx-kcp"] = kcp_server.pid
    if a.tls:
        tls_port = free_port()
        tls_server = subprocess.Popen(
            [sys.executable, "-m", "cli", "rpc", "serve", "--example", "bench", "--no-http",
             "--listen", f"127.0.0.1:{tls_port}", "--tls-cert", str(made.cert), "--tls-key", str(made.key)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        plan["rpcx-tls"] = (f"127.0.0.1:{tls_port}", a.rpcx_n)
        pids["rpcx-tls"] = tls_server.pid
        wait_for_port(tls_port, proc=tls_server)
    if a.peers:
        plan = {k: v for k, v in plan.items() if k in a.peers.split(",")}
    runs: list[dict[str, Any]] = []
    try:
        for port in ports.values():
            wait_for_port(port, proc=server)
        order = list(plan)
        for rnd in range(a.rounds):
            for peer in order[rnd % len(order):] + order[:rnd % len(order)]:
                address, calls = plan[peer]
                r = measure(peer, address, pids[peer], calls=calls, concurrency=a.c, processes=a.processes,
                            pool=a.pool, tls=client_tls if peer in ("rpcx-tls", "rpcx-quic") else None,
                            kcp=kcp if peer == "rpcx-kcp" else None)
                r["round"] = rnd
                runs.append(r)
                print(f"r{rnd} {peer:9} {r['calls_per_s']:9,.0f} calls/s  p99 {r['latency_ms']['p99']:6.2f} ms  "
                      f"CPU µs/call client {r['client_cpu_us_per_call']:6.1f} server {r['server_cpu_us_per_call']:6.1f}"
                      f"  errors {r['errors']}  load {r['loadavg_before'][0]:.2f}", flush=True)
                time.sleep(0.5)
    finally:
        for extra in (tls_server, quic_server, kcp_server):
            if extra is not None:
                extra.send_signal(signal.SIGTERM)
                extra.wait(timeout=20)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    rows = medians(runs)
    print()
    print(rpc_table(rows))
    if a.out:
        save(a.out, {"setup": {"concurrency": a.c, "processes": a.processes, "pool_per_process": a.pool,
                               "rounds": a.rounds, "calls": {k: v[1] for k, v in plan.items()}},
                     "runs": runs, "medians": rows})
    return 0 if all(r["errors"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
