"""Hostile HTTP/1 requests for the balancer's validation battery, a strict
origin to put behind a proxy, and a runner that records what happened.

Each case is raw bytes sent on a fresh connection. ``expect`` says what a
careful proxy does with it:

- ``refuse``: answer 4xx/5xx (or close) and forward nothing;
- ``forward``: a valid request, forwarded and answered 200;
- ``either``: valid but unusual; forwarding or refusing are both correct,
  as long as what reaches the origin is well-formed.

The origin parses with h11 (strict RFC 9112): every request it receives is
recorded with whether h11 accepted it, so a proxy that forwards something
malformed is caught, not only one that answers wrongly.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field

import h11


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes
    expect: str  # "refuse" | "forward" | "either"


def _req(*lines: str, body: bytes = b"") -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


H = "Host: origin.test"
CASES: list[Case] = [
    # valid requests: forwarded
    Case("GET", _req("GET /ok HTTP/1.1", H), "forward"),
    Case("POST with Content-Length", _req("POST /ok HTTP/1.1", H, "Content-Length: 5", body=b"hello"), "forward"),
    Case("POST chunked", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked", body=b"5\r\nhello\r\n0\r\n\r\n"),
         "forward"),
    Case("HTTP/1.0 without Host", _req("GET /ok HTTP/1.0"), "forward"),
    Case("empty Host (no authority)", _req("GET /ok HTTP/1.1", "Host:"), "either"),
    Case("absolute-form target", _req("GET http://origin.test/ok HTTP/1.1", H), "either"),
    Case("Expect: 100-continue", _req("POST /ok HTTP/1.1", H, "Content-Length: 2", "Expect: 100-continue", body=b"hi"),
         "forward"),
    Case("chunk extension", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                 body=b"5;name=value\r\nhello\r\n0\r\n\r\n"), "either"),
    Case("trailer fields", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                body=b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"), "either"),
    Case("leading empty line", b"\r\n" + _req("GET /ok HTTP/1.1", H), "either"),
    Case("HTTP/1.2 (a later minor version)", _req("GET /ok HTTP/1.2", H), "either"),
    Case("duplicate Content-Length, same value", _req("POST /ok HTTP/1.1", H, "Content-Length: 5", "Content-Length: 5",
                                                      body=b"hello"), "either"),
    # a Connection header naming end-to-end fields (RFC 9110 §7.6.1 forbids it): a proxy that obeyed
    # would forward the body as a second request, or a request without Host
    Case("Connection naming Content-Length", _req("POST /ok HTTP/1.1", H, "Content-Length: 5",
                                                  "Connection: Content-Length", body=b"hello"), "either"),
    Case("Connection naming Host", _req("GET /ok HTTP/1.1", H, "Connection: host"), "either"),
    # Host rules (RFC 9112 §3.2)
    Case("two Host lines, same value", _req("GET /ok HTTP/1.1", H, H), "refuse"),
    Case("two Host lines, different values", _req("GET /ok HTTP/1.1", H, "Host: evil.test"), "refuse"),
    Case("HTTP/1.1 without Host", _req("GET /ok HTTP/1.1"), "refuse"),
    Case("Host with a space", _req("GET /ok HTTP/1.1", "Host: origin test"), "refuse"),
    Case("Host with userinfo", _req("GET /ok HTTP/1.1", "Host: user@origin.test"), "refuse"),
    Case("Host with a bad port", _req("GET /ok HTTP/1.1", "Host: origin.test:8x"), "refuse"),
    # message framing (RFC 9112 §6)
    Case("Content-Length and Transfer-Encoding", _req("POST /ok HTTP/1.1", H, "Content-Length: 5",
                                                      "Transfer-Encoding: chunked", body=b"0\r\n\r\n"), "refuse"),
    Case("Transfer-Encoding and Content-Length", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                                      "Content-Length: 5", body=b"0\r\n\r\n"), "refuse"),
    Case("two Content-Length, different values", _req("POST /ok HTTP/1.1", H, "Content-Length: 5", "Content-Length: 6",
                                                      body=b"hello!"), "refuse"),
    Case("Content-Length list", _req("POST /ok HTTP/1.1", H, "Content-Length: 5, 6", body=b"hello!"), "refuse"),
    Case("Content-Length negative", _req("POST /ok HTTP/1.1", H, "Content-Length: -1"), "refuse"),
    Case("Content-Length with a plus sign", _req("POST /ok HTTP/1.1", H, "Content-Length: +5", body=b"hello"), "refuse"),
    Case("Content-Length in hex", _req("POST /ok HTTP/1.1", H, "Content-Length: 0x5", body=b"hello"), "refuse"),
    Case("Content-Length with inner space", _req("POST /ok HTTP/1.1", H, "Content-Length: 1 0", body=b"0123456789"),
         "refuse"),
    Case("Content-Length overflow", _req("POST /ok HTTP/1.1", H, "Content-Length: 99999999999999999999999"), "refuse"),
    Case("Transfer-Encoding: chunked, gzip", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked, gzip",
                                                  body=b"0\r\n\r\n"), "refuse"),
    Case("Transfer-Encoding: xchunked", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: xchunked",
                                             body=b"0\r\n\r\n"), "refuse"),
    Case("Transfer-Encoding: identity", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: identity", body=b"hello"),
         "refuse"),
    Case("two Transfer-Encoding lines", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                             "Transfer-Encoding: chunked", body=b"0\r\n\r\n"), "refuse"),
    Case("Transfer-Encoding in HTTP/1.0", _req("POST /ok HTTP/1.0", "Transfer-Encoding: chunked",
                                               body=b"5\r\nhello\r\n0\r\n\r\n"), "refuse"),
    Case("Transfer-Encoding folded", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding:", " chunked",
                                          body=b"0\r\n\r\n"), "refuse"),
    Case("Transfer-Encoding with a tab before colon", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding\t: chunked",
                                                           body=b"0\r\n\r\n"), "refuse"),
    Case("chunk size not hex", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked", body=b"zz\r\nhello\r\n0\r\n\r\n"),
         "refuse"),
    Case("chunk size overflow", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                     body=b"ffffffffffffffffffff\r\nhello\r\n0\r\n\r\n"), "refuse"),
    Case("chunk without its CRLF", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                        body=b"5\r\nhelloXX0\r\n\r\n"), "refuse"),
    Case("chunk size with a space", _req("POST /ok HTTP/1.1", H, "Transfer-Encoding: chunked",
                                         body=b"5 \r\nhello\r\n0\r\n\r\n"), "either"),
    # field syntax (RFC 9110 §5, RFC 9112 §5)
    Case("obs-fold", _req("GET /ok HTTP/1.1", H, "X-A: a", " b"), "refuse"),
    Case("space before colon", _req("GET /ok HTTP/1.1", H, "X-A : b"), "refuse"),
    Case("empty field name", _req("GET /ok HTTP/1.1", H, ": b"), "refuse"),
    Case("bad byte in field name", _req("GET /ok HTTP/1.1", H, "X(A): b"), "refuse"),
    Case("NUL in field value", _req("GET /ok HTTP/1.1", H, "X-A: a\x00b"), "refuse"),
    Case("bare CR in field value", _req("GET /ok HTTP/1.1", H, "X-A: a\rb"), "refuse"),
    Case("DEL in field value", _req("GET /ok HTTP/1.1", H, "X-A: a\x7fb"), "refuse"),
    Case("bare LF line ends", b"GET /ok HTTP/1.1\nHost: origin.test\n\n", "either"),
    Case("CR without LF after a field", b"GET /ok HTTP/1.1\r\nHost: origin.test\rX-A: b\r\n\r\n", "refuse"),
    Case("field line without colon", _req("GET /ok HTTP/1.1", H, "X-A b"), "refuse"),
    # request line (RFC 9112 §3)
    Case("two spaces in the request line", _req("GET  /ok HTTP/1.1", H), "refuse"),
    Case("lowercase version", _req("GET /ok http/1.1", H), "refuse"),
    Case("HTTP/2.0 on HTTP/1", _req("GET /ok HTTP/2.0", H), "refuse"),
    Case("HTTP/1.1 with trailing garbage", _req("GET /ok HTTP/1.1x", H), "refuse"),
    Case("bad byte in method", _req("G@T /ok HTTP/1.1", H), "refuse"),
    Case("space in target", _req("GET /o k HTTP/1.1", H), "refuse"),
    Case("control byte in target", _req("GET /o\x01k HTTP/1.1", H), "refuse"),
    Case("fragment in target", _req("GET /ok#frag HTTP/1.1", H), "refuse"),
    Case("a TLS ClientHello", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(32), "refuse"),
    Case("oversized head", _req("GET /ok HTTP/1.1", H, "X-Big: " + "a" * 70_000), "refuse"),
]


@dataclass
class Received:
    ok: bool  # h11 parsed a complete, valid request
    what: str  # the request line and headers as the origin saw them, or h11's complaint
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class StrictOrigin:
    """An HTTP/1.1 origin that parses with h11 and records every request."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        current: Received | None = None
        try:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    self.received.append(Received(False, f"h11 refused: {exc}"))
                    writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    await writer.drain()
                    return
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    if not data and current is not None:
                        current.ok = False
                        current.what += " (body cut short)"
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    current = Received(False, f"{event.method.decode()} {event.target.decode()}",
                                       [(k, v) for k, v in event.headers])
                    self.received.append(current)
                elif isinstance(event, h11.EndOfMessage) and current is not None:
                    current.ok = True
                    body = b"ok"
                    writer.write(conn.send(h11.Response(status_code=200, headers=[("content-length", str(len(body)))]))
                                 + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
                    await writer.drain()
                    conn.start_next_cycle()
                    current = None
                elif isinstance(event, h11.ConnectionClosed):
                    return
        except (ConnectionError, h11.LocalProtocolError):
            return
        finally:
            writer.close()


@dataclass
class Outcome:
    """What the client got (a status code, or "closed") and what reached the origin."""

    status: str
    forwarded: list[Received]

    @property
    def refused(self) -> bool:
        return not self.forwarded and (self.status == "closed" or self.status[:1] in ("4", "5"))

    @property
    def forwarded_ok(self) -> bool:
        return len(self.forwarded) == 1 and self.forwarded[0].ok and self.status == "200"

    @property
    def forwarded_malformed(self) -> bool:
        return any(not r.ok for r in self.forwarded)

    def describe(self) -> str:
        if not self.forwarded:
            return "refused" + ("" if self.status == "closed" else f" ({self.status})") if self.refused else f"{self.status}, nothing forwarded"
        return f"forwarded ({self.status})" if self.forwarded_ok else f"forwarded malformed ({self.status})"


def send(port: int, raw: bytes, timeout: float = 3.0) -> str:
    """Send ``raw`` on a fresh connection; the status code of the first
    response, or "closed" if the connection closed (or stayed silent)
    without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        data = b""
        try:
            while True:
                # the status line of the final response: skip interim 1xx ones (100 Continue)
                while data.startswith(b"HTTP/1.") and data[9:10] == b"1" and b"\r\n\r\n" in data:
                    data = data.split(b"\r\n\r\n", 1)[1]
                if b"\r\n" in data and not (data.startswith(b"HTTP/1.") and data[9:10] == b"1"):
                    break
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (TimeoutError, OSError):
            pass
    if data.startswith(b"HTTP/1.") and len(data) >= 12:
        return data[9:12].decode("latin-1")
    return "closed"


async def run_case(port: int, origin: StrictOrigin, case: Case) -> Outcome:
    """Send the case to a proxy on ``port`` in front of ``origin``.

    A request the proxy forwards and answers is recorded before its answer
    exists (the origin records the head first); the short window after the
    answer is only for what a faulty proxy might still forward after it has
    answered (a body it streams after refusing), which no event announces."""
    before = len(origin.received)
    status = await asyncio.to_thread(send, port, case.raw)
    await asyncio.sleep(0.05)
    return Outcome(status, origin.received[before:])
