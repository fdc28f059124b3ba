"""The juggler.0 session without I/O: frames in, items and frames out; no
socket, no event loop, times passed in."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import rustext
from hypothesis import given, settings
from hypothesis import strategies as st

from juggler.config import ServerConfig
from juggler.metrics import ServerStats
from juggler.session import CloseAfter, Refused, Session, Work

CALL, PUB, SUB, UNSB = rustext.CALL, rustext.PUB, rustext.SUB, rustext.UNSB
ACK, NACK, EVNT = rustext.ACK, rustext.NACK, rustext.EVNT


def make(**config: Any) -> tuple[Session, list[str]]:
    rejected: list[str] = []
    return Session(ServerConfig(**config), ServerStats(), rejected.append, now=0.0), rejected


def uid() -> str:
    return str(uuid.uuid4())


def call(timeout_ns: int = 5_000_000_000, uri: str = "test.echo") -> bytes:
    return rustext.build_call(uid(), uri, timeout_ns, b'"x"')


def drain(session: Session) -> list[Any]:
    """Every item in turn, each Work done at once."""
    items = []
    while (item := session.next_item()) is not None:
        items.append(item)
        if isinstance(item, Work):
            session.done(item)
    return items


def pub(channel: str) -> bytes:
    return rustext.build_pub(uid(), channel, b"1")


def sub(channel: str) -> bytes:
    return rustext.build_sub(uid(), channel)


def test_one_at_a_time_when_asked() -> None:
    s, _ = make(max_concurrent_messages=1)
    for f in (call(), pub("news"), sub("news")):
        assert s.receive_text(f, 1.0) is None
    first = s.next_item()
    assert isinstance(first, Work) and first.msg.type == CALL and first.received_at == 1.0
    assert s.next_item() is None  # the first is not done: the second waits its turn
    assert not s.done(first)
    assert [i.msg.type for i in drain(s)] == [PUB, SUB]
    assert s.messages_in == 3 and s.stats.read[CALL] == 1


def test_calls_and_publications_to_other_channels_run_side_by_side() -> None:
    s, _ = make()
    for f in (call(), call(), pub("a"), pub("b"), pub("a"), call()):
        s.receive_text(f, 0.0)
    out = []
    while (item := s.next_item()) is not None:
        out.append(item)
    # the second PUB to "a" waits for the first; the CALL after it overtakes it
    assert [(w.msg.type, getattr(w.msg, "channel", None)) for w in out] == \
        [(CALL, None), (CALL, None), (PUB, "a"), (PUB, "b"), (CALL, None)]
    assert s.running == 5 and s.queued == 1
    s.done(out[2])  # the first PUB to "a" is done
    second_a = s.next_item()
    assert isinstance(second_a, Work) and second_a.msg.channel == "a"


def test_a_sub_waits_for_what_is_before_it_and_holds_what_is_after() -> None:
    s, _ = make()
    for f in (call(), sub("news"), call()):
        s.receive_text(f, 0.0)
    c1 = s.next_item()
    assert s.next_item() is None  # the SUB waits for the CALL's reply
    s.done(c1)
    sb = s.next_item()
    assert isinstance(sb, Work) and sb.msg.type == SUB
    assert s.next_item() is None  # the CALL after the SUB waits for it
    s.done(sb)
    assert isinstance(s.next_item(), Work)


def test_replies_go_out_in_request_order() -> None:
    s, _ = make()
    for f in (call(), call(), call()):
        s.receive_text(f, 0.0)
    w1, w2, w3 = s.next_item(), s.next_item(), s.next_item()
    assert isinstance(w1, Work) and isinstance(w2, Work) and isinstance(w3, Work)
    a2, a3 = s.ack(w2.msg), s.ack(w3.msg)
    assert not s.reply(w3.msg, a3) and not s.reply(w2.msg, a2)  # held: the first has not replied
    assert not s.done(w3) and not s.done(w2)
    a1 = s.ack(w1.msg)
    assert s.reply(w1.msg, a1)  # the oldest: written now
    assert s.done(w1) == [a2, a3]  # then the others, in request order
    assert s.running == 0


def test_replies_of_the_new_oldest_go_out_when_it_becomes_the_oldest() -> None:
    s, _ = make()
    for f in (call(), call()):
        s.receive_text(f, 0.0)
    w1, w2 = s.next_item(), s.next_item()
    assert isinstance(w1, Work) and isinstance(w2, Work)
    early = s.nack(w2.msg, 500, "no")
    assert not s.reply(w2.msg, early)
    assert s.done(w1) == [early]  # w2 still runs: what it said so far goes out now
    late = s.ack(w2.msg)
    assert s.reply(w2.msg, late)  # and from now on, as it comes
    other = message(call())
    assert s.reply(other, s.ack(other))  # a message not handed out: written as it comes


def test_bad_input_ends_the_connection_after_the_replies_before_it() -> None:
    s, _ = make()
    assert s.receive_text(call(), 0.0) is None
    assert s.receive_text(b'{"meta":{"type":1}}', 0.0) is None  # queued behind the CALL
    assert s.receive_text(call(), 0.0) is None  # after bad input: forgotten
    items = drain(s)
    assert isinstance(items[0], Work)
    assert isinstance(items[1], CloseAfter) and items[1].code is None
    assert len(items) == 2
    assert s.close_reason == "bad_input" and s.stats.protocol_errors == 1


def test_bad_input_with_nothing_queued_ends_at_once() -> None:
    s, _ = make()
    end = s.receive_text(b"not json", 0.0)
    assert isinstance(end, CloseAfter) and end.code is None
    end = s.receive_binary()
    assert isinstance(end, CloseAfter) and end.code is None


def test_an_end_waits_for_the_message_being_handled() -> None:
    s, _ = make()
    s.receive_text(call(), 0.0)
    work = s.next_item()
    assert isinstance(work, Work)  # handed out, its reply not sent yet
    assert s.receive_binary() is None  # so the end is queued, not acted on now
    assert s.next_item() is None  # and waits for that reply
    s.done(work)
    assert isinstance(s.next_item(), CloseAfter)


def test_forbidden_types_are_bad_input() -> None:
    s, _ = make()
    s.allowed = 1 << CALL
    assert isinstance(s.receive_text(rustext.build_pub(uid(), "x"), 0.0), CloseAfter)


def test_rate_limit_nacks_in_order() -> None:
    s, rejected = make(rate_limit=1.0, rate_burst=1)
    s.receive_text(call(), 0.0)
    s.receive_text(call(), 0.1)  # over the rate
    items = drain(s)
    assert isinstance(items[0], Work)
    assert isinstance(items[1], Refused) and items[1].code == 429
    assert rejected == ["rate_limited"]
    s.receive_text(call(), 1.2)  # a token again
    assert isinstance(drain(s)[0], Work)


def test_rate_limit_close_ignores_what_follows() -> None:
    s, _ = make(rate_limit=1.0, rate_burst=1, rate_limit_action="close")
    s.receive_text(call(), 0.0)
    assert s.receive_text(call(), 0.1) is None  # queued behind the first
    assert s.receive_text(call(), 0.2) is None  # ignored
    items = drain(s)
    assert [type(i) for i in items] == [Work, CloseAfter]
    assert items[1].code == 1008 and s.close_reason == "rate_limited"
    assert s.messages_in == 2


class Identity:
    def __init__(self, refuse: dict[tuple[str, str], tuple[int, str]]) -> None:
        self.refuse = refuse

    def check(self, kind: str, target: str) -> tuple[int, str] | None:
        return self.refuse.get((kind, target))


def message(frame: bytes) -> rustext.ClientMessage:
    return rustext.parse_client_message(frame)


def test_admission() -> None:
    s, rejected = make(max_inflight_calls=2, call_timeout_ms=60_000, max_subscriptions=1)
    c = message(call(5_000_000_000))
    assert s.admit(c, draining=False, inflight=0) == 5000
    assert s.admit(message(call(0)), draining=False, inflight=0) == 60_000  # 0: the server default
    assert s.admit(message(call(999_999)), draining=False, inflight=0) == 60_000  # under 1 ms too
    assert s.admit(message(call(-1)), draining=False, inflight=0) == (500, "invalid call timeout: -1 ns")
    assert s.admit(c, draining=True, inflight=0) == (503, "server shutting down")
    assert s.admit(c, draining=False, inflight=2) == (429, "too many calls in flight (max 2)")
    pub = message(rustext.build_pub(uid(), "news"))
    assert s.admit(pub, draining=True, inflight=5) is None  # draining refuses new calls only
    sub = message(rustext.build_sub(uid(), "a"))
    assert s.admit(sub, draining=False, inflight=0) is None
    s.ack(sub)
    assert s.admit(sub, draining=False, inflight=0) is None  # the same subscription again
    other = message(rustext.build_sub(uid(), "b"))
    assert s.admit(other, draining=False, inflight=0) == (500, "too many subscriptions (max 1)")
    s.unsubscribed("a", False)
    assert s.admit(other, draining=False, inflight=0) is None
    assert rejected == ["draining", "inflight_limit", "subscription_limit"]


@dataclasses.dataclass
class Channels:
    history: set[str]
    notices: set[str]

    def has_history(self, channel: str) -> bool:
        return channel in self.history

    def sends_join_leave(self, channel: str) -> bool:
        return channel in self.notices


def test_admission_of_recovery_and_notices() -> None:
    s, _ = make()
    since = message(rustext.build_sub(uid(), "h", since=(3, "e1")))
    pattern = message(rustext.build_sub(uid(), "h.*", pattern=True, since=(3, "e1")))
    channels = Channels(history={"h"}, notices={"room"})
    assert s.admit(since, False, 0, channels) is None
    assert s.admit(since, False, 0)[0] == 400  # type: ignore[index]
    assert s.admit(pattern, False, 0, channels) == (400, "since (recovery) needs a channel, not a pattern")
    notices = message(rustext.build_sub(uid(), "room", join_leave=True))
    assert s.admit(notices, False, 0, channels) is None
    assert s.admit(notices, False, 0, Channels(history=set(), notices=set())) == \
        (400, "channel 'room' sends no join/leave notices")


def test_authorization_comes_first() -> None:
    s, rejected = make()
    s.identity = Identity({("call", "secret"): (403, "forbidden"), ("pub", "x"): (401, "who are you")})
    assert s.admit(message(call(uri="secret")), draining=True, inflight=0) == (403, "forbidden")
    assert s.admit(message(rustext.build_pub(uid(), "x")), draining=False, inflight=0) == (401, "who are you")
    assert s.admit(message(rustext.build_unsb(uid(), "x")), draining=False, inflight=0) is None  # UNSB: never
    assert rejected == ["forbidden", "unauthorized"]


def test_replies_are_juggler_frames() -> None:
    s, _ = make()
    c = message(call())
    t, for_uuid, frame = s.ack(c)
    ack = rustext.parse_server_message(frame)
    assert (t, ack.type, ack.for_uuid, ack.for_type, ack.uri) == (ACK, ACK, c.uuid, CALL, "test.echo")
    assert for_uuid == c.uuid and s.stats.calls == 1
    p = message(rustext.build_pub(uid(), "news"))
    nack = rustext.parse_server_message(s.nack(p, 500, "no Redis")[2])
    assert (nack.type, nack.channel, nack.code, nack.message) == (NACK, "news", 500, "no Redis")
    assert s.stats.nacks == 1


@dataclasses.dataclass
class Joined:
    offset: int
    epoch: str
    recovered: bool | None
    events: list[Any]


@dataclasses.dataclass
class Ev:
    msg_uuid: str
    channel: str
    args: bytes
    offset: int
    epoch: str


def test_a_sub_with_history_answers_its_position_then_the_events_missed() -> None:
    s, _ = make()
    sub = message(rustext.build_sub(uid(), "h", since=(1, "e1")))
    missed = [Ev(uid(), "h", b'{"n":2}', 2, "e1"), Ev(uid(), "h", b'{"n":3}', 3, "e1")]
    frames = s.subscribed(sub, Joined(offset=3, epoch="e1", recovered=True, events=missed))
    assert [f[0] for f in frames] == [ACK, EVNT, EVNT]
    assert b'"recovered":true' in frames[0][2] and b'"offset":3' in frames[0][2]
    assert [rustext.parse_server_message(f[2]).args for f in frames[1:]] == [b'{"n":2}', b'{"n":3}']
    assert s.stats.recoveries == {"recovered": 1} and s.stats.events == 2
    plain = s.subscribed(message(rustext.build_sub(uid(), "plain")), None)
    assert [f[0] for f in plain] == [ACK]


def test_outgoing_size_and_close_reasons() -> None:
    s, _ = make(write_limit=10)
    assert s.frame_fits(b"x" * 10)
    assert not s.frame_fits(b"x" * 11) and s.close_reason == "too_big"
    s.closing(1001)  # the first reason stays
    assert s.close_reason == "too_big"
    t, _ = make()
    t.closing(1001)
    assert t.close_reason == "shutdown"
    u, _ = make()
    u.closing(4000)
    assert u.close_reason == "close_4000"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200) | st.sampled_from([call(), b"{}", b'{"meta":{}}']), max_size=8))
def test_any_frames_give_items_or_an_end_never_an_exception(frames: list[bytes]) -> None:
    s, _ = make(rate_limit=5.0, rate_burst=2)
    ended = False
    for i, f in enumerate(frames):
        end = s.receive_text(f, i * 0.1)
        if end is not None:
            ended = True
            break
    items = drain(s)
    assert all(isinstance(i, (Work, Refused, CloseAfter)) for i in items)
    assert sum(isinstance(i, CloseAfter) for i in items) <= 1
    if items and isinstance(items[-1], CloseAfter):
        assert not ended


def test_admission_of_calls_beyond_what_the_server_lets_wait() -> None:
    s, rejected = make(max_waiting_calls=3)
    c = message(call(5_000_000_000))
    assert s.admit(c, draining=False, inflight=0, waiting=2) == 5000
    assert s.admit(c, draining=False, inflight=0, waiting=3) == (503, "server overloaded: 3 calls waiting for their results")
    pub = message(rustext.build_pub(uid(), "news"))
    assert s.admit(pub, draining=False, inflight=0, waiting=3) is None  # calls only
    assert rejected == ["overloaded"]
