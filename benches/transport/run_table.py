"""The transport's benchmark table: payload 4 KiB / 32 KiB / 256 KiB / 4 MiB ×
requests in flight 1 / 4 / 16, each cell next to the raw socket echo measured
in the same run (and iperf3 once, when installed).

    python benches/transport/run_table.py --rounds 3 --duration 2 --out benches/transport/results/table.json

Each cell runs `juggler rpc transport-bench ... --json` in a fresh process
(so peak RSS is per cell): the transport's echo, then the raw socket echo
with the same payload and requests in flight over one connection. With
``--rounds N`` the whole table is measured N times and the medians printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benches.charts import transport_table  # noqa: E402
from benches.common import loadavg, save  # noqa: E402

PAYLOADS = [4096, 32768, 262144, 4194304]
INFLIGHT = [1, 4, 16]


def cell(payload: int, inflight: int, duration: float, channel: str, iperf3: bool = False) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "cli", "rpc", "transport-bench", "--payload", str(payload), "--inflight", str(inflight),
           "--duration", str(duration), "--channel", channel, "--json"]
    if iperf3:
        cmd.append("--iperf3")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 4 + 120, check=True, cwd=ROOT).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def cpu_us_per_request(row: dict[str, Any]) -> float:
    """Client + server CPU per request (the bench reports % of one core per side)."""
    return (row["client_cpu"] + row["server_cpu"]) / 100 / max(row["rps"], 1e-9) * 1e6


def size_label(payload: int) -> str:
    return f"{payload // 1024} KiB" if payload < 1 << 20 else f"{payload >> 20} MiB"


def medians(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for payload in PAYLOADS:
        for inflight in INFLIGHT:
            cs = [c for c in cells if c["payload"] == payload and c["inflight"] == inflight]
            if not cs:
                continue
            row: dict[str, Any] = {"payload": payload, "inflight": inflight, "rounds": len(cs)}
            for kind in ("transport", "raw"):
                rs = [c[kind] for c in cs]
                row[kind] = {
                    "rps": statistics.median(r["rps"] for r in rs),
                    "mbps": statistics.median(r["mbps"] for r in rs),
                    "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                    "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                    "cpu_us_per_req": statistics.median(cpu_us_per_request(r) for r in rs),
                    "client_rss_mb": max(r["client_rss_mb"] for r in rs),
                    "server_rss_mb": max(r["server_rss_mb"] for r in rs),
                }
            row["ratio"] = row["transport"]["mbps"] / max(row["raw"]["mbps"], 1e-9)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per measurement [%(default)s]")
    ap.add_argument("--rounds", type=int, default=1, help="times the whole table is measured [%(default)s]")
    ap.add_argument("--channel", choices=["tcp", "unix"], default="tcp")
    ap.add_argument("--out", metavar="FILE", help="write the raw results (JSON) there")
    a = ap.parse_args(argv)
    cells: list[dict[str, Any]] = []
    iperf: dict[str, Any] | None = None
    for rnd in range(a.rounds):
        for payload in PAYLOADS:
            for inflight in INFLIGHT:
                load = loadavg()
                rows = cell(payload, inflight, a.duration, a.channel, iperf3=(iperf is None and a.channel == "tcp"))
                iperf = iperf or next((r for r in rows if r["kind"] == "iperf3"), {})
                c = {"round": rnd, "payload": payload, "inflight": inflight, "loadavg": load,
                     "transport": next(r for r in rows if r["kind"] == "transport"),
                     "raw": next(r for r in rows if r["kind"] == "raw")}
                cells.append(c)
                print(f"r{rnd} {size_label(payload):>7} x{inflight:<2} transport {c['transport']['rps']:9,.0f} req/s "
                      f"raw {c['raw']['rps']:9,.0f} req/s  load {load[0]:.2f}", flush=True)
    rows = medians(cells)
    print()
    print(transport_table(rows))
    if iperf and iperf.get("mbps"):
        print(f"\niperf3 one-way loopback TCP in the same run: {iperf['mbps']:,.0f} MB/s")
    if a.out:
        save(a.out, {"setup": {"duration": a.duration, "rounds": a.rounds, "channel": a.channel},
                     "cells": cells, "medians": rows, "iperf3": iperf or None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
