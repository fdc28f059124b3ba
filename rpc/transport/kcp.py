"""KCP, sans-I/O: the ARQ protocol of kcp-go (ikcp), without sockets or clocks.

A ``KcpSession`` turns writes into KCP segments and received datagrams into
bytes. It owns no socket, task or clock: the driver passes ``now`` (a
millisecond counter that wraps at 2**32, like kcp-go's) to every call that
needs time, sends what ``take_output()`` returns, and calls ``update(now)``
at ``check(now)``.

What it does, as kcp-go does it, so that a Go peer sees a normal peer:
segments (``conv cmd frg wnd ts sn una len`` little endian + data), a send
queue and buffer bounded by the windows, a receive buffer reordering
segments into the receive queue, acknowledgements (``ack_nodelay``: at once,
otherwise with the next flush), ``una`` (cumulative), retransmission on
RTO with backoff, fast resend after ``fast_resend`` later acknowledgements,
window probes (WASK/WINS) when the peer's window is zero, and congestion
control unless ``no_cwnd``.

The receive side is a byte stream: segments are delivered in order whatever
their ``frg`` (message boundaries mean nothing to rpcx's framing). The send
side follows kcp-go's ``Write``: in message mode a write is cut into
MSS-sized messages of one segment each; in stream mode writes are also
packed into the last queued segment.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rpc.transport.errors import KcpPacketError

CMD_PUSH, CMD_ACK, CMD_WASK, CMD_WINS = 81, 82, 83, 84
#: bytes of a segment header
OVERHEAD = 24
RTO_NODELAY_MIN, RTO_MIN, RTO_DEFAULT, RTO_MAX = 30, 100, 200, 60000
THRESH_INIT, THRESH_MIN = 2, 2
PROBE_INIT, PROBE_LIMIT = 7000, 120000
#: the peer's receive window assumed until it says (kcp-go's default)
PEER_WINDOW = 32
_ASK_SEND, _ASK_TELL = 1, 2
_HEADER = struct.Struct("<IBBHIIII")
#: flush's segment writer: (cmd, frg, ts, sn, data)
_Emit = Callable[..., None]


def diff(later: int, earlier: int) -> int:
    """``later - earlier`` on the 32-bit wrapping counters (sequence numbers, milliseconds)."""
    return ((later - earlier + 0x80000000) & 0xFFFFFFFF) - 0x80000000


@dataclass(kw_only=True, frozen=True, slots=True)
class KcpSettings:
    """How a KCP session behaves; the defaults are kcp-go's "fast" profile
    (``NoDelay(1, 10, 2, 1)``) with 128-segment windows, which a Go peer with
    its own defaults interoperates with (each side's windows bound only its own
    sending and receiving)."""

    #: bytes of a datagram, headers of the packet layer included (kcp-go: 1400)
    mtu: int = 1400
    #: segments in flight unacknowledged
    send_window: int = 128
    #: segments buffered for the reader (what we advertise)
    receive_window: int = 128
    #: milliseconds between flushes of acknowledgements and retransmissions
    interval: int = 10
    #: minimum RTO 30 ms (not 100) and a gentler backoff (RTO × 1.5, not × 2)
    nodelay: bool = True
    #: retransmit a segment after this many later ones are acknowledged (0: never)
    fast_resend: int = 2
    #: no congestion window: only the windows limit what is in flight
    no_cwnd: bool = True
    #: pack writes into full segments (kcp-go's SetStreamMode); else one message per write chunk
    stream: bool = False
    #: acknowledge each received datagram at once (kcp-go's SetACKNoDelay)
    ack_nodelay: bool = True
    #: transmissions of one segment after which the session is declared dead
    dead_link: int = 20

    def __post_init__(self) -> None:
        if not 50 <= self.mtu <= 1500:
            raise ValueError(f"KCP mtu {self.mtu}: expected 50..1500 bytes")
        if not 1 <= self.send_window <= 65535 or not 1 <= self.receive_window <= 65535:
            raise ValueError("KCP windows: expected 1..65535 segments")
        if not 10 <= self.interval <= 5000:
            raise ValueError(f"KCP interval {self.interval}: expected 10..5000 ms")
        if self.fast_resend < 0 or self.dead_link < 1:
            raise ValueError("KCP fast_resend must be >= 0 and dead_link >= 1")


class Segment:
    """A segment and, on the send side, its retransmission state."""

    __slots__ = ("acked", "data", "fastack", "frg", "resendts", "rto", "sn", "ts", "una", "wnd", "xmit")

    def __init__(self, data: bytes, frg: int = 0, sn: int = 0, ts: int = 0) -> None:
        self.data = data
        self.frg = frg
        self.sn = sn
        self.ts = ts
        self.wnd = 0
        self.una = 0
        self.rto = 0
        self.xmit = 0
        self.resendts = 0
        self.fastack = 0
        self.acked = False


class KcpSession:
    """One KCP conversation (``conv``, chosen by the client).

    ``reserved`` bytes of each datagram are left for the packet layer
    (``kcpwire``: nonce, checksum, FEC header), so segments plus headers fit in
    ``settings.mtu``. Not thread-safe; every call is cheap and never blocks.
    """

    def __init__(self, conv: int, settings: KcpSettings | None = None, *, reserved: int = 0, now: int = 0) -> None:
        self.conv = conv & 0xFFFFFFFF
        self.settings = s = settings or KcpSettings()
        if not 0 <= reserved < s.mtu - OVERHEAD - 1:
            raise ValueError(f"reserved {reserved} leaves no room in a {s.mtu}-byte datagram")
        self._room = s.mtu - reserved  # bytes of segments per datagram
        #: bytes of data per segment
        self.mss = self._room - OVERHEAD
        self.snd_una = self.snd_nxt = self.rcv_nxt = 0
        self.rmt_wnd = PEER_WINDOW
        self.cwnd = 1 if not s.no_cwnd else s.send_window
        self._incr = self.mss
        self._ssthresh = THRESH_INIT
        self._srtt = self._rttvar = 0
        self.rto = RTO_DEFAULT
        self._minrto = RTO_NODELAY_MIN if s.nodelay else RTO_MIN
        self._probe = 0
        self._probe_wait = 0
        self._ts_probe = 0
        self._ts_flush = now
        self.snd_queue: deque[Segment] = deque()
        self.snd_buf: deque[Segment] = deque()
        self.rcv_buf: list[Segment] = []
        self.rcv_queue: deque[bytes] = deque()
        self._acks: list[tuple[int, int]] = []
        self._out: list[bytes] = []
        #: a segment was sent ``dead_link`` times unacknowledged: the peer is gone
        self.dead = False

    def resume(self, rcv_nxt: int, snd_nxt: int) -> None:
        """Start a fresh session in the middle of a conversation the peer
        still has: expect its segment ``rcv_nxt`` next and number ours from
        ``snd_nxt`` (the ``una`` it sends: what it expects from us). For a
        listener that forgot an idle session (or restarted) while the peer
        kept it: every earlier segment was acknowledged, so the byte stream
        resumes where it stopped."""
        self.rcv_nxt = rcv_nxt & 0xFFFFFFFF
        self.snd_una = self.snd_nxt = snd_nxt & 0xFFFFFFFF

    # --- the application's side
    def send(self, data: bytes | bytearray | memoryview) -> None:
        """Queue bytes to send; they leave with the next ``flush``/``update``.
        The send queue is not bounded here: the driver watches ``waiting()``."""
        data = memoryview(data)
        mss = self.mss
        if self.settings.stream and self.snd_queue and data:
            last = self.snd_queue[-1]
            room = mss - len(last.data)
            if room > 0:
                last.data += bytes(data[:room])
                data = data[room:]
        for start in range(0, len(data), mss):
            self.snd_queue.append(Segment(bytes(data[start:start + mss])))

    def recv(self) -> bytes:
        """All bytes received in order so far (``b""`` if none). Not calling
        it lets the receive queue fill and the advertised window close."""
        if not self.rcv_queue:
            return b""
        full = len(self.rcv_queue) >= self.settings.receive_window
        data = b"".join(self.rcv_queue)
        self.rcv_queue.clear()
        self._move_ready()
        if full:
            self._probe |= _ASK_TELL  # tell the peer our window opened again
        return data

    def readable(self) -> int:
        """Segments waiting in the receive queue."""
        return len(self.rcv_queue)

    def waiting(self) -> int:
        """Segments queued or in flight, not yet acknowledged (kcp-go's WaitSnd)."""
        return len(self.snd_buf) + len(self.snd_queue)

    def take_output(self) -> list[bytes]:
        """The datagrams' KCP payloads to send, oldest first (each at most
        ``mtu - reserved`` bytes); they are handed over once."""
        out, self._out = self._out, []
        return out

    # --- the network's side
    def input(self, data: bytes | memoryview, now: int, *, regular: bool = True) -> None:
        """Take one datagram's segments. Raises ``KcpPacketError`` for a
        truncated segment, an unknown command or another conversation; segments
        before the bad one are kept (as kcp-go does). ``regular=False`` is for
        segments recovered by FEC: their window and timing are not trusted."""
        view = memoryview(data)
        if len(view) < OVERHEAD:
            raise KcpPacketError(f"KCP datagram of {len(view)} bytes: shorter than a segment header")
        old_una = self.snd_una
        latest_ack: int | None = None
        pos = 0
        while len(view) - pos >= OVERHEAD:
            conv, cmd, frg, wnd, ts, sn, una, length = _HEADER.unpack_from(view, pos)
            pos += OVERHEAD
            if conv != self.conv:
                raise KcpPacketError(f"KCP segment of conversation {conv}, expected {self.conv}")
            if length > len(view) - pos:
                raise KcpPacketError(f"KCP segment announces {length} bytes, {len(view) - pos} left")
            if cmd not in (CMD_PUSH, CMD_ACK, CMD_WASK, CMD_WINS):
                raise KcpPacketError(f"KCP segment command {cmd}: unknown")
            if regular:
                self.rmt_wnd = wnd
            self._parse_una(una)
            if cmd == CMD_ACK:
                self._parse_ack(sn, ts)
                latest_ack = ts
            elif cmd == CMD_PUSH:
                if diff(sn, self.rcv_nxt + self.settings.receive_window) < 0:
                    self._acks.append((sn, ts))
                    if diff(sn, self.rcv_nxt) >= 0:
                        self._parse_data(sn, frg, bytes(view[pos:pos + length]))
            elif cmd == CMD_WASK:
                self._probe |= _ASK_TELL
            pos += length
        if latest_ack is not None and regular and diff(now, latest_ack) >= 0:
            self._update_rtt(diff(now, latest_ack))
        if not self.settings.no_cwnd and diff(self.snd_una, old_una) > 0 and self.cwnd < self.rmt_wnd:
            self._grow_cwnd()
        if self.settings.ack_nodelay and self._acks:
            self.flush(now, ack_only=True)

    def _parse_una(self, una: int) -> None:
        buf = self.snd_buf
        while buf and diff(una, buf[0].sn) > 0:
            buf.popleft()
        self.snd_una = buf[0].sn if buf else self.snd_nxt

    def _parse_ack(self, sn: int, ts: int) -> None:
        if diff(sn, self.snd_una) < 0 or diff(sn, self.snd_nxt) >= 0:
            return
        for seg in self.snd_buf:
            if diff(sn, seg.sn) < 0:
                break
            if seg.sn == sn:
                seg.acked = True
                seg.data = b""
            elif diff(seg.ts, ts) <= 0:
                seg.fastack += 1  # a later segment, sent after this one, arrived first

    def _parse_data(self, sn: int, frg: int, data: bytes) -> None:
        buf = self.rcv_buf
        at = len(buf)
        for i in range(len(buf) - 1, -1, -1):
            d = diff(sn, buf[i].sn)
            if d == 0:
                return  # a duplicate
            if d > 0:
                break
            at = i
        buf.insert(at, Segment(data, frg, sn))
        self._move_ready()

    def _move_ready(self) -> None:
        buf, window = self.rcv_buf, self.settings.receive_window
        taken = 0
        while taken < len(buf) and buf[taken].sn == self.rcv_nxt and len(self.rcv_queue) < window:
            if buf[taken].data:  # an empty segment (never sent by kcp-go) only moves rcv_nxt
                self.rcv_queue.append(buf[taken].data)
            self.rcv_nxt = (self.rcv_nxt + 1) & 0xFFFFFFFF
            taken += 1
        if taken:
            del buf[:taken]

    def _update_rtt(self, rtt: int) -> None:
        """RFC 6298, as kcp-go computes it."""
        if self._srtt == 0:
            self._srtt, self._rttvar = rtt, rtt >> 1
        else:
            delta = rtt - self._srtt
            self._srtt += delta >> 3
            delta = abs(delta)
            if rtt < self._srtt - self._rttvar:
                self._rttvar += (delta - self._rttvar) >> 5
            else:
                self._rttvar += (delta - self._rttvar) >> 2
        rto = self._srtt + max(self.settings.interval, self._rttvar << 2)
        self.rto = min(max(self._minrto, rto), RTO_MAX)

    def _grow_cwnd(self) -> None:
        mss = self.mss
        if self.cwnd < self._ssthresh:
            self.cwnd += 1
            self._incr += mss
        else:
            self._incr = max(self._incr, mss)
            self._incr += (mss * mss) // self._incr + mss // 16
            if (self.cwnd + 1) * mss <= self._incr:
                self.cwnd += 1
        if self.cwnd > self.rmt_wnd:
            self.cwnd = self.rmt_wnd
            self._incr = self.rmt_wnd * mss

    # --- timers
    def update(self, now: int) -> None:
        """Flush if an interval has passed since the last timed flush (call it
        at ``check(now)``; extra calls are harmless)."""
        slap = diff(now, self._ts_flush)
        if abs(slap) >= 10000:
            self._ts_flush, slap = now, 0
        if slap >= 0:
            self._ts_flush = (self._ts_flush + self.settings.interval) & 0xFFFFFFFF
            if diff(now, self._ts_flush) >= 0:
                self._ts_flush = (now + self.settings.interval) & 0xFFFFFFFF
            self.flush(now)

    def check(self, now: int) -> int:
        """When ``update`` is next due (a ``now``-scale timestamp): the next
        interval or the earliest retransmission, whichever comes first."""
        ts_flush = self._ts_flush
        if abs(diff(now, ts_flush)) >= 10000:
            ts_flush = now
        if diff(now, ts_flush) >= 0:
            return now
        wait = min(diff(ts_flush, now), self.settings.interval)
        for seg in self.snd_buf:
            if not seg.acked:
                d = (seg.resendts - now) & 0xFFFFFFFF  # diff(), inlined (hot loop)
                if d == 0 or d >= 0x80000000:
                    return now
                if d < wait:  # noqa: PLR1730 - not min(): the hot loop
                    wait = d
        return (now + wait) & 0xFFFFFFFF

    # --- output
    def flush(self, now: int, *, ack_only: bool = False) -> None:
        """Put acknowledgements, probes, new segments (as far as the windows
        allow) and due retransmissions into datagrams for ``take_output``."""
        s = self.settings
        wnd = max(0, s.receive_window - len(self.rcv_queue))
        una = self.rcv_nxt
        out = bytearray()
        room = self._room

        def segment(cmd: int, frg: int, ts: int, sn: int, data: bytes = b"") -> None:
            nonlocal out
            if len(out) + OVERHEAD + len(data) > room and out:
                self._out.append(bytes(out))
                out = bytearray()
            out += _HEADER.pack(self.conv, cmd, frg, wnd, ts, sn, una, len(data))
            out += data

        last = len(self._acks) - 1
        for i, (sn, ts) in enumerate(self._acks):
            if diff(sn, self.rcv_nxt) >= 0 or i == last:  # older ones are covered by una
                segment(CMD_ACK, 0, ts, sn)
        self._acks.clear()
        if not ack_only:
            self._flush_probes(now, segment)
            self._flush_data(now, segment)
        if out:
            self._out.append(bytes(out))

    def _flush_probes(self, now: int, segment: _Emit) -> None:
        if self.rmt_wnd == 0:
            if self._probe_wait == 0:
                self._probe_wait = PROBE_INIT
                self._ts_probe = now + self._probe_wait
            elif diff(now, self._ts_probe) >= 0:
                self._probe_wait = min(max(self._probe_wait, PROBE_INIT) * 3 // 2, PROBE_LIMIT)
                self._ts_probe = now + self._probe_wait
                self._probe |= _ASK_SEND
        else:
            self._ts_probe = self._probe_wait = 0
        if self._probe & _ASK_SEND:
            segment(CMD_WASK, 0, 0, 0)
        if self._probe & _ASK_TELL:
            segment(CMD_WINS, 0, 0, 0)
        self._probe = 0

    def _flush_data(self, now: int, segment: _Emit) -> None:
        s = self.settings
        cwnd = min(s.send_window, self.rmt_wnd)
        if not s.no_cwnd:
            cwnd = min(self.cwnd, cwnd)
        new = 0
        while self.snd_queue and diff(self.snd_nxt, self.snd_una + cwnd) < 0:
            seg = self.snd_queue.popleft()
            seg.sn = self.snd_nxt
            self.snd_buf.append(seg)
            self.snd_nxt = (self.snd_nxt + 1) & 0xFFFFFFFF
            new += 1
        resent = s.fast_resend if s.fast_resend > 0 else 0xFFFFFFFF
        fast = lost = 0
        for seg in self.snd_buf:
            if seg.acked:
                continue
            if seg.xmit == 0:
                seg.rto = self.rto
            elif seg.fastack >= resent or (seg.fastack > 0 and new == 0):
                seg.rto = self.rto  # fast (or early) retransmit
                fast += 1
            elif (now - seg.resendts) & 0xFFFFFFFF < 0x80000000:  # now >= resendts, inlined (hot loop)
                seg.rto += self.rto // 2 if s.nodelay else self.rto
                lost += 1
            else:
                continue
            seg.fastack = 0
            seg.resendts = (now + seg.rto) & 0xFFFFFFFF
            seg.xmit += 1
            seg.ts = now
            segment(CMD_PUSH, seg.frg, now, seg.sn, seg.data)
            if seg.xmit >= s.dead_link:
                self.dead = True
        if not s.no_cwnd:
            if fast:
                self._ssthresh = max(diff(self.snd_nxt, self.snd_una) // 2, THRESH_MIN)
                self.cwnd = self._ssthresh + resent
                self._incr = self.cwnd * self.mss
            if lost:
                self._ssthresh = max(cwnd // 2, THRESH_MIN)
                self.cwnd, self._incr = 1, self.mss
            if self.cwnd < 1:
                self.cwnd, self._incr = 1, self.mss
