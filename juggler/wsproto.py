"""The websocket side of one juggler server connection, sans-I/O.

Bytes in, events and bytes out, as python-websockets' ``Protocol``
(``receive_data`` / ``data_to_send``); no socket, task or clock, so it is
tested by feeding bytes. :class:`juggler.conn.Conn` is the asyncio driver.

- The opening handshake goes through websockets' sans-I/O
  ``ServerProtocol`` (HTTP parsing, validation, the 101 response). A HEAD
  request is handed to it as a GET and flagged (:attr:`head`): plain HTTP on
  the websocket port answers it without a body. Bytes a client sent after
  its request head, without waiting for the 101, are kept and read as frames
  once the handshake is accepted.
- After it, client frames are parsed by ``rustext.WsFrameReader``
  (buffering, ``read_limit``, unmasking, reassembly, protocol checks), and
  server frames are built by ``rustext.ws_text_frames``: the text frames of
  one event-loop turn become one buffer, so one ``write``.
- permessage-deflate (RFC 7692), when the server offers it (``deflate``)
  and the client asks: :mod:`juggler.deflate` picks the agreement, the
  reader inflates RSV1 messages, and text frames are built by the server's
  shared ``rustext.WsDeflate`` (compressed above its threshold).

States (:class:`State`)::

    CONNECTING --accept()--> OPEN --send_close()--> CLOSING
         |                    |                       |
         +--reject()----------+--receive_close()------+--> CLOSED
                              +--fail() / send_eof()--+

CLOSED means nothing more is written: :meth:`data_to_send` ends with
``b""``, the driver's cue to close the transport (the server side closes TCP
first, RFC 6455 §7.1.1). :attr:`reading` is orthogonal: it turns False when
the driver stops reading (bad input), after which bytes received are dropped.

Events from :meth:`receive_data`: while CONNECTING, a
``websockets.http11.Request`` (answer it with :meth:`accept` or
:meth:`reject`); then, in order, ``bytes`` (one whole text message) or the
reader's tuples ``(WS_PING, payload)``, ``(WS_CLOSE, payload)``,
``(WS_BINARY, b"")``, ``(WS_FAIL, code, reason)``; a pong gives none (the
driver counts any bytes received as a sign of life, :mod:`juggler.keepalive`,
and pings with :meth:`send_ping`). The driver handles them
in order and hands the control ones back (:meth:`receive_ping`,
:meth:`receive_close`, :meth:`fail`): what it decides about one message
(closing, say) then applies to the frames after it, byte for byte as before.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import rustext
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from juggler.deflate import Agreement, Deflate

__all__ = ["State", "WsServerProtocol"]

_ws_text_frames = rustext.ws_text_frames
_ws_control_frame = rustext.ws_control_frame
_ws_close_frame = rustext.ws_close_frame
_WS_CLOSE, _WS_PING, _WS_PONG = rustext.WS_CLOSE, rustext.WS_PING, 10


class State(enum.IntEnum):
    """Where a connection is in the websocket lifecycle (RFC 6455 §4, §7)."""

    CONNECTING = 0  # the opening handshake: the HTTP request head is being read
    OPEN = 1  # handshake accepted: messages flow both ways
    CLOSING = 2  # our close frame is out: control frames are still read, no data frame written
    CLOSED = 3  # nothing more is written; the transport is to be closed


CONNECTING, OPEN, CLOSING, CLOSED = State.CONNECTING, State.OPEN, State.CLOSING, State.CLOSED


class WsServerProtocol:
    """Sans-I/O websocket server connection for one juggler.0 client (see module doc).

    ``subprotocol`` is the one subprotocol this server speaks; a client that
    offers others but not it, or offers none while ``allow_empty_subprotocol``
    is false, is upgraded and then dropped at once, as the upstream server
    does. ``read_limit`` bounds one message (0 = none), inflated if compressed.
    ``deflate``: the server's compression (None: permessage-deflate is never agreed).
    """

    __slots__ = (
        "_deflate", "_early", "_eof", "_frames", "_head_tail", "_hs", "_out", "_reader", "_sniff", "_texts",
        "allow_empty_subprotocol", "compression", "head", "offered", "reading", "request", "state", "subprotocol",
    )

    def __init__(
        self,
        *,
        subprotocol: str,
        read_limit: int = 0,
        allow_empty_subprotocol: bool = True,
        logger: logging.Logger | None = None,
        deflate: Deflate | None = None,
    ) -> None:
        self.state = CONNECTING
        #: the handshake request, once read
        self.request: Request | None = None
        #: the request is a HEAD (answered as a GET, without the body)
        self.head = False
        #: False once the driver stops reading (bad input): later bytes are dropped
        self.reading = True
        #: the subprotocols the client offered
        self.offered: list[str] = []
        self.subprotocol = subprotocol
        self.allow_empty_subprotocol = allow_empty_subprotocol
        self._hs = ServerProtocol(
            # a plain function: websockets binds it to the protocol object
            select_subprotocol=lambda _proto, offered: self._select(offered),
            max_size=read_limit or None,
            logger=logger,
        )
        self._reader = rustext.WsFrameReader(read_limit)
        self._sniff: bytearray | None = bytearray()  # start of the request, until its method is known
        self._head_tail = b""  # last bytes of the request head seen, to find its end across reads
        self._early = b""  # frames sent before the 101, read once the handshake is accepted
        self._texts: list[bytes] = []  # text payloads not yet encoded
        self._out: list[bytes] = []  # encoded bytes to send, in order
        self._eof = False
        self._deflate = deflate
        #: the permessage-deflate agreement, once accepted (None: no compression)
        self.compression: Agreement | None = None
        self._frames = _ws_text_frames  # builds the text frames (compressed ones once agreed)

    def __repr__(self) -> str:
        return f"<WsServerProtocol {self.state.name}>"

    # receiving -------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Any]:
        """Bytes received; returns the events they complete, in order (see module doc)."""
        state = self.state
        if state is OPEN or state is CLOSING:
            if not self.reading:
                return []
            if self._early:
                data = self._early + data
                self._early = b""
            return self._reader.feed(data)
        if state is CONNECTING and self.reading:
            return self._handshake_data(data)
        return []

    def receive_eof(self) -> None:
        """The client closed its side of the stream."""
        if self.state is CONNECTING:
            self._hs.receive_eof()
            self._hs.events_received()
            self._pull_handshake()

    def stop_reading(self) -> None:
        """Drop every byte received from now on (bad input: the connection is finished)."""
        self.reading = False

    def receive_ping(self, payload: bytes) -> None:
        """A ping came: answer with a pong while OPEN."""
        if self.state is OPEN:
            self._control(_ws_control_frame(_WS_PONG, payload))

    def receive_close(self, payload: bytes) -> None:
        """The client's close frame came: echo its code (unless ours is out), then CLOSED."""
        if self.state is OPEN:
            self._control(_ws_control_frame(_WS_CLOSE, payload[:2]))
        self.send_eof()

    def fail(self, code: int, reason: str) -> None:
        """Fail the connection (RFC 6455 §7.1.7): a close frame while OPEN, then CLOSED."""
        if self.state is OPEN:
            self._control(_ws_close_frame(code, reason))
        self.send_eof()

    # the handshake ---------------------------------------------------------------

    def _select(self, offered: Any) -> str | None:
        self.offered = list(offered)
        return self.subprotocol if self.subprotocol in self.offered else None

    def _handshake_data(self, data: bytes) -> list[Any]:
        if self.request is not None:  # read, not yet answered: the rest are frames
            self._early += data
            return []
        if self._sniff is not None:
            data = self._sniff_method(data)
            if not data:
                return []
        # websockets sees the request head only: bytes after it (frames a client
        # sent without waiting for the 101) are ours, even when a frame is split
        # between this read and the next.
        hs = self._hs
        seen = self._head_tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            self._head_tail = seen[-3:]
            hs.receive_data(data)
        else:
            cut = end + 4 - len(self._head_tail)
            hs.receive_data(data[:cut])
            self._early = data[cut:]
        events = [ev for ev in hs.events_received() if ev.__class__ is Request]
        self._pull_handshake()
        if events:
            self.request = events[0]
        return events

    def _sniff_method(self, data: bytes) -> bytes:
        """A HEAD is handed to websockets as a GET (older versions parse GET
        only) and answered without its body."""
        buf = self._sniff
        assert buf is not None
        buf += data
        if len(buf) < 5 and b"HEAD ".startswith(bytes(buf)):
            return b""
        self._sniff = None
        if buf.startswith(b"HEAD "):
            self.head = True
            return b"GET " + bytes(buf[5:])
        return bytes(buf)

    def reject(self, status: int, text: str) -> Response:
        """A plain-text error response (send it with :meth:`send_response`)."""
        return self._hs.reject(status, text)

    def send_response(self, response: Response) -> None:
        """Answer the request with a response other than the upgrade; then CLOSED."""
        self._hs.send_response(response)
        self._pull_handshake()
        self.send_eof()

    def accept(self, request: Request) -> bool:
        """Answer the request with the 101 upgrade; True when the connection is
        OPEN, False when it was refused or juggler.0 was not negotiated (CLOSED)."""
        hs = self._hs
        response = hs.accept(request)
        deflate = self._deflate
        if deflate is not None and response.status_code == 101:
            agreement = deflate.negotiate(request.headers.get_all("Sec-WebSocket-Extensions"))
            if agreement is not None:
                response.headers["Sec-WebSocket-Extensions"] = agreement.header()
                self._reader.enable_deflate(agreement.client_context_takeover)
                self._frames = deflate.frames.text_frames
                self.compression = agreement
        hs.send_response(response)
        self._pull_handshake()
        if response.status_code != 101:
            self.send_eof()
            return False
        if hs.subprotocol is None and (self.offered or not self.allow_empty_subprotocol):
            # upstream upgrades, then drops the connection at once (no close frame)
            self.send_eof()
            return False
        self.state = OPEN
        return True

    @property
    def negotiated(self) -> str | None:
        """The subprotocol agreed on in the handshake."""
        return self._hs.subprotocol

    def _pull_handshake(self) -> None:
        for d in self._hs.data_to_send():
            if d:
                self._out.append(d)
            else:
                self.send_eof()

    # sending ---------------------------------------------------------------------

    def send_text(self, payload: bytes) -> bool:
        """Queue one text message; False (nothing queued) unless OPEN."""
        if self.state is not OPEN:
            return False
        self._texts.append(payload)
        return True

    def send_ping(self, payload: bytes = b"") -> bool:
        """Queue a ping (the keepalive; the peer's pong, like anything it
        sends, is its sign of life); False (nothing queued) unless OPEN."""
        if self.state is not OPEN:
            return False
        self._control(_ws_control_frame(_WS_PING, payload))
        return True

    def send_close(self, code: int, reason: str = "") -> bool:
        """Start the closing handshake: our close frame, then CLOSING. False
        (nothing sent) unless OPEN."""
        if self.state is not OPEN:
            return False
        self._control(_ws_close_frame(code, reason))
        self.state = CLOSING
        return True

    def send_eof(self) -> None:
        """Nothing more is written: CLOSED, and the transport is to be closed. Idempotent."""
        self.state = CLOSED
        if not self._eof:
            self._eof = True
            self._encode_texts()
            self._out.append(b"")

    def _control(self, frame: bytes) -> None:
        self._encode_texts()
        self._out.append(frame)

    def _encode_texts(self) -> None:
        if self._texts:
            self._out.append(self._frames(self._texts))
            self._texts = []

    def data_to_send(self) -> list[bytes]:
        """The bytes to write, in order; a final ``b""`` means: then close the transport."""
        texts = self._texts
        if texts:
            self._texts = []
            if not self._out:
                return [self._frames(texts)]
            self._out.append(self._frames(texts))
        out = self._out
        self._out = []
        return out

    def discard_output(self) -> None:
        """Drop what is queued (the transport is gone)."""
        self._texts = []
        self._out = []
