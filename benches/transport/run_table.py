"""The transport's benchmark table: payload 4 KiB / 32 KiB / 256 KiB / 4 MiB ×
requests in flight 1 / 4 / 16, each cell next to the raw socket echo measured
in the same run (and iperf3 once, when installed).

    python benches/transport/run_table.py [--duration 2] [--channel tcp]

Each cell runs `juggler rpc transport-bench ... --json` in a fresh process,
so peak RSS is per cell. Prints a markdown table for benches/README.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

PAYLOADS = [4096, 32768, 262144, 4194304]
INFLIGHT = [1, 4, 16]


def cell(payload: int, inflight: int, duration: float, channel: str, iperf3: bool = False) -> list[dict]:
    cmd = [sys.executable, "-m", "cli", "rpc", "transport-bench", "--payload", str(payload), "--inflight", str(inflight),
           "--duration", str(duration), "--channel", channel, "--json"]
    if iperf3:
        cmd.append("--iperf3")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 4 + 120, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--channel", choices=["tcp", "unix"], default="tcp")
    a = ap.parse_args()
    print("| payload | in flight | transport req/s | transport MB/s | p50 / p99 ms | CPU % cli / srv | RSS MiB cli / srv "
          "| raw req/s | raw MB/s | raw p50 / p99 ms | transport / raw |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    iperf = None
    for payload in PAYLOADS:
        for inflight in INFLIGHT:
            rows = cell(payload, inflight, a.duration, a.channel, iperf3=(iperf is None and a.channel == "tcp"))
            t = next(r for r in rows if r["kind"] == "transport")
            raw = next(r for r in rows if r["kind"] == "raw")
            iperf = iperf or next((r for r in rows if r["kind"] == "iperf3"), {"mbps": 0})
            size = f"{payload // 1024} KiB" if payload < 1 << 20 else f"{payload >> 20} MiB"
            print(f"| {size} | {inflight} | {t['rps']:,.0f} | {t['mbps']:,.0f} | {t['p50_ms']:.2f} / {t['p99_ms']:.2f} "
                  f"| {t['client_cpu']:.0f} / {t['server_cpu']:.0f} | {t['client_rss_mb']:.0f} / {t['server_rss_mb']:.0f} "
                  f"| {raw['rps']:,.0f} | {raw['mbps']:,.0f} | {raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} "
                  f"| {100 * t['mbps'] / raw['mbps']:.0f}% |", flush=True)
    if iperf and iperf.get("mbps"):
        print(f"\niperf3 one-way loopback TCP in the same run: {iperf['mbps']:,.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
