"""One multiplexed, full-duplex connection (either side of any channel).

The connection is the asyncio ``Protocol`` of its channel: it alone reads the
socket, hands each read buffer to the wire decoder in one call (Rust), and
routes the messages: responses to the request waiting on that ``seq``,
requests to the handler. Either side may send requests (server push).

Guarantees:
- ids are allocated here; an id in flight is never reused (a 64-bit counter
  that also skips ids still pending after a wrap);
- a request's deadline is tracked by the shared ``DeadlineScheduler`` (one
  loop timer for all requests) with millisecond resolution;
- on connection loss every request in flight fails at once with
  ``ConnectionLost`` (never waits for its deadline); handlers still running
  for it are cancelled;
- cancelling an awaiting caller only drops its pending entry: a late
  response is discarded and the connection stays usable;
- writes are coalesced per loop turn (one ``write`` per turn); the send queue
  is bounded (``send_queue_bytes``): senders wait for room or fail with
  ``QueueFull`` per ``send_policy``;
- at most ``max_handlers`` handlers run per connection (and the server's
  limiter across connections); excess requests queue with reading paused,
  so TCP pushes back on the peer;
- bad input (oversized, malformed, garbage) closes this connection with a
  logged reason; ``close()`` and ``aclose()`` are idempotent.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import rustext

from rpc.transport.config import ConnectionConfig
from rpc.transport.errors import (
    ConnectionLost,
    ProtocolError,
    QueueFull,
    RemoteError,
    RequestTimeout,
    TransportClosed,
)
from rpc.transport.registry import TransportProtocol
from rpc.transport.timer import DeadlineScheduler

log = logging.getLogger("rpc.transport.connection")

#: ``handler(connection, message)`` → payload (bytes, or an object for the
#: protocol's payload codec, or None for empty) or an awaitable of one.
Handler = Callable[["Connection", Any], Any]

_MAX_SEQ = (1 << 64) - 1
_BYTES = (bytes, bytearray, memoryview)


def _fresh(exc: BaseException) -> BaseException:
    """A new instance per waiter: one shared exception raised in many tasks
    would accumulate all their tracebacks."""
    try:
        new = type(exc)(*exc.args)
    except Exception:
        return exc
    new.__cause__ = exc.__cause__
    return new


class _Default:
    pass


DEFAULT: Any = _Default()


class HandlerLimiter:
    """Bound of handlers running at once across connections (a server's).
    Connections that find it full wait in line and are resumed in order."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.active = 0
        self._waiting: deque[Connection] = deque()

    def try_acquire(self) -> bool:
        if self.active < self.limit:
            self.active += 1
            return True
        return False

    def release(self) -> None:
        self.active -= 1
        while self._waiting and self.active < self.limit:
            self._waiting.popleft()._drain_backlog()

    def wait(self, conn: Connection) -> None:
        if conn not in self._waiting:
            self._waiting.append(conn)

    def forget(self, conn: Connection) -> None:
        try:
            self._waiting.remove(conn)
        except ValueError:
            pass


_READ_BUFFER = 256 * 1024


class Connection(asyncio.BufferedProtocol):
    """See the module docstring. Create through ``TransportServer`` or
    ``TransportPool`` (or ``connect()``), not directly."""

    def __init__(
        self,
        protocol: TransportProtocol,
        config: ConnectionConfig,
        scheduler: DeadlineScheduler,
        *,
        handler: Handler | None = None,
        limiter: HandlerLimiter | None = None,
        on_close: Callable[[Connection, BaseException | None], None] | None = None,
        name: str = "",
    ) -> None:
        self.protocol = protocol
        self.config = config
        self.name = name
        self._wire = protocol.wire
        self._payload = protocol.payload
        self._decode = protocol.payload.decoder_for(protocol.payload_type)
        self._decoder = protocol.wire.decoder(config)
        self._scheduler = scheduler
        self._handler = handler
        self._limiter = limiter
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # request side
        self._pending: dict[int, tuple[Any, int | None]] = {}
        self._next_seq = 1
        # send side
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._write_paused = False
        self._room_waiters: list[asyncio.Future[None]] = []
        # handler side
        self._active = 0
        self._backlog: deque[Any] = deque()
        self._reading_paused = False
        self._draining = False
        self._tasks: set[asyncio.Task[Any]] = set()
        # lifecycle
        self._closing = False  # no new requests
        self._lost = False
        self._lost_exc: BaseException | None = None
        self._bad = False  # bad input seen: ignore whatever still arrives
        # One read buffer per connection, reused for every read (the channel
        # reads into it; the decoder copies out only what frames need).
        self._rbuf = bytearray(_READ_BUFFER)
        self._rview = memoryview(self._rbuf)
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._idle: asyncio.Future[None] | None = None

    # --- public state ----------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """Usable for new requests."""
        return self.transport is not None and not self._closing and not self._lost

    @property
    def in_flight(self) -> int:
        """Requests sent and awaiting a response."""
        return len(self._pending)

    @property
    def handlers_running(self) -> int:
        return self._active

    @property
    def send_queue_size(self) -> int:
        """Bytes queued for sending (ours + the channel's buffer)."""
        t = self.transport
        return self._out_bytes + (t.get_write_buffer_size() if t is not None and not self._lost else 0)

    def peername(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport is not None else None

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    # --- asyncio.Protocol --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        try:
            transport.set_write_buffer_limits(high=self.config.send_queue_bytes)  # type: ignore[attr-defined]
        except (AttributeError, NotImplementedError):
            pass

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rview

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._rview[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        if self._lost or self._bad:
            return
        try:
            messages = self._decoder.feed(data)
        except rustext.DecodeError as exc:
            self._bad_input(exc)
            return
        replies: list[tuple[Any, Any, str | None]] | None = None
        for msg in messages:
            if msg.message_type:
                self._on_response(msg)
                continue
            if self._lost:
                break
            r = self._on_request(msg)
            if r is not None:
                if replies is None:
                    replies = [r]
                else:
                    replies.append(r)
        if replies:
            self._send_replies(replies)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_room()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        reason = self._lost_exc
        if reason is None:
            reason = ConnectionLost(f"connection {self.name or self.peername()} lost" + (f": {exc}" if exc else ""))
        self._lost_exc = reason
        pending, self._pending = self._pending, {}
        for waiter, th in pending.values():
            if th is not None:
                self._scheduler.cancel(th)
            self._fail(waiter, _fresh(reason))
        for t in list(self._tasks):
            t.cancel()
        self._backlog.clear()
        if self._limiter is not None:
            self._limiter.forget(self)
        self._out.clear()
        self._out_bytes = 0
        for f in self._room_waiters:
            if not f.done():
                f.set_exception(_fresh(reason))
                f.exception()  # a waiter may be gone; do not warn about it
        self._room_waiters.clear()
        self._check_idle()
        if not self._closed.done():
            self._closed.set_result(None)
        if self._on_close is not None:
            try:
                self._on_close(self, exc)
            except Exception:
                log.exception("on_close callback failed")

    # --- incoming ----------------------------------------------------------------
    def _on_response(self, msg: Any) -> None:
        entry = self._pending.pop(msg.seq, None)
        if entry is None:
            log.debug("%s: response to unknown or abandoned request %d dropped", self.name, msg.seq)
            return
        waiter, th = entry
        if th is not None:
            self._scheduler.cancel(th)
        if msg.status:
            err = RemoteError(msg.error or "remote error")
            err.response = msg  # the whole error response (reply metadata)
            self._fail(waiter, err)
        elif type(waiter) is asyncio.Future or isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_result(msg)
        else:
            self._call_back(waiter, msg, None)
        if self._idle is not None:
            self._check_idle()

    def _on_request(self, msg: Any) -> tuple[Any, Any, str | None] | None:
        """Handle one request; returns a reply to batch, or None."""
        if msg.heartbeat:
            return None if msg.oneway else (msg, msg.payload, None)
        if self._handler is None:
            return None if msg.oneway else (msg, None, "no handler for requests on this connection")
        if self._closing:
            # Draining: finish what runs, refuse what is new (so a drain ends
            # even under steady load).
            return None if msg.oneway else (msg, None, "connection is closing")
        if self._backlog or self._active >= self.config.max_handlers or (
            self._limiter is not None and not self._limiter.try_acquire()
        ):
            self._queue(msg)
            return None
        return self._run(msg)

    def _queue(self, msg: Any) -> None:
        self._backlog.append(msg)
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        if self._limiter is not None and self._active < self.config.max_handlers:
            self._limiter.wait(self)

    def _drain_backlog(self) -> None:
        """Start queued requests while both limits allow (called on release).
        Not re-entered: a sync handler releasing its slot inside the loop
        lets the loop continue instead of recursing once per queued request."""
        if self._draining:
            return
        self._draining = True
        try:
            while self._backlog and not self._lost and self._active < self.config.max_handlers:
                if self._limiter is not None and not self._limiter.try_acquire():
                    self._limiter.wait(self)
                    return
                r = self._run(self._backlog.popleft())
                if r is not None:
                    self._send_replies([r])
        finally:
            self._draining = False
        if not self._backlog and self._reading_paused and not self._lost and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _run(self, msg: Any) -> tuple[Any, Any, str | None] | None:
        """Run the handler (a slot is held); sync results are returned to batch."""
        self._active += 1
        try:
            result = self._handler(self, msg)  # type: ignore[misc]
        except Exception as exc:
            self._release()
            log.debug("%s: handler failed", self.name, exc_info=True)
            return None if msg.oneway else (msg, None, f"{type(exc).__name__}: {exc}")
        # bytes and None first: inspect.isawaitable ends in an ABC check,
        # the dearest step of a sync handler's reply
        plain = result is None or type(result) in _BYTES
        if not plain and inspect.isawaitable(result):
            task = self._loop.create_task(self._finish(msg, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return None
        self._release()
        if msg.oneway:
            return None
        if plain:
            return (msg, result, None)
        try:
            return (msg, self._encode_result(result), None)
        except Exception as exc:
            return (msg, None, f"cannot encode result: {exc}")

    async def _finish(self, msg: Any, result: Awaitable[Any]) -> None:
        try:
            value = await result
        except asyncio.CancelledError:
            self._release()
            raise
        except Exception as exc:
            self._release()
            log.debug("%s: handler failed", self.name, exc_info=True)
            if not msg.oneway and not self._lost:
                self._send_replies([(msg, None, f"{type(exc).__name__}: {exc}")])
            return
        self._release()
        if not msg.oneway and not self._lost:
            try:
                payload = self._encode_result(value)
            except Exception as exc:
                self._send_replies([(msg, None, f"cannot encode result: {exc}")])
                return
            self._send_replies([(msg, payload, None)])

    def _release(self) -> None:
        self._active -= 1
        if self._limiter is not None:
            self._limiter.release()
        if self._backlog:
            self._drain_backlog()
        if self._idle is not None:
            self._check_idle()

    def _encode_result(self, value: Any) -> Any:
        if value is None or type(value) in _BYTES:
            return value
        return self._payload.encode(value)

    def _bad_input(self, exc: Exception) -> None:
        self._bad = True
        log.warning("closing connection %s: bad input: %s", self.name or self.peername(), exc)
        lost = ConnectionLost(f"connection closed after bad input: {exc}")
        lost.__cause__ = ProtocolError(str(exc))
        self._lost_exc = lost
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    # --- outgoing ----------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _send_replies(self, replies: list[tuple[Any, Any, str | None]]) -> None:
        if self._lost:
            return
        try:
            data = self._wire.encode_replies(replies)
        except Exception as exc:  # e.g. a payload the wire cannot carry
            log.warning("%s: cannot encode replies: %s", self.name, exc)
            data = self._wire.encode_replies([(m, None, f"cannot encode reply: {exc}") for m, _, _ in replies])
        self._send(data)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self._lost or self.transport is None:
            return
        out = self._out
        self._out = []
        self._out_bytes = 0
        if len(out) == 1:
            self.transport.write(out[0])
        else:
            self.transport.writelines(out)
        if not self._write_paused:
            self._wake_room()

    def _has_room(self) -> bool:
        return not self._write_paused and self._out_bytes < self.config.send_queue_bytes

    def _wake_room(self) -> None:
        if self._room_waiters and self._has_room():
            waiters, self._room_waiters = self._room_waiters, []
            for f in waiters:
                if not f.done():
                    f.set_result(None)

    async def _wait_room(self, timeout: float | None) -> None:
        while not self._has_room():
            if self._lost:
                raise _fresh(self._lost_exc) if self._lost_exc else ConnectionLost("connection lost")
            if self.config.send_policy == "fail":
                raise QueueFull(f"send queue of {self.name or self.peername()} is full ({self.send_queue_size} bytes)")
            f: asyncio.Future[None] = self._loop.create_future()
            self._room_waiters.append(f)
            try:
                async with asyncio.timeout(timeout):
                    await f
            except TimeoutError:
                raise RequestTimeout("deadline passed while waiting for room in the send queue") from None

    def _check_open(self) -> None:
        if self._closing or self._lost or self.transport is None:
            if self._lost_exc is not None and self._lost:
                raise _fresh(self._lost_exc)
            raise TransportClosed(f"connection {self.name or self.peername()} is closed")

    def _alloc_seq(self) -> int:
        seq = self._next_seq
        pending = self._pending
        while seq in pending:  # only possible after 2^64 ids; never reuse one in flight
            seq = seq + 1 if seq < _MAX_SEQ else 1
        self._next_seq = seq + 1 if seq < _MAX_SEQ else 1
        return seq

    def _timeout(self, timeout: Any) -> float | None:
        return self.config.default_timeout if timeout is DEFAULT else timeout

    def submit(
        self,
        payload: bytes | bytearray | memoryview = b"",
        *,
        service_path: str = "",
        service_method: str = "",
        metadata: Iterable[tuple[str, str]] | None = None,
        timeout: float | None = DEFAULT,
        callback: Callable[[Any, BaseException | None], None] | None = None,
        serialize_type: int | None = None,
        compress_type: int = 0,
    ) -> asyncio.Future[Any] | None:
        """Send a request now and return a future of the response message
        (callback style: ``fut.add_done_callback`` or pass ``callback(msg, exc)``,
        then no future is made and None is returned). Never waits: a full
        send queue raises ``QueueFull`` whatever the policy."""
        self._check_open()
        if not self._has_room():
            raise QueueFull(f"send queue of {self.name or self.peername()} is full")
        return self._submit(
            payload, service_path, service_method, metadata, self._timeout(timeout), callback, serialize_type, compress_type
        )

    def _submit(
        self,
        payload: Any,
        service_path: str,
        service_method: str,
        metadata: Iterable[tuple[str, str]] | None,
        timeout: float | None,
        callback: Callable[[Any, BaseException | None], None] | None,
        serialize_type: int | None,
        compress_type: int = 0,
    ) -> asyncio.Future[Any] | None:
        seq = self._alloc_seq()
        data = self._wire.encode_request(
            seq,
            payload,
            service_path=service_path,
            service_method=service_method,
            metadata=metadata,
            serialize_type=self._payload.serialize_type if serialize_type is None else serialize_type,
            compress_type=compress_type,
        )
        waiter: Any = callback if callback is not None else self._loop.create_future()
        th = self._scheduler.add(timeout, (self, seq)) if timeout is not None else None
        self._pending[seq] = (waiter, th)
        self._send(data)
        return None if callback is not None else waiter

    async def request(
        self,
        payload: bytes | bytearray | memoryview = b"",
        *,
        service_path: str = "",
        service_method: str = "",
        metadata: Iterable[tuple[str, str]] | None = None,
        timeout: float | None = DEFAULT,
        serialize_type: int | None = None,
        compress_type: int = 0,
    ) -> Any:
        """Send a request and await its response message (``.payload`` holds
        the bytes). Raises RequestTimeout, RemoteError, ConnectionLost,
        TransportClosed, QueueFull (fail policy). ``timeout`` in seconds,
        None = no deadline, default from the config. Cancel-safe."""
        # _check_open, _timeout, _has_room and _submit written out: this runs
        # once per request, and each Python call costs as much as its check
        if self._closing or self._lost or self.transport is None:
            self._check_open()
        if timeout is DEFAULT:
            timeout = self.config.default_timeout
        if self._write_paused or self._out_bytes >= self.config.send_queue_bytes:
            await self._wait_room(timeout)
            self._check_open()
        pending = self._pending
        seq = self._next_seq
        if seq < _MAX_SEQ and seq not in pending:
            self._next_seq = seq + 1
        else:
            seq = self._alloc_seq()
        data = self._wire.encode_request(
            seq,
            payload,
            service_path=service_path,
            service_method=service_method,
            metadata=metadata,
            serialize_type=self._payload.serialize_type if serialize_type is None else serialize_type,
            compress_type=compress_type,
        )
        fut = self._loop.create_future()
        pending[seq] = (fut, self._scheduler.add(timeout, (self, seq)) if timeout is not None else None)
        self._send(data)
        try:
            return await fut
        except asyncio.CancelledError:
            self._abandon(fut)
            raise

    async def call(self, obj: Any, *, service_path: str = "", service_method: str = "", timeout: float | None = DEFAULT, metadata: Iterable[tuple[str, str]] | None = None) -> Any:
        """``request`` with the protocol's payload codec on both ends."""
        msg = await self.request(
            self._payload.encode(obj), service_path=service_path, service_method=service_method, timeout=timeout, metadata=metadata
        )
        return self._decode(msg.payload)

    async def notify(
        self,
        payload: bytes | bytearray | memoryview = b"",
        *,
        service_path: str = "",
        service_method: str = "",
        metadata: Iterable[tuple[str, str]] | None = None,
        serialize_type: int | None = None,
        timeout: float | None = DEFAULT,
        compress_type: int = 0,
    ) -> None:
        """Fire-and-forget (a oneway message: the peer sends no reply). Waits
        only for room in the send queue (per policy, bounded by ``timeout``)."""
        self._check_open()
        if not self._has_room():
            await self._wait_room(self._timeout(timeout))
            self._check_open()
        data = self._wire.encode_request(
            0,
            payload,
            oneway=True,
            service_path=service_path,
            service_method=service_method,
            metadata=metadata,
            serialize_type=self._payload.serialize_type if serialize_type is None else serialize_type,
            compress_type=compress_type,
        )
        self._send(data)

    async def heartbeat(self, payload: bytes = b"", *, timeout: float | None = DEFAULT) -> Any:
        """A heartbeat request; the peer's transport answers it (no handler)."""
        self._check_open()
        timeout = self._timeout(timeout)
        seq = self._alloc_seq()
        fut = self._loop.create_future()
        th = self._scheduler.add(timeout, (self, seq)) if timeout is not None else None
        self._pending[seq] = (fut, th)
        self._send(self._wire.encode_request(seq, payload, heartbeat=True, serialize_type=0))
        try:
            return await fut
        except asyncio.CancelledError:
            self._abandon(fut)
            raise

    def _abandon(self, fut: asyncio.Future[Any]) -> None:
        for seq, (w, th) in self._pending.items():
            if w is fut:
                del self._pending[seq]
                if th is not None:
                    self._scheduler.cancel(th)
                break
        if self._idle is not None:
            self._check_idle()

    def _expire(self, seq: int) -> None:
        """Deadline passed (called by the scheduler)."""
        entry = self._pending.pop(seq, None)
        if entry is None:
            return
        self._fail(entry[0], RequestTimeout(f"request {seq} on {self.name or self.peername()} timed out"))
        if self._idle is not None:
            self._check_idle()

    def _fail(self, waiter: Any, exc: BaseException) -> None:
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_exception(exc)
        else:
            self._call_back(waiter, None, exc)

    def _call_back(self, cb: Callable[[Any, BaseException | None], None], msg: Any, exc: BaseException | None) -> None:
        try:
            cb(msg, exc)
        except Exception:
            log.exception("%s: request callback failed", self.name)

    # --- lifecycle -------------------------------------------------------------------
    def _check_idle(self) -> None:
        if self._idle is not None and not self._idle.done():
            if self._lost or (not self._pending and not self._active and not self._backlog):
                self._idle.set_result(None)

    def close(self) -> None:
        """Close now (idempotent): in-flight requests fail with TransportClosed,
        queued writes are still flushed by the channel."""
        if self._lost:
            return
        if self._lost_exc is None:
            self._lost_exc = TransportClosed(f"connection {self.name or self.peername()} closed")
        self._closing = True
        if self.transport is not None:
            self._flush()
            self.transport.close()
        # Fail in-flight requests now rather than on the channel's callback.
        self.connection_lost(None)

    async def aclose(self, timeout: float | None = None) -> None:
        """Graceful close (idempotent): refuse new requests, wait up to
        ``timeout`` (default ``drain_timeout``) for in-flight requests and
        running handlers, then close; what is left fails with TransportClosed."""
        if self._lost:
            await self.wait_closed()
            return
        self._closing = True
        if self._idle is None:
            self._idle = self._loop.create_future()
            self._check_idle()
        wait = self.config.drain_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(self._idle)
        except TimeoutError:
            log.info("%s: drain deadline passed with %d in flight, %d handlers", self.name, len(self._pending), self._active)
        self.close()
        await self.wait_closed()


async def connect(
    endpoint: Any,
    protocol: TransportProtocol,
    config: ConnectionConfig,
    scheduler: DeadlineScheduler,
    *,
    handler: Handler | None = None,
    inproc: Any = None,
    on_close: Callable[[Connection, BaseException | None], None] | None = None,
    tls: Any = None,
) -> Connection:
    """Open one connection to ``endpoint`` over its channel (``tls``: a
    client ``ssl.SSLContext`` for TLS over TCP)."""
    from rpc.transport.channels import channel_for
    from rpc.transport.endpoint import Endpoint

    ep = Endpoint.parse(endpoint)
    channel = channel_for(ep, inproc, tls)

    def factory() -> Connection:
        return Connection(protocol, config, scheduler, handler=handler, on_close=on_close, name=str(ep))

    _, conn = await channel.connect(ep, factory)
    assert isinstance(conn, Connection)
    return conn


def expire(key: tuple[Connection, int]) -> None:
    """The ``fire`` callback of a DeadlineScheduler shared by connections."""
    conn, seq = key
    conn._expire(seq)
