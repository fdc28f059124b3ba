"""The floor under the fan-out's CPU figure: what writing one small frame to
one loopback TCP connection costs the writing process, with nothing else.

Opens N loopback TCP connections to a reader process (which only drains
them), then writes a 200-byte frame to every connection R times a second
for D seconds through ``rustext.FanoutHub`` (the same sendmsg loop the
server uses, without the server), and reports this process's user and
system CPU per write. On loopback the kernel runs the receiving side's TCP
work in the sender's context, so this is what any server pays per delivery
on one machine. It also reports how long one event's writes take from first
to last (wall time): the wait of each event's last connection, before any
reading, with nothing else in the process::

    python benches/juggler/sendmsg_floor.py --connections 1000 --rate 50 -d 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import selectors
import socket
import time

import rustext


def reader(port: int, n: int, ready: mp.synchronize.Event) -> None:
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        socks.append(s)
    ready.set()
    open_ = n
    while open_:
        for key, _ in sel.select(1.0):
            data = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
            if not data:
                sel.unregister(key.fileobj)
                open_ -= 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rate", type=float, default=50)
    p.add_argument("-d", "--duration", type=float, default=10)
    p.add_argument("--bytes", type=int, default=200)
    args = p.parse_args()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4096)
    ready = mp.Event()
    proc = mp.Process(target=reader, args=(lsock.getsockname()[1], args.connections, ready), daemon=True)
    proc.start()
    conns = []
    for _ in range(args.connections):
        c, _ = lsock.accept()
        c.setblocking(False)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(c)
    ready.wait(30)
    hub = rustext.FanoutHub()
    for i, c in enumerate(conns):
        hub.add_conn(i, c.fileno())
        hub.subscribe(i, 1)
    frame = rustext.ws_text_frames([b"x" * (args.bytes - 4)])
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    sent = written = 0
    walls: list[float] = []
    while time.perf_counter() - t0 < args.duration:
        w0 = time.perf_counter()
        w, held, partial, failed = hub.publish([(1, frame)])
        walls.append(time.perf_counter() - w0)
        written += w
        sent += 1
        time.sleep(max(0.0, t0 + sent / args.rate - time.perf_counter()))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    user = (r1.ru_utime - r0.ru_utime) * 1e6 / max(1, written)
    system = (r1.ru_stime - r0.ru_stime) * 1e6 / max(1, written)
    print(f"{written} writes of {len(frame)} bytes to {args.connections} loopback connections: "
          f"user {user:.2f} µs + system {system:.2f} µs = {user + system:.2f} µs per write")
    # the wall time of one event's writes: the last connection of an event waits at least this long
    walls.sort()
    n = len(walls)
    print(f"one event to all {args.connections} (ms): p50 {walls[n // 2] * 1e3:.1f}  "
          f"p99 {walls[min(n - 1, n * 99 // 100)] * 1e3:.1f}  max {walls[-1] * 1e3:.1f}")
    for c in conns:
        c.close()
    proc.join(10)


if __name__ == "__main__":
    main()
