"""permessage-deflate's cost: one event frame compressed, and the fan-out with
compression on and off, in one run.

Frames: a typical EVNT of about 200 bytes and of 2 KiB (JSON with repeated
keys and varied values), built plain (``rustext.ws_text_frames``) and
compressed (``rustext.WsDeflate``, levels 1, 2 and 6), interleaved rounds, best
per-frame time of each, with the compressed size.

Fan-out: a fresh ``juggler server`` per run, ``server.compression`` true and
false alternating, ``juggler load --mode fanout --compression`` (the native
subscribers offer permessage-deflate both times, as browsers do, and inflate
what comes compressed) with ``--server-pid``: the server's CPU per delivery.
Note the load tool pads its events with one repeated letter: they compress
far better than real events, so this is the cost of compressing, once per
event, not of typical ratios (the frame figures give those)::

    python benches/juggler/bench_deflate.py --subscribers 1000 --rate 50 -d 5 --rounds 2
    python benches/juggler/bench_deflate.py --frames-only --out benches/juggler/results/deflate-frames.json

Writes benches/juggler/results/deflate.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fanout_compare import JUGGLER, cpu, free_port, wait_port

import rustext
from benches.common import loadavg


def evnt(size: int) -> bytes:
    """An EVNT of about `size` bytes: a list of small records, as a chat or a ticker sends."""
    items, i = [], 0
    while True:
        items.append({"id": 1000 + i, "user": f"user{i * 7919 % 1000}", "price": round(100 + i * 0.37, 2),
                      "ts": 1_765_000_000_000 + i * 131, "ok": i % 3 == 0})
        body = json.dumps({"meta": {"type": 10, "uuid": str(uuid.UUID(int=i + 1))},
                           "payload": {"for": str(uuid.UUID(int=7)), "channel": "prices", "args": items}})
        if len(body) >= size:
            return body.encode()
        i += 1


def per_frame(fn, payload: bytes, n: int) -> float:
    batch = [payload]
    t0 = time.perf_counter()
    for _ in range(n):
        fn(batch)
    return (time.perf_counter() - t0) / n * 1e6


def frames(rounds: int) -> list[dict]:
    out = []
    for size in (200, 2048):
        payload = evnt(size)
        builders = {"plain": rustext.ws_text_frames, "deflate-1": rustext.WsDeflate(1).text_frames,
                    "deflate-2": rustext.WsDeflate(2).text_frames, "deflate-6": rustext.WsDeflate(6).text_frames}
        best = {name: float("inf") for name in builders}
        n = 20_000 if size < 1000 else 5_000
        for _ in range(rounds):
            for name, fn in builders.items():
                best[name] = min(best[name], per_frame(fn, payload, n))
        for name, fn in builders.items():
            row = {"payload_bytes": len(payload), "builder": name, "us_per_frame": best[name],
                   "frame_bytes": len(fn([payload]))}
            out.append(row)
            print(f"{len(payload):5d} B  {name:9s}  {best[name]:6.2f} µs/frame  {row['frame_bytes']:5d} bytes on the wire",
                  flush=True)
    return out


def fanout(args: argparse.Namespace, compression: bool) -> dict:
    port = free_port()
    cmd = [*JUGGLER, "server", "--listen", f"127.0.0.1:{port}", "--set", "server.max_connections=0",
           "--set", f"server.compression={'true' if compression else 'false'}",
           "--set", f"server.compression_threshold={args.threshold}"]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        u0, s0 = cpu(server.pid)
        out = subprocess.run(
            [*JUGGLER, "load", "--mode", "fanout", "--url", f"ws://127.0.0.1:{port}/ws", "--compression",
             "--subscribers", str(args.subscribers), "--rate", str(args.rate), "-d", f"{args.duration}s",
             "--payload-bytes", str(args.payload_bytes), "--procs", "1", "--server-pid", str(server.pid), "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=args.duration + 120)
        u1, s1 = cpu(server.pid)
        if out.returncode not in (0, 1):
            raise RuntimeError(out.stderr)
        report = json.loads(out.stdout)
        report["compression"] = compression
        total = (u1 - u0) + (s1 - s0)
        if total > 0 and report["server_cpu_us_per_delivery"] is not None:
            report["server_user_us_per_delivery"] = report["server_cpu_us_per_delivery"] * (u1 - u0) / total
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
    p.add_argument("-d", "--duration", type=float, default=5)
    p.add_argument("--payload-bytes", type=int, default=200)
    p.add_argument("--threshold", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames-only", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    result: dict = {"command": " ".join(sys.argv), "loadavg_before": loadavg(), "frames": frames(5), "fanout": []}
    if not args.frames_only:
        for r in range(args.rounds):
            for compression in ((True, False) if r % 2 == 0 else (False, True)):
                rep = fanout(args, compression)
                result["fanout"].append(rep)
                lat = rep["latency_ms"]
                print(f"round {r + 1} compression {'on ' if compression else 'off'}: "
                      f"{rep['deliveries_per_s']:,.0f}/s lost {rep['lost']} "
                      f"p50 {lat.get('median', 0):.1f} ms p99 {lat.get('p99', 0):.1f} ms "
                      f"server {rep['server_cpu_us_per_delivery'] or 0:.2f} µs/delivery "
                      f"(user {rep.get('server_user_us_per_delivery') or 0:.2f})", flush=True)
    result["loadavg_after"] = loadavg()
    out = args.out or ROOT / "benches" / "juggler" / "results" / "deflate.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
