"""The wire of the HTTP fallback transport, sans-I/O: requests in, SSE bytes out.

Corporate proxies often refuse websockets; the fallback carries the same
juggler.0 messages over plain HTTP on the websocket port
(:mod:`juggler.fallback` is the driver, ``docs/protocols/juggler.md`` the
wire):

- ``GET <path>/sse`` answers ``text/event-stream``: one server message per
  event (``id: N`` / ``data: <the JSON frame>``);
- ``POST <path>/send?session=ID`` carries client messages, one per line.

Here: :func:`sniff` (does a connection's first request line target the
fallback?), :class:`RequestReader` (one HTTP/1.x request: head, then a
``Content-Length`` body, bounded; anything else is a :class:`BadRequest`
with its status), and the encoders of events and response heads. No
socket, task or clock: tested by feeding bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request

__all__ = [
    "MAX_HEAD",
    "SESSION_ID",
    "BadRequest",
    "HttpRequest",
    "RequestReader",
    "comment",
    "event",
    "named_event",
    "response_head",
    "sniff",
]

#: bytes of a request head (request line and headers) at most: more is 431
MAX_HEAD = 16 * 1024
#: what a session id looks like (``secrets.token_urlsafe(24)``: 32 characters)
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{32}$")

_METHOD = re.compile(rb"^[A-Z]{1,16}$")
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TARGET = re.compile(rb"^/[\x21-\x7e]*$")
_VERSION = re.compile(rb"^HTTP/1\.[01]$")
_REASONS = {
    200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 410: "Gone", 411: "Length Required",
    413: "Content Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
    501: "Not Implemented", 503: "Service Unavailable",
}


def sniff(data: bytes, path: str) -> bool | None:
    """Whether the request starting with `data` is for the fallback endpoints
    under `path` (``<path>/sse``, ``<path>/send``); None while its request
    line is not complete yet. Everything else is left to the websocket
    handshake (which answers plain HTTP too)."""
    end = data.find(b"\n")
    if end < 0:
        return None if len(data) < MAX_HEAD else False
    parts = data[:end].split(b" ")
    if len(parts) < 2:
        return False
    target = parts[1].split(b"?", 1)[0]
    prefix = path.rstrip("/").encode()  # path "/": "/sse" and "/send"
    return target == prefix + b"/sse" or target == prefix + b"/send"


class BadRequest(Exception):
    """A request the fallback cannot take: ``status`` and a one-line reason."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request: the websockets ``Request`` (path and headers, what
    :class:`juggler.auth.Auth` reads), its method and body."""

    method: str
    request: Request
    body: bytes

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.request.path.split("?", 1)[0]

    def query(self, name: str) -> str | None:
        """The last value of query parameter `name`, or None."""
        query = urlsplit(self.request.path).query
        if not query:
            return None
        values = parse_qs(query, keep_blank_values=True).get(name)
        return values[-1] if values else None

    @property
    def headers(self) -> Headers:
        return self.request.headers


class RequestReader:
    """One HTTP/1.x request from the bytes of a connection (see module doc).

    :meth:`feed` returns the :class:`HttpRequest` once its head and body are
    in, None until then; it raises :class:`BadRequest` for a malformed head
    (400), a head over :data:`MAX_HEAD` (431), a body over ``max_body``
    (413), a ``Transfer-Encoding`` (501: fetch and every browser send a
    ``Content-Length``) or a POST without a length (411). Bytes after the
    request are ignored: one request per connection.
    """

    __slots__ = ("_buf", "_head", "done", "max_body")

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self._buf = bytearray()
        self._head: tuple[str, Request, int] | None = None
        #: the request was returned (or refused): nothing more is read
        self.done = False

    def feed(self, data: bytes) -> HttpRequest | None:
        if self.done:
            return None
        buf = self._buf
        buf += data
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self.done = True
                    raise BadRequest(431, "request head too large")
                return None
            if end + 4 > MAX_HEAD:
                self.done = True
                raise BadRequest(431, "request head too large")
            try:
                self._head = _parse_head(bytes(buf[:end]), self.max_body)
            except BadRequest:
                self.done = True
                raise
            del buf[:end + 4]
        method, request, length = self._head
        if len(buf) < length:
            return None
        self.done = True
        body = bytes(buf[:length])
        self._buf = bytearray()
        return HttpRequest(method, request, body)


def _parse_head(head: bytes, max_body: int) -> tuple[str, Request, int]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _METHOD.match(parts[0]) or not _TARGET.match(parts[1]) or not _VERSION.match(parts[2]):
        raise BadRequest(400, "malformed request line")
    headers = Headers()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest(400, "malformed header line")
        value = value.strip(b" \t")
        if any(c < 0x20 and c != 0x09 or c == 0x7F for c in value):
            raise BadRequest(400, "control character in a header value")
        headers[name.decode("ascii")] = value.decode("latin-1")
    method = parts[0].decode("ascii")
    if "Transfer-Encoding" in headers:
        raise BadRequest(501, "Transfer-Encoding is not supported: send a Content-Length")
    lengths = headers.get_all("Content-Length")
    length = 0
    if len(lengths) > 1:
        raise BadRequest(400, "several Content-Length headers")
    if lengths:
        text = lengths[0]
        if not text.isascii() or not text.isdigit() or len(text) > 18:
            raise BadRequest(400, "invalid Content-Length")
        length = int(text)
    elif method == "POST":
        raise BadRequest(411, "a POST needs a Content-Length")
    if length > max_body:
        raise BadRequest(413, f"body over {max_body} bytes")
    return method, Request(parts[1].decode("ascii"), headers), length


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """The status line and headers of a response (the caller adds the body)."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def event(event_id: int, frame: bytes) -> bytes:
    """One juggler.0 server message as an SSE event. A frame's JSON may hold
    line breaks (raw client args): each line becomes a ``data:`` field, and
    the client joins them with ``\\n`` again (JSON whitespace either way)."""
    if b"\n" in frame or b"\r" in frame:
        frame = b"\ndata: ".join(frame.splitlines())
    return b"id: %d\ndata: %s\n\n" % (event_id, frame)


def named_event(name: str, data: bytes) -> bytes:
    """An SSE event of the fallback itself (``session``, ``close``): not a juggler.0 message."""
    return b"event: %s\ndata: %s\n\n" % (name.encode("ascii"), data)


def comment(text: bytes = b"") -> bytes:
    """An SSE comment line: keeps proxies from timing an idle stream out; clients ignore it."""
    return b":" + text + b"\n\n"
