"""The sans-I/O KCP core (rpc/transport/kcp.py): two sessions joined in
memory by a simulated network with its own millisecond clock (no sockets,
no sleeps), lossless and with loss, reordering and duplication; windows,
probes, dead links and malformed input."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.transport.errors import KcpPacketError
from rpc.transport.kcp import (
    CMD_PUSH,
    CMD_WASK,
    CMD_WINS,
    OVERHEAD,
    KcpSession,
    KcpSettings,
)

pytestmark = pytest.mark.timeout(60)


class Net:
    """Datagrams in flight between two sessions, delivered at ``now`` +
    latency, with seeded loss, duplication and jitter (which reorders)."""

    def __init__(self, a: KcpSession, b: KcpSession, *, seed: int = 1, loss: float = 0.0, dup: float = 0.0,
                 jitter: int = 0, latency: int = 5) -> None:
        self.a, self.b = a, b
        self.rng = random.Random(seed)
        self.loss, self.dup, self.jitter, self.latency = loss, dup, jitter, latency
        self.now = 0
        self.flight: list[tuple[int, int, KcpSession, bytes]] = []
        self.order = 0
        self.sent = 0

    def _ship(self, src: KcpSession, dst: KcpSession) -> None:
        for dgram in src.take_output():
            assert len(dgram) <= src.settings.mtu
            self.sent += 1
            copies = 0 if self.rng.random() < self.loss else 1
            if copies and self.rng.random() < self.dup:
                copies = 2
            for _ in range(copies):
                self.order += 1
                at = self.now + self.latency + self.rng.randint(0, self.jitter)
                self.flight.append((at, self.order, dst, dgram))

    def run(self, until: int, *, step: int = 1, done: object = None) -> None:
        """Advance the clock to ``until`` ms (or until ``done()``), updating both sessions."""
        while self.now < until:
            for s in (self.a, self.b):
                if s.check(self.now) == self.now:
                    s.update(self.now)
            self._ship(self.a, self.b)
            self._ship(self.b, self.a)
            self.flight.sort()
            while self.flight and self.flight[0][0] <= self.now:
                _, _, dst, dgram = self.flight.pop(0)
                dst.input(dgram, self.now)
            self._ship(self.a, self.b)
            self._ship(self.b, self.a)
            if callable(done) and done():
                return
            self.now += step


def pair(**kw: object) -> tuple[KcpSession, KcpSession]:
    conf = KcpSettings(**kw)  # type: ignore[arg-type]
    return KcpSession(0x1234, conf, reserved=28), KcpSession(0x1234, conf, reserved=28)


def transfer(net: Net, src: KcpSession, dst: KcpSession, payload: bytes, limit: int, chunk: int = 7000) -> bytes:
    got = bytearray()
    for i in range(0, len(payload), chunk):
        src.send(payload[i:i + chunk])

    def done() -> bool:
        got.extend(dst.recv())
        return len(got) >= len(payload) and src.waiting() == 0

    net.run(limit, done=done)
    return bytes(got)


@pytest.mark.parametrize("stream", [False, True])
def test_lossless_transfer_both_ways(stream: bool) -> None:
    a, b = pair(stream=stream)
    net = Net(a, b)
    up, down = random.Random(2).randbytes(300_000), random.Random(3).randbytes(200_000)
    for i in range(0, len(down), 999):
        b.send(down[i:i + 999])
    assert transfer(net, a, b, up, 20_000) == up
    got = bytearray()
    net.run(net.now + 20_000, done=lambda: bool(got.extend(a.recv())) or len(got) >= len(down))
    assert bytes(got) == down
    assert a.mss == 1400 - 28 - OVERHEAD


def test_stream_mode_packs_small_writes_and_message_mode_does_not() -> None:
    for stream, segments in ((True, 1), (False, 100)):
        s = KcpSession(1, KcpSettings(stream=stream))
        for _ in range(100):
            s.send(b"0123456789")
        assert len(s.snd_queue) == segments


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_loss_reordering_and_duplication(seed: int) -> None:
    a, b = pair()
    net = Net(a, b, seed=seed, loss=0.2, dup=0.1, jitter=30)
    payload = random.Random(seed).randbytes(200_000)
    assert transfer(net, a, b, payload, 120_000) == payload
    assert not a.dead and not b.dead


def test_congestion_control_and_delayed_acks_also_deliver() -> None:
    a, b = pair(no_cwnd=False, nodelay=False, ack_nodelay=False, fast_resend=0, interval=20)
    net = Net(a, b, seed=9, loss=0.1, jitter=10)
    payload = random.Random(9).randbytes(100_000)
    assert transfer(net, a, b, payload, 300_000) == payload


def test_a_reader_that_does_not_read_closes_the_window_and_reopens_it() -> None:
    a, b = pair(receive_window=16, send_window=64)
    net = Net(a, b)
    payload = random.Random(4).randbytes(100 * a.mss)
    a.send(payload)
    net.run(3000)
    assert b.readable() == 16  # nothing more is accepted than the window
    assert a.rmt_wnd == 0 and a.waiting() > 0
    got = bytearray(b.recv())  # reading announces the opened window (WINS)
    net.run(net.now + 30_000, done=lambda: bool(got.extend(b.recv())) or len(got) >= len(payload))
    assert bytes(got) == payload


def test_a_silent_peer_makes_the_session_dead_after_dead_link_transmissions() -> None:
    s = KcpSession(7, KcpSettings(dead_link=5))
    s.send(b"hello")
    now = 0
    while not s.dead and now < 60_000:
        s.update(now)
        s.take_output()
        now = max(s.check(now), now + 1)
    assert s.dead
    assert s.snd_buf[0].xmit == 5


def test_check_waits_at_most_an_interval_and_rto_backs_off() -> None:
    s = KcpSession(7, KcpSettings(interval=50, nodelay=False))
    s.update(0)
    assert s.check(0) == 50
    s.send(b"x")
    s.flush(10)
    (dgram,) = s.take_output()
    assert struct.unpack_from("<IBBHIIII", dgram)[1] == CMD_PUSH
    first = s.snd_buf[0].resendts
    assert first == 10 + 200  # the initial RTO
    s.flush(first)
    assert s.snd_buf[0].resendts == first + 400  # backed off: RTO doubled


def test_window_probe_when_the_peer_has_no_room() -> None:
    s = KcpSession(7)
    peer_full = struct.pack("<IBBHIIII", 7, CMD_WINS, 0, 0, 0, 0, 0, 0)
    s.input(peer_full, 0)
    assert s.rmt_wnd == 0
    s.flush(0)
    s.flush(8000)  # PROBE_INIT later
    cmds = [struct.unpack_from("<IB", d)[1] for d in s.take_output()]
    assert CMD_WASK in cmds
    s.input(struct.pack("<IBBHIIII", 7, CMD_WASK, 0, 32, 0, 0, 0, 0), 8001)
    s.flush(8001)
    assert any(struct.unpack_from("<IB", d)[1] == CMD_WINS for d in s.take_output())


def test_fragmented_messages_are_delivered_as_one_byte_stream() -> None:
    s = KcpSession(7)
    segs = b"".join(struct.pack("<IBBHIIII", 7, CMD_PUSH, 2 - i, 32, 0, i, 0, 3) + b"abc" for i in (2, 0, 1))
    s.input(segs, 0)
    assert s.recv() == b"abcabcabc"
    assert s.rcv_nxt == 3


def test_bad_input_is_a_typed_error() -> None:
    s = KcpSession(7)
    with pytest.raises(KcpPacketError, match="shorter"):
        s.input(b"\x07\x00\x00\x00", 0)
    with pytest.raises(KcpPacketError, match="conversation"):
        s.input(struct.pack("<IBBHIIII", 8, CMD_PUSH, 0, 32, 0, 0, 0, 0), 0)
    with pytest.raises(KcpPacketError, match="command"):
        s.input(struct.pack("<IBBHIIII", 7, 99, 0, 32, 0, 0, 0, 0), 0)
    with pytest.raises(KcpPacketError, match="announces"):
        s.input(struct.pack("<IBBHIIII", 7, CMD_PUSH, 0, 32, 0, 0, 0, 50) + b"short", 0)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="mtu"):
        KcpSettings(mtu=20)
    with pytest.raises(ValueError, match="interval"):
        KcpSettings(interval=0)
    with pytest.raises(ValueError, match="reserved"):
        KcpSession(1, KcpSettings(mtu=60), reserved=40)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2**32 - 1))
def test_garbage_input_is_a_typed_error_or_accepted(data: bytes, now: int) -> None:
    s = KcpSession(int.from_bytes(data[:4].ljust(4, b"\0"), "little"))
    try:
        s.input(data, now)
    except KcpPacketError:
        pass
    s.flush(now)
    s.recv()


_SEGMENT = st.tuples(st.sampled_from([81, 82, 83, 84]), st.integers(0, 255), st.integers(0, 65535),
                     st.integers(0, 2**32 - 1), st.integers(0, 40), st.integers(0, 40), st.binary(max_size=64))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_SEGMENT, min_size=1, max_size=6), max_size=20))
def test_well_formed_segments_with_any_numbers_keep_the_session_consistent(datagrams: list[list[tuple]]) -> None:
    """Segments of our conversation with arbitrary commands, windows, times,
    sequence numbers and acknowledgements (a confused or hostile peer): no
    error, the send state stays ordered, what is delivered comes in order."""
    s = KcpSession(5, KcpSettings(receive_window=16))
    for i in range(30):
        s.send(bytes([i]) * 10)
    s.flush(0)
    for now, segments in enumerate(datagrams, start=1):
        dgram = b"".join(struct.pack("<IBBHIIII", 5, cmd, frg, wnd, ts, sn, una, len(data)) + data
                         for cmd, frg, wnd, ts, sn, una, data in segments)
        s.input(dgram, now * 7)
        s.update(now * 7)
        s.take_output()
        s.recv()
        assert 0 <= (s.snd_nxt - s.snd_una) & 0xFFFFFFFF <= s.settings.send_window
        assert all((b.sn - a.sn) & 0xFFFFFFFF == 1 for a, b in zip(s.snd_buf, list(s.snd_buf)[1:]))
        assert all((seg.sn - s.rcv_nxt) & 0xFFFFFFFF < 2**31 for seg in s.rcv_buf)  # none already delivered
