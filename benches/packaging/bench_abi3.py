"""What the stable ABI costs: the extension's Python-facing calls, abi3
build against a version-specific build, in one run.

The release wheel is built against Python's stable ABI (``abi3``: one wheel
for every CPython from 3.11 on), where PyO3 goes through functions the
version-specific API inlines (tuple and list access, reference counting of
some types). This measures the calls where that could show, per call, each
build in a child process of its own (nothing else of the checkout imported),
interleaved over several rounds:

- ``rpcx_feed_64``      RpcxStream.feed of 64 framed 512-byte requests (the transport's read path)
- ``rpcx_encode``       RpcxMessage.encode of one request
- ``juggler_parse``     parse_client_message of a CALL (the server's per-message path)
- ``juggler_build_res`` build_res of a 40-byte result
- ``call_payloads_64``  parse_call_payloads of 64 calls (a callee's batch)
- ``ws_frames_64``      ws_text_frames of 64 payloads (one event-loop turn of writes)
- ``heap_add_cancel``   DeadlineHeap add + cancel

    python benches/packaging/bench_abi3.py --abi3 dist/juggler_suite-*.whl \\
        --versioned rustext/_native.cpython-311-x86_64-linux-gnu.so --rounds 5

``--abi3`` takes the wheel (its ``_native.abi3.so`` is used) or the .so itself;
``--versioned`` a ``_native.cpython-3XX-….so`` built without abi3 (``maturin
develop`` with the ``abi3-py311`` feature removed). Prints ns per call, the
median of each build and their ratio; ``--out FILE`` saves the rounds as JSON.
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
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, sys, time
import rustext
from rustext import _native
assert _native.__file__.startswith(sys.argv[1]), _native.__file__

def per_call(fn, n):
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t) / n)
    return best

req = rustext.RpcxMessage(seq=7, service_path="Echo", service_method="Echo", serialize_type=1, payload=b"x" * 512)
batch = req.encode() * 64
stream = rustext.RpcxStream()
call = rustext.build_call("6f1d6b0e-2f1c-4a9f-8f7e-0c8b5a1e2d3c", "test.echo", 5_000_000_000, b'"hello"')
payload = rustext.build_call_payload("6f1d6b0e-2f1c-4a9f-8f7e-0c8b5a1e2d3c", "6f1d6b0e-2f1c-4a9f-8f7e-0c8b5a1e2d3d",
                                     "test.echo", b'"hello"')
payloads = [payload] * 64
texts = [b'{"meta":{"type":3},"payload":{"args":"x"}}'] * 64
heap = rustext.DeadlineHeap()
for i in range(10_000):
    heap.add(i, i)
out = {
    "rpcx_feed_64": per_call(lambda: stream.feed(batch), 2_000),
    "rpcx_encode": per_call(req.encode, 50_000),
    "juggler_parse": per_call(lambda: rustext.parse_client_message(call), 50_000),
    "juggler_build_res": per_call(lambda: rustext.build_res("6f1d6b0e-2f1c-4a9f-8f7e-0c8b5a1e2d3c", "test.echo",
                                                             b'{"result":"0123456789012345678901234"}'), 50_000),
    "ws_frames_64": per_call(lambda: rustext.ws_text_frames(texts), 20_000),
    "heap_add_cancel": per_call(lambda: heap.cancel(heap.add(5_000, None)), 100_000),
    "call_payloads_64": per_call(lambda: rustext.parse_call_payloads(payloads), 5_000),
}
print(json.dumps(out))
'''


def _package_with(so: Path, name: str, where: Path) -> Path:
    """A copy of the rustext package (Python files and stub) with `so` as its compiled module."""
    pkg = where / "rustext"
    pkg.mkdir(parents=True)
    for f in (ROOT / "rustext").glob("*.py"):
        shutil.copy2(f, pkg / f.name)
    shutil.copy2(so, pkg / name)
    return where


def _abi3_so(path: Path, tmp: Path) -> Path:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            data = z.read("rustext/_native.abi3.so")
        out = tmp / "_native.abi3.so"
        out.write_bytes(data)
        return out
    return path


def run_child(site: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, "-P", "-c", CHILD, str(site)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=site)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--abi3", required=True, type=Path, help="the release wheel, or a _native.abi3.so")
    p.add_argument("--versioned", required=True, type=Path, help="a _native.cpython-3XX-<platform>.so")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        abi3 = _package_with(_abi3_so(args.abi3, tmp), "_native.abi3.so", tmp / "abi3")
        versioned = _package_with(args.versioned, args.versioned.name, tmp / "versioned")
        rounds: dict[str, list[dict[str, float]]] = {"abi3": [], "versioned": []}
        for r in range(args.rounds):
            order = [("abi3", abi3), ("versioned", versioned)]
            for name, site in order if r % 2 == 0 else order[::-1]:
                rounds[name].append(run_child(site))
    names = list(rounds["abi3"][0])
    print(f"{'call':<20} {'abi3 ns':>10} {'versioned ns':>13} {'ratio':>7}   (medians of {args.rounds} rounds, "
          "best of 5 batches each)")
    for n in names:
        a = statistics.median(x[n] for x in rounds["abi3"])
        v = statistics.median(x[n] for x in rounds["versioned"])
        print(f"{n:<20} {a:>10.0f} {v:>13.0f} {a / v:>7.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rounds": rounds, "loadavg": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
