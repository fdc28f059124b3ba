"""The fallback's wire, sans-I/O (juggler/sse.py): the request reader fed
hostile bytes (a battery and hypothesis), sniffing, and the SSE encoders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from juggler.sse import (
    MAX_HEAD,
    BadRequest,
    RequestReader,
    comment,
    event,
    named_event,
    sniff,
)

POST = b"POST /ws/send?session=abc HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"


def test_reads_a_post_whole_or_byte_by_byte() -> None:
    req = RequestReader(100).feed(POST)
    assert req is not None and req.method == "POST" and req.body == b"hello"
    assert req.path == "/ws/send" and req.query("session") == "abc" and req.headers["Host"] == "x"
    r = RequestReader(100)
    got = [r.feed(POST[i:i + 1]) for i in range(len(POST))]
    assert all(g is None for g in got[:-1]) and got[-1] is not None and got[-1].body == b"hello"
    assert r.feed(b"more") is None  # one request per connection


def test_a_get_has_no_body() -> None:
    req = RequestReader(10).feed(b"GET /ws/sse HTTP/1.1\r\nHost: x\r\n\r\n")
    assert req is not None and req.method == "GET" and req.body == b"" and req.query("session") is None


@pytest.mark.parametrize(("raw", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1 extra\r\n\r\n", 400),
    (b"post /ws/send HTTP/1.1\r\n\r\n", 400),
    (b"POST ws/send HTTP/1.1\r\n\r\n", 400),
    (b"POST /ws/send HTTP/2.0\r\n\r\n", 400),
    (b"POST /ws/s\x00nd HTTP/1.1\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nno colon\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nX: a\x01b\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nContent-Length: \xd9\xa1\r\n\r\n", 400),
    (b"POST /ws/send HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    (b"POST /ws/send HTTP/1.1\r\nHost: x\r\n\r\n", 411),
    (b"POST /ws/send HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413),
    (b"GET /ws/sse HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n", 431),
])
def test_hostile_requests_get_their_status(raw: bytes, status: int) -> None:
    r = RequestReader(100)
    with pytest.raises(BadRequest) as info:
        r.feed(raw)
    assert info.value.status == status
    assert r.done and r.feed(b"x") is None


def test_a_head_that_never_ends_is_refused_once_over_the_limit() -> None:
    r = RequestReader(100)
    assert r.feed(b"GET /ws/sse HTTP/1.1\r\n") is None
    with pytest.raises(BadRequest) as info:
        for _ in range(MAX_HEAD):
            r.feed(b"X-A: b\r\n")
    assert info.value.status == 431


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(min_value=1, max_value=50))
def test_any_bytes_give_a_request_none_or_bad_request(data: bytes, step: int) -> None:
    """Whatever arrives, in whatever pieces: a request, nothing yet, or BadRequest."""
    whole = RequestReader(64)
    try:
        expected = whole.feed(data)
    except BadRequest as exc:
        expected = exc.status  # type: ignore[assignment]
    pieces = RequestReader(64)
    got: object = None
    try:
        for i in range(0, len(data), step):
            got = pieces.feed(data[i:i + step]) or got
    except BadRequest as exc:
        got = exc.status
    if isinstance(expected, int):
        assert got == expected
    elif expected is None:
        assert got is None
    else:
        assert got is not None and not isinstance(got, int)
        assert (got.method, got.request.path, got.body) == (expected.method, expected.request.path, expected.body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=200))
def test_any_head_with_a_prefix_of_valid_lines(name: bytes, value: bytes) -> None:
    raw = b"POST /ws/send HTTP/1.1\r\n" + name + b": " + value + b"\r\nContent-Length: 0\r\n\r\n"
    try:
        RequestReader(10).feed(raw)
    except BadRequest as exc:
        assert exc.status in (400, 411, 413, 431, 501)


def test_sniff() -> None:
    assert sniff(b"GET /ws/sse HTTP/1.1\r\n", "/ws") is True
    assert sniff(b"GET /ws/sse?session=x HTTP/1.1\r\n", "/ws") is True
    assert sniff(b"POST /ws/send?session=x HTTP/1.1\r\n", "/ws") is True
    assert sniff(b"OPTIONS /ws/send HTTP/1.1\r\n", "/ws") is True
    assert sniff(b"GET /ws HTTP/1.1\r\n", "/ws") is False
    assert sniff(b"GET /ws/ssex HTTP/1.1\r\n", "/ws") is False
    assert sniff(b"GET /other/sse HTTP/1.1\r\n", "/ws") is False
    assert sniff(b"GARBAGE\n", "/ws") is False
    assert sniff(b"GET /ws/s", "/ws") is None
    assert sniff(b"A" * MAX_HEAD, "/ws") is False
    assert sniff(b"GET /sse HTTP/1.1\r\n", "/") is True  # websocket path "/": no "//sse"
    assert sniff(b"GET /ws/sse HTTP/1.1\r\n", "/ws/") is True


def test_events() -> None:
    assert event(7, b'{"a":1}') == b'id: 7\ndata: {"a":1}\n\n'
    # raw client JSON may span lines: each becomes a data field (no event is cut short)
    assert event(1, b'{"a":\r\n1,\r"b":\n2}') == b'id: 1\ndata: {"a":\ndata: 1,\ndata: "b":\ndata: 2}\n\n'
    assert named_event("close", b"{}") == b"event: close\ndata: {}\n\n"


def _parse_sse(stream: bytes) -> list[tuple[str | None, str]]:
    """The events of an SSE stream as the HTML spec reads them: (id, data)."""
    out: list[tuple[str | None, str]] = []
    eid, data = None, []
    for line in stream.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if data:
                out.append((eid, "\n".join(data)))
            eid, data = None, []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "id":
            eid = value
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1), min_size=1, max_size=5))
def test_events_read_back_as_the_frames_sent(frames: list[str]) -> None:
    """Whatever the frame holds (line breaks of any kind in raw args), a reader
    gets it back whole, one event per frame, line breaks as ``\\n``."""
    raw = [f.encode() for f in frames]
    stream = b"".join(event(i + 1, f) for i, f in enumerate(raw)) + comment()
    assert _parse_sse(stream) == [(str(i + 1), b"\n".join(f.splitlines()).decode()) for i, f in enumerate(raw)]
