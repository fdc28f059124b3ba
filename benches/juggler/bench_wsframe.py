"""Websocket frames in the juggler server, Python against Rust.

Reading: the former pure-Python parser of juggler/conn.py (websockets' C
``apply_mask``) against ``Conn._frames_in`` itself (the sans-I/O
``WsServerProtocol`` over ``rustext.WsFrameReader``), both dispatching to a
no-op text handler.

Writing: the frames of one event-loop turn as juggler/conn.py built them in
Python (a header per message, ``b"".join``) against ``WsServerProtocol``
(``send_text`` per message, then ``data_to_send``: one ``rustext.ws_text_frames``
call per turn).

Interleaved rounds, best of each printed.

    .venv/bin/python benches/juggler/bench_wsframe.py
    .venv/bin/python benches/juggler/bench_wsframe.py --rounds 7 --json
    .venv/bin/python benches/juggler/bench_wsframe.py --out benches/juggler/results/wsframe.json

Not a test: it measures and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from websockets.speedups import apply_mask


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benches.common import loadavg, save  # noqa: E402
from juggler.conn import Conn, ConnState  # noqa: E402
from juggler.wsproto import WsServerProtocol  # noqa: E402

KEY = os.urandom(4)


def frame(fin: bool, op: int, payload: bytes) -> bytes:
    n = len(payload)
    b0 = (0x80 if fin else 0) | op
    if n < 126:
        head = bytes((b0, 0x80 | n))
    elif n < 65536:
        head = bytes((b0, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((b0, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + KEY + apply_mask(payload, KEY)


class OldParser:
    """juggler/conn.py's _frames_in/_frame before the Rust reader (control
    frames reduced to what the benchmark's inputs need)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rbuf = bytearray()
        self._frag: list[bytes] | None = None
        self._frag_size = 0
        self._doomed = self._closed = False
        self.texts = 0

    def _on_text(self, data: bytes) -> None:
        self.texts += 1

    def _fail(self, code: int, reason: str) -> None:
        raise AssertionError(reason)

    def _frames_in(self, data: bytes) -> None:
        buf = self._rbuf
        if buf:
            buf += data
            view: Any = buf
        else:
            view = data
        n = len(view)
        pos = 0
        limit = self.limit
        while n - pos >= 2 and not (self._doomed or self._closed):
            b0 = view[pos]
            b1 = view[pos + 1]
            ln = b1 & 0x7F
            if ln < 126:
                hdr = 2
            elif ln == 126:
                if n - pos < 4:
                    break
                ln = (view[pos + 2] << 8) | view[pos + 3]
                hdr = 4
            else:
                if n - pos < 10:
                    break
                ln = int.from_bytes(view[pos + 2:pos + 10], "big")
                hdr = 10
            if b0 & 0x70 or not b1 & 0x80:
                self._fail(1002, "protocol error")
                return
            if limit and ln + self._frag_size > limit:
                self._fail(1009, "message too big")
                return
            end = pos + hdr + 4 + ln
            if end > n:
                break
            payload = apply_mask(view[pos + hdr + 4:end], view[pos + hdr:pos + hdr + 4])
            pos = end
            self._frame(b0 & 0x80, b0 & 0x0F, payload)
        if pos >= n:
            if buf:
                buf.clear()
        elif buf:
            del buf[:pos]
        else:
            self._rbuf = bytearray(view[pos:])

    def _frame(self, fin: int, op: int, payload: bytes) -> None:
        if op == 1:
            if self._frag is not None:
                self._fail(1002, "expected a continuation frame")
            elif fin:
                self._on_text(payload)
            else:
                self._frag = [payload]
                self._frag_size = len(payload)
        elif op == 0:
            if self._frag is None:
                self._fail(1002, "unexpected continuation frame")
                return
            self._frag.append(payload)
            self._frag_size += len(payload)
            if fin:
                text = b"".join(self._frag)
                self._frag = None
                self._frag_size = 0
                self._on_text(text)
        else:
            self._fail(1002, f"opcode {op} not in this benchmark")


