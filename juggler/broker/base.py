"""Broker interfaces: what the server and the callees need from a broker.

Two implementations exist behind these interfaces: ``memory.py`` (one
process, the embedded default) and ``redis/`` (Redis and Redis Cluster,
the exact key layout of protocols/juggler.md). Payloads stay raw JSON bytes
end to end: a broker never decodes ``args``.

Resource model (better than upstream's two Redis connections per websocket):
a server process owns ONE results listener for its process-wide routing key
(``CallerBroker.conn_uuid``), which routes each result to the connection that
made the call by ``msg_uuid``; and ONE pub-sub connection that fans events out
to every local subscriber, with reference-counted Redis subscriptions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, Self, runtime_checkable

from juggler.errors import JugglerError


class BrokerError(JugglerError):
    """A broker operation failed; the server answers NACK ``code`` (500) with the message."""

    #: the NACK code the server answers with
    code = 500


class CapacityExceeded(BrokerError):
    """The target list is full ("list capacity exceeded")."""


class NoCallee(BrokerError):
    """No callee serves the URI, and the broker knows none will before the
    call expires (the in-memory broker: its callees live in this process)."""

    code = 404


@dataclass(frozen=True, slots=True)
class Call:
    """A call as a callee sees it: the payload plus the time it has left."""

    conn_uuid: str
    msg_uuid: str
    uri: str
    args: bytes | None  # raw JSON; None when the CALL had no args
    ttl_ms: int  # remaining time to live when popped (> 0; expired calls are never yielded)
    #: the caller's trace context (a JSON object of ``traceparent``/``tracestate``), raw; None when untraced
    trace: bytes | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """A result routed back to the caller: `args` is the raw JSON result."""

    conn_uuid: str
    msg_uuid: str
    uri: str
    args: bytes | None


@dataclass(frozen=True, slots=True)
class Event:
    """A published message as delivered to one subscription."""

    channel: str
    pattern: str | None  # the pattern that matched, for pattern subscriptions
    msg_uuid: str
    args: bytes | None
    #: the event's position in its channel's history, on channels with history
    offset: int | None = None
    epoch: str | None = None


# A result sink: called (on the event loop, never blocking) for each result.
ResultHandler = Callable[[Result], None]
# An event sink: called (on the event loop, never blocking) for each event.
EventHandler = Callable[[Event], None]


@runtime_checkable
class CallerBroker(Protocol):
    """Server side of RPC: queue calls, receive their results."""

    @property
    def conn_uuid(self) -> str:
        """The routing key put in every call payload of this process."""

    async def call(
        self, msg_uuid: str, uri: str, args: bytes | None, timeout_ms: int, *, trace: bytes | None = None
    ) -> None:
        """Queue a call for `uri` that expires after `timeout_ms` (> 0);
        `trace` (raw JSON object, optional) travels with it to the callee.

        Raises BrokerError (CapacityExceeded when the list is full); the
        server turns it into NACK 500. Returning means "queued" (the ACK).
        """

    def on_result(self, handler: ResultHandler) -> None:
        """Set the one sink for this process's results (expired ones are dropped, counted)."""


@runtime_checkable
class PubSubBroker(Protocol):
    """Publish, and reference-counted subscriptions shared by all local subscribers."""

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> None: ...

    async def subscribe(self, subscriber: object, channel: str, pattern: bool, handler: EventHandler) -> None:
        """Idempotent per (subscriber, channel, pattern): subscribing twice counts once."""

    async def unsubscribe(self, subscriber: object, channel: str, pattern: bool) -> None:
        """Remove one subscription; a no-op when it does not exist."""

    async def unsubscribe_all(self, subscriber: object) -> None:
        """Drop every subscription of `subscriber` (its connection closed)."""


@runtime_checkable
class CalleeBroker(Protocol):
    """Callee side of RPC: pop calls for some URIs, push results."""

    def calls(self, uris: list[str]) -> AsyncIterator[Call]:
        """Yield unexpired calls for `uris` until closed."""

    async def send_result(self, result: Result, ttl_ms: int) -> None:
        """Store a result for its caller, alive for `ttl_ms` (the call's remaining time)."""


class Broker(Protocol):
    """Lifecycle shared by every broker implementation."""

    async def start(self) -> None: ...

    async def aclose(self) -> None:
        """Idempotent; stops listeners and closes connections."""


class BrokerBase:
    """The async-context-manager half of a broker's lifecycle: ``async with``
    starts it and closes it (subclasses implement ``start`` and ``aclose``)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
