"""permessage-deflate (RFC 7692): what the server agrees to, and why.

The handshake side is pure (:func:`negotiate`: header values in, the
agreement or None out); the frames are compressed and inflated in Rust
(``rustext.WsDeflate``, ``rustext.WsFrameReader.enable_deflate``).

What the server agrees to:

- ``server_no_context_takeover``, always: each server message is compressed
  on its own, so an event's compressed frame is built once and written to
  every subscriber that negotiated deflate (the native fan-out shares it),
  and a connection holds no compressor (a deflate compressor is a few
  hundred KiB; one per connection would dwarf everything else it holds).
- ``client_no_context_takeover``, unless ``compression_client_context_takeover``
  is set: then the client's 32 KiB inflate window is held only while one of
  its compressed messages is being read, not for the connection's life.
  (The inflater always has a 32 KiB window, the RFC's largest, so any
  ``client_max_window_bits`` a client offers fits; it is never narrowed.)
- ``server_max_window_bits`` is accepted at 15 only (the compressor's
  window is 32 KiB); an offer asking for a smaller one is declined and the
  next offer tried.

An offer that breaks RFC 7692 §7 (an unknown or repeated parameter, a value
where none belongs, a window size outside 8..15 or written with a leading
zero) is declined, as is a header that is not valid extension syntax: the
handshake goes on without compression (§5). Messages shorter than
``compression_threshold`` bytes, and those compressing would not shrink,
go out plain (RSV1 clear): compression is per message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import rustext
from websockets.exceptions import InvalidHeader
from websockets.headers import parse_extension

if TYPE_CHECKING:
    from juggler.config import ServerConfig

__all__ = ["EXTENSION", "Agreement", "Deflate", "deflate_of", "negotiate"]

EXTENSION = "permessage-deflate"

_WINDOW_BITS = re.compile(r"[1-9][0-9]?")  # §7.1.2.1: 1*DIGIT without a leading zero
_FLAGS = ("server_no_context_takeover", "client_no_context_takeover")
_KNOWN = (*_FLAGS, "server_max_window_bits", "client_max_window_bits")


@dataclass(frozen=True, slots=True)
class Agreement:
    """The parameters agreed on with one client."""

    #: the client keeps its compression context between messages
    client_context_takeover: bool
    #: the client asked for server_max_window_bits (15): echoed in the response
    server_max_window_bits: int | None = None

    def header(self) -> str:
        """The response's ``Sec-WebSocket-Extensions`` value."""
        parts = [EXTENSION, "server_no_context_takeover"]
        if not self.client_context_takeover:
            parts.append("client_no_context_takeover")
        if self.server_max_window_bits is not None:
            parts.append(f"server_max_window_bits={self.server_max_window_bits}")
        return "; ".join(parts)


def _window_bits(value: str | None) -> int | None:
    """A valid window size 8..15, else None."""
    if value is None or not _WINDOW_BITS.fullmatch(value):
        return None
    bits = int(value)
    return bits if 8 <= bits <= 15 else None


def _accept(params: list[tuple[str, str | None]], client_context_takeover: bool) -> Agreement | None:
    """The agreement for one offer, or None to decline it (RFC 7692 §5, §7.1)."""
    names = [name for name, _ in params]
    if len(set(names)) != len(names) or any(name not in _KNOWN for name in names):
        return None
    values = dict(params)
    if any(name in values and values[name] is not None for name in _FLAGS):
        return None
    server_bits = None
    if "server_max_window_bits" in values:
        server_bits = _window_bits(values["server_max_window_bits"])
        if server_bits != 15:  # invalid, or a window narrower than the compressor's
            return None
    if "client_max_window_bits" in values:
        value = values["client_max_window_bits"]
        if value is not None and _window_bits(value) is None:
            return None
    takeover = client_context_takeover and "client_no_context_takeover" not in values
    return Agreement(client_context_takeover=takeover, server_max_window_bits=server_bits)


def negotiate(values: Iterable[str], *, client_context_takeover: bool = False) -> Agreement | None:
    """The agreement for the first acceptable permessage-deflate offer in the
    request's ``Sec-WebSocket-Extensions`` values, or None (no compression)."""
    for value in values:
        try:
            offers = parse_extension(value)
        except InvalidHeader:
            continue  # not extension syntax: its offers are declined, the next header may do
        for name, params in offers:
            if name == EXTENSION:
                agreement = _accept(params, client_context_takeover)
                if agreement is not None:
                    return agreement
    return None


class Deflate:
    """The server's compression policy and its one compressor, shared by its
    connections (no context takeover: nothing of it is per connection)."""

    __slots__ = ("client_context_takeover", "frames", "threshold")

    def __init__(self, *, level: int = 1, threshold: int = 256, client_context_takeover: bool = False) -> None:
        #: builds server text frames, compressed at ``threshold`` bytes and over
        self.frames = rustext.WsDeflate(level, threshold)
        self.threshold = threshold
        self.client_context_takeover = client_context_takeover

    def negotiate(self, values: Iterable[str]) -> Agreement | None:
        """See :func:`negotiate`."""
        return negotiate(values, client_context_takeover=self.client_context_takeover)


def deflate_of(config: ServerConfig) -> Deflate | None:
    """The compression a server with `config` offers, or None when it is off."""
    if not config.compression:
        return None
    return Deflate(level=config.compression_level, threshold=config.compression_threshold,
                   client_context_takeover=config.compression_client_context_takeover)