REQUEST = (b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Protocol: juggler.0\r\n\r\n")


def opened(limit: int) -> WsServerProtocol:
    ws = WsServerProtocol(subprotocol="juggler.0", read_limit=limit)
    assert ws.accept(ws.receive_data(REQUEST)[0])
    ws.data_to_send()
    return ws


class NewParser:
    """juggler/conn.py's _frames_in: the sans-I/O protocol over the Rust reader."""

    def __init__(self, limit: int) -> None:
        self.ws = opened(limit)
        self.state = ConnState.CONNECTED
        self.texts = 0

    def _on_text(self, data: bytes) -> None:
        self.texts += 1

    def _control(self, ev: tuple[Any, ...]) -> None:
        raise AssertionError(ev)

    # the connection's own dispatch, not a copy of it
    _frames_in = Conn._frames_in


def _ws_header(n: int) -> bytes:
    """juggler/conn.py's header builder before the native writer."""
    if n < 126:
        return bytes((0x81, n))
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big")
    return b"\x81\x7f" + n.to_bytes(8, "big")


def write_python(turns: list[list[bytes]], ws: Any = None) -> int:
    """The former Conn.write + Conn._flush: a header and the frame per message, one join per turn."""
    n = 0
    for turn in turns:
        out: list[bytes] = []
        for frame in turn:
            out.append(_ws_header(len(frame)))
            out.append(frame)
        data = b"".join(out) if len(out) > 1 else out[0]
        n += len(data)
    return n


def write_rust(turns: list[list[bytes]], ws: WsServerProtocol) -> int:
    """WsServerProtocol.send_text per message, data_to_send (one native call) per turn."""
    send = ws.send_text
    n = 0
    for turn in turns:
        for frame in turn:
            send(frame)
        chunks = ws.data_to_send()
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        n += len(data)
    return n


RES = (b'{"meta":{"type":9,"uuid":"5a0c3ea4-6d0b-4c3e-9a33-1c2d3e4f5a6b"},"payload":{"for":'
       b'"0b5a5b0a-4ef2-4b7e-9a4f-5f0f1f7d3c21","uri":"test.echo","args":"hello"}}\n')


def write_workloads() -> dict[str, tuple[list[list[bytes]], int]]:
    """name -> (turns, each a list of frames; messages in all)."""
    big = b"x" * 65536
    return {
        f"1 RES ({len(RES)} B) per turn": ([[RES]] * 2000, 2000),
        "ACK + RES per turn": ([[RES, RES]] * 1000, 2000),
        "10 RES per turn": ([[RES] * 10] * 200, 2000),
        "64 KiB message per turn": ([[big]] * 50, 50),
    }


CALL = (b'{"type":1,"msg_uuid":"0b5a5b0a-4ef2-4b7e-9a4f-5f0f1f7d3c21","uri":"test.echo",'
        b'"timeout":1000000000,"args":"hello"}')


def workloads() -> dict[str, tuple[list[bytes], int]]:
    """name -> (reads, text messages they carry)."""
    one = frame(True, 1, CALL)
    ten = one * 10
    big = frame(True, 1, b"x" * 65536)
    frag = frame(False, 1, CALL[:40]) + frame(False, 0, CALL[40:80]) + frame(True, 0, CALL[80:])
    split = [one[:50], one[50:]]
    return {
        f"1 CALL ({len(CALL)} B) per read": ([one] * 2000, 2000),
        "10 CALLs per read": ([ten] * 200, 2000),
        "1 CALL split over 2 reads": (split * 2000, 2000),
        "1 CALL in 3 fragments": ([frag] * 2000, 2000),
        "64 KiB message per read": ([big] * 50, 50),
    }


def run_write(fn: Any, turns: list[list[bytes]]) -> float:
    ws = opened(0)  # the handshake is not what is measured
    t0 = time.perf_counter()
    fn(turns, ws)
    return time.perf_counter() - t0


def run(cls: type, reads: list[bytes], want: int) -> float:
    p = cls(1 << 20)
    fi = p._frames_in
    t0 = time.perf_counter()
    for r in reads:
        fi(r)
    dt = time.perf_counter() - t0
    assert p.texts == want, (cls.__name__, p.texts, want)
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", metavar="FILE", help="write the results (JSON, µs per message) there")
    args = ap.parse_args(argv)
    load0 = loadavg()
    results: dict[str, dict[str, float]] = {}
    for name, (reads, n) in workloads().items():
        best = {"python": float("inf"), "rust": float("inf")}
        for _ in range(args.rounds):  # interleaved: python, rust, python, rust, ...
            best["python"] = min(best["python"], run(OldParser, reads, n))
            best["rust"] = min(best["rust"], run(NewParser, reads, n))
        results["read: " + name] = {k: v / n * 1e6 for k, v in best.items()}  # µs per message
    for name, (turns, n) in write_workloads().items():
        assert write_python(turns) == write_rust(turns, opened(0))
        best = {"python": float("inf"), "rust": float("inf")}
        for _ in range(args.rounds):
            best["python"] = min(best["python"], run_write(write_python, turns))
            best["rust"] = min(best["rust"], run_write(write_rust, turns))
        results["write: " + name] = {k: v / n * 1e6 for k, v in best.items()}
    if args.out:
        save(args.out, {"rounds": args.rounds, "loadavg_before": load0, "loadavg_after": loadavg(),
                        "us_per_message": results})
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    print(f"{'workload':40} {'python µs/msg':>14} {'rust µs/msg':>12} {'speed-up':>9}")
    for name, r in results.items():
        print(f"{name:40} {r['python']:14.3f} {r['rust']:12.3f} {r['python'] / r['rust']:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
