"""A juggler client that reconnects by itself and recovers what it missed.

::

    async with reconnecting("ws://127.0.0.1:9000/ws") as client:
        await client.sub("chat.1")
        async for event in client.events():      # spans reconnections
            if event.recovered is False:         # events were lost: reload the state
                ...
            print(event.offset, event.args)

The connection is a :class:`juggler.client.Client`; when it drops, a new one
is opened with the suite's backoff, and every subscription is made again.
A server that goes silent counts as a drop: with the client's keepalive (on
by default, see :func:`juggler.client.connect`), nothing received for the
server's ping interval plus ``keepalive_grace`` drops the connection, so a
server that stopped answering (a paused process, a network that lost the
connection without a reset) is left within seconds, not at the next call. On
channels with history it asks for what was published meanwhile (``since``
the last position seen): the missed events come first, in order, then the
live ones, each once. When that is impossible the event stream carries a
``ClientEvent`` with ``recovered=False`` for the channel (the state must be
reloaded). Calls, publishes and subscribes made while disconnected wait for
the next connection (within their timeout); one in flight when the
connection drops fails with :class:`~juggler.errors.ConnectionClosed` (it
may or may not have run). With ``get_token`` (see
:func:`juggler.client.connect`) every new connection asks it for a token,
so a connection the server closed because its token expired (code 4001)
comes back with a fresh one; ``get_subscription_token`` gives the tokens of
private channels when their subscriptions are made again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from rustext.backoff import Backoff, BackoffPolicy

from juggler.client import Client, ClientEvent, connect
from juggler.errors import CallNacked, ConnectionClosed

__all__ = ["ReconnectingClient", "reconnecting"]

log = logging.getLogger("juggler.client")

DEFAULT_BACKOFF = BackoffPolicy(initial=0.1, maximum=5.0)


class ReconnectingClient:
    """See module doc. Make it with :func:`reconnecting`; ``aclose()`` ends it."""

    def __init__(self, url: str, *, backoff: BackoffPolicy = DEFAULT_BACKOFF,
                 on_state: Callable[[str], None] | None = None, max_queued_events: int = 10_000,
                 **connect_kw: Any) -> None:
        self.url = url
        self.connect_kw = connect_kw
        # the connection's options checked now (connect() does no I/O until awaited): a wrong one
        # raises here rather than ending the reconnection task before its first attempt
        connect(url, max_queued_events=max_queued_events, **connect_kw)
        self.backoff = backoff
        self.on_state = on_state
        self.max_queued_events = max_queued_events
        #: channel -> (offset, epoch) of the last event seen, across connections
        self.positions: dict[str, tuple[int, str]] = {}
        #: the current connection, None while reconnecting
        self.client: Client | None = None
        self.state = "connecting"
        self.reconnects = 0
        self.dropped_events = 0
        self._subs: dict[tuple[bool, str], bool] = {}  # (pattern, channel) -> join_leave
        self._events: deque[ClientEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def start(self) -> None:
        """Connect (raises ConnectionClosed if the first attempt fails)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="juggler-reconnecting")
        await asyncio.shield(self._first)

    def _set_state(self, state: str) -> None:
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:
                log.exception("on_state callback failed")

    async def _run(self) -> None:
        backoff = Backoff(self.backoff)
        while not self._closing:
            try:
                client = await connect(self.url, max_queued_events=self.max_queued_events, **self.connect_kw)
            except (ConnectionClosed, OSError) as exc:
                if not self._first.done():
                    self._first.set_exception(exc)
                    return
                delay = backoff.next_delay()
                log.info("reconnecting to %s in %.2fs: %s", self.url, delay, exc)
                await asyncio.sleep(delay)
                continue
            client.positions = self.positions  # one record of what was seen, across connections
            self.client = client
            try:
                await self._restore(client)
            except ConnectionClosed:
                self.client = None
                continue
            except CallNacked as exc:
                log.warning("a subscription was refused on reconnect: %s", exc)
            backoff.reset()
            self._connected.set()
            self._set_state("open")
            if not self._first.done():
                self._first.set_result(None)
            await self._pump(client)
            self._connected.clear()
            self.client = None
            if self._closing:
                break
            self.reconnects += 1
            self._set_state("reconnecting")
        self._set_state("closed")
        self._wake()

    async def _restore(self, client: Client) -> None:
        """Subscribe again; on channels with history, ask for what was missed."""
        for (pattern, channel), join_leave in list(self._subs.items()):
            since = None if pattern else self.positions.get(channel)
            ack = await client.sub(channel, pattern, since=since, join_leave=join_leave)
            if since is not None and ack.get("recovered") is False:
                self._push(ClientEvent(channel=channel, pattern=None, for_uuid="", args=None,
                                       offset=ack.get("offset"), epoch=ack.get("epoch"), recovered=False))

    async def _pump(self, client: Client) -> None:
        """Move this connection's events to the stream until it closes."""
        async for event in client.events():
            self._push(event)

    def _push(self, event: ClientEvent) -> None:
        if len(self._events) >= self.max_queued_events:
            self._events.popleft()
            self.dropped_events += 1
        self._events.append(event)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _current(self, timeout: float | None) -> Client:
        if self._closing:
            raise ConnectionClosed("client closed")
        async with asyncio.timeout(timeout):
            await self._connected.wait()
        assert self.client is not None
        return self.client

    # the client API ----------------------------------------------------------------

    async def sub(self, channel: str, pattern: bool = False, *, join_leave: bool = False,
                  timeout: float | None = 60.0) -> dict[str, Any]:
        """Subscribe; kept across reconnections. Returns the ACK payload."""
        key = (bool(pattern), channel)
        self._subs[key] = join_leave
        client = await self._current(timeout)
        try:
            return await client.sub(channel, pattern, join_leave=join_leave, timeout=timeout)
        except CallNacked:
            self._subs.pop(key, None)
            raise

    async def unsb(self, channel: str, pattern: bool = False, *, timeout: float | None = 60.0) -> None:
        self._subs.pop((bool(pattern), channel), None)
        client = await self._current(timeout)
        await client.unsb(channel, pattern, timeout=timeout)

    async def pub(self, channel: str, args: Any = None, *, timeout: float | None = 60.0) -> str:
        client = await self._current(timeout)
        return await client.pub(channel, args, timeout=timeout)

    async def call(self, uri: str, args: Any = None, *, timeout: float | None = 60.0) -> Any:
        client = await self._current(timeout)
        return await client.call(uri, args, timeout=timeout)

    async def history(self, channel: str, *, limit: int | None = None, since: tuple[int, str] | None = None,
                      timeout: float | None = 60.0) -> dict[str, Any]:
        """A channel's kept publications (see :meth:`juggler.client.Client.history`): after a
        reconnection, ``since=client.positions[channel]`` reads what a server-side
        subscription missed (nothing is recovered by itself for those)."""
        client = await self._current(timeout)
        return await client.history(channel, limit=limit, since=since, timeout=timeout)

    async def presence(self, channel: str, *, timeout: float | None = 60.0) -> dict[str, Any]:
        """Who is subscribed to `channel` (see :meth:`juggler.client.Client.presence`)."""
        client = await self._current(timeout)
        return await client.presence(channel, timeout=timeout)

    async def next_event(self, timeout: float | None = None) -> ClientEvent:
        """The next event (across reconnections); TimeoutError, or ConnectionClosed once closed."""
        async with asyncio.timeout(timeout):
            while True:
                if self._events:
                    return self._events.popleft()
                if self.state == "closed":
                    raise ConnectionClosed("client closed")
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None

    async def events(self) -> AsyncIterator[ClientEvent]:
        while True:
            try:
                yield await self.next_event()
            except ConnectionClosed:
                return

    async def aclose(self) -> None:
        """Close the connection and stop reconnecting. Idempotent."""
        self._closing = True
        client = self.client
        if client is not None:
            await client.aclose()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.state = "closed"
        self._wake()

    async def __aenter__(self) -> ReconnectingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Open:
    def __init__(self, client: ReconnectingClient) -> None:
        self.client = client

    def __await__(self) -> Any:
        return self._start().__await__()

    async def _start(self) -> ReconnectingClient:
        await self.client.start()
        return self.client

    async def __aenter__(self) -> ReconnectingClient:
        return await self._start()

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()


def reconnecting(url: str = "ws://127.0.0.1:9000/ws", **kw: Any) -> _Open:
    """``await reconnecting(url)`` or ``async with reconnecting(url) as client``;
    keyword arguments as :class:`ReconnectingClient` (and :func:`juggler.client.connect`)."""
    return _Open(ReconnectingClient(url, **kw))
