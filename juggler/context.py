"""The seam between a connection and its server.

A connection (:class:`juggler.conn.Conn`) knows its server only through the
:class:`ConnContext` it is handed: the configuration, the counters, the
brokers, the table of pending calls, the middleware chains, the extensions
and a :class:`ConnListener` (the server's side of the connection's
lifecycle). :class:`juggler.server.Server` makes one context for all its
connections; a test or another server can make its own.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from juggler.broker.base import CallerBroker, PubSubBroker
from juggler.config import ServerConfig
from juggler.extensions import ExtensionHandler
from juggler.metrics import ServerStats
from juggler.pending import PendingCalls
from juggler.protocol import ClientMessage, Outgoing

if TYPE_CHECKING:
    from juggler.auth import Auth

__all__ = ["ConnContext", "ConnListener", "ConnState", "Handler", "Message", "Middleware"]


class ConnState(enum.Enum):
    """Passed to the server's ``on_conn_state`` callback."""

    ACCEPTING = "accepting"  # handshake request received; raise to refuse (403)
    CONNECTED = "connected"  # juggler.0 negotiated, messages flow
    CLOSED = "closed"  # gone (called once, also for refused handshakes)


Message = ClientMessage | Outgoing
#: a handler of one message in or out, and a middleware around one (the connection: a juggler.conn.Conn)
Handler = Callable[[Any, Message], Awaitable[None]]
Middleware = Callable[[Any, Message, Handler], Awaitable[None]]

class ConnListener(Protocol):
    """The server's side of a connection's lifecycle (:class:`juggler.server.Server`
    provides one). Each ``conn_*`` method is called once per connection at
    most, in this order; ``conn_closed`` always comes last."""

    #: True while the server drains: new connections get 503, new CALLs NACK 503
    draining: bool

    def reject(self, reason: str) -> None:
        """Count one refusal by reason (``juggler_rejections_total{reason}``)."""

    def conn_opened(self, conn: Any) -> bool:
        """A TCP connection was accepted; False refuses it at once (the server is closing)."""

    def conn_accepting(self, conn: Any) -> None:
        """The handshake request is valid; raising refuses it with 403."""

    def conn_connected(self, conn: Any) -> None:
        """juggler.0 was negotiated: messages flow."""

    def conn_closed(self, conn: Any, was_connected: bool) -> None:
        """The TCP connection is gone (after a handshake or not)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnContext:
    """What a server hands every connection it accepts: all a connection
    knows of the server."""

    config: ServerConfig
    stats: ServerStats
    broker: CallerBroker
    pubsub: PubSubBroker
    #: calls ACKed and waiting for their RES, shared by every connection
    pending: PendingCalls[Any]
    listener: ConnListener
    #: the middleware chains (incoming, outgoing), or None without middleware
    chain_in: Handler | None = None
    chain_out: Handler | None = None
    #: answers plain HTTP requests to other paths than the websocket one (/healthz, the
    #: static site): ``http(request, head=..., draining=...)`` returns the response, or None for 404
    http: Callable[..., Any] | None = None
    #: authenticates handshakes and authorizes CALL/PUB/SUB
    auth: Auth | None = None
    #: the server's subscriptions and their fan-out (juggler.subscriptions.Subscriptions)
    subscriptions: Any = None
    #: handlers of the extension requests the server answers, by type (juggler.extensions)
    extensions: Mapping[int, ExtensionHandler] = field(default_factory=dict)
    #: the application's backend: connect, subscribe, publish and rpc proxies (juggler.proxy.ProxySet)
    proxies: Any = None
    #: times tokens on live connections, checks subscription tokens (juggler.refreshing.TokenRefresh)
    refresh: Any = None
    #: the HTTP fallback transport (juggler.fallback.Fallback): takes the connections whose
    #: first request is for ``<path>/sse`` or ``<path>/send``; None: not served
    fallback: Any = None
    #: permessage-deflate (juggler.deflate.Deflate), None when compression is off
    deflate: Any = None
