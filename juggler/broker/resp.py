"""A thin, pipelined RESP2 client for the Redis broker's hot paths.

Why not redis-py's client objects for every command: on this project's
2-core machines redis-py 8 reaches ~36k pipelined EVALSHA/s per core, this
module ~100k (it is an ``asyncio.Protocol`` over hiredis' reply parser with
implicit pipelining). redis-py still parses the URLs, and the tests use it to
look at Redis.

Model:

- :meth:`RespConnection.execute` queues a command and returns a future; all
  commands queued during one event-loop turn go out in one write, and
  replies resolve the futures in order (implicit pipelining).
- Cancelling a waiter is safe: its reply is still read and dropped, so the
  connection never gets off by one (unlike redis-py CVE-2023-28859).
- A command that gets no reply within its deadline (``command_timeout``, or
  the blocking timeout plus a margin) means the connection is in an unknown
  state: it is closed and every pending command fails with
  :class:`RedisConnectionError`. Closed connections are never reused.
- When a connection is lost, a command already written to it fails with
  :class:`RedisOutcomeUnknown` (Redis may have run it: a PUBLISH may have
  been delivered, a push queued), one never written with a plain
  :class:`RedisConnectionError` (it certainly did not run). Callers must not
  retry the first kind of what is not idempotent.
- A connection made with ``on_push`` is a pub-sub connection: every reply
  goes to that callback instead of a future.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import hiredis

from rustext.tls import ClientTls, describe_ssl_error

from juggler.broker.base import BrokerError

__all__ = [
    "RedisAddress",
    "RedisConnectionError",
    "RedisOutcomeUnknown",
    "RedisReplyError",
    "RespConnection",
    "RespPool",
    "Script",
    "evalsha",
    "pack_command",
]

log = logging.getLogger("juggler.broker.redis")


class RedisReplyError(BrokerError):
    """Redis answered a command with an error reply (``-ERR ...``)."""


class RedisConnectionError(BrokerError, ConnectionError):
    """The connection to Redis failed, was closed or timed out."""


class RedisOutcomeUnknown(RedisConnectionError):
    """The connection was lost after the command was sent and before its
    reply: Redis may or may not have run it. ``code`` is the NACK a client
    gets for it (504: the outcome is unknown, not a refusal)."""

    code = 504


Arg = bytes | str | int | float


def _enc(a: Arg) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, int):
        return b"%d" % a
    if isinstance(a, float):
        return repr(a).encode()
    if isinstance(a, bytearray | memoryview):
        return bytes(a)
    raise TypeError(f"cannot send {type(a).__name__} to Redis")


def pack_command(args: Sequence[Arg]) -> bytes:
    """RESP2 encoding of one command (hot: one bytes object per argument)."""
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for a in args:
        t = type(a)
        if t is bytes:
            b = a
        elif t is str:
            b = a.encode()  # type: ignore[union-attr]
        elif t is int:
            b = b"%d" % a
        else:
            b = _enc(a)
        append(b"$%d\r\n%b\r\n" % (len(b), b))  # type: ignore[arg-type]
    return b"".join(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisAddress:
    """Where and how to connect (parsed from ``redis://[user:pass@]host:port/db``,
    ``rediss://…`` for TLS, or ``unix:///path?db=N``)."""

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = None
    unix_path: str | None = None
    #: TLS to Redis (``rediss://``): how the server is verified, the client certificate
    tls: ClientTls | None = None

    @classmethod
    def from_url(cls, url: str, *, tls: ClientTls | None = None) -> RedisAddress:
        """Parse ``url``; ``tls`` (CA, client certificate) applies to a
        ``rediss://`` URL, which without it verifies Redis against the
        system's trust store."""
        u = urlparse(url)
        if u.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"unsupported Redis URL scheme {u.scheme!r} in {url!r} (use redis://, rediss:// or unix://)")
        if tls is not None and u.scheme != "rediss":
            raise ValueError(f"TLS options for Redis need a rediss:// URL, got {url!r}")
        db = 0
        if u.scheme == "unix":
            q = dict(p.split("=", 1) for p in u.query.split("&") if "=" in p)
            db = int(q.get("db", "0"))
            return cls(
                unix_path=u.path, db=db,
                username=unquote(u.username) if u.username else None,
                password=unquote(u.password) if u.password else None,
            )
        path = u.path.lstrip("/")
        if path:
            try:
                db = int(path)
            except ValueError:
                raise ValueError(f"the database in a Redis URL is a number, got {path!r} in {url!r}") from None
        return cls(
            host=u.hostname or "127.0.0.1",
            port=u.port or 6379,
            db=db,
            username=unquote(u.username) if u.username else None,
            password=unquote(u.password) if u.password else None,
            tls=(tls or ClientTls()) if u.scheme == "rediss" else None,
        )

    def at(self, host: str, port: int) -> RedisAddress:
        """The same credentials and TLS options for another node (a cluster's)."""
        return RedisAddress(host=host, port=port, username=self.username, password=self.password, tls=self.tls)

    def __str__(self) -> str:
        if self.unix_path:
            return f"unix://{self.unix_path}?db={self.db}"
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{self.host}:{self.port}/{self.db}"


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: RespConnection) -> None:
        self.owner = owner
        self.reader = hiredis.Reader(replyError=RedisReplyError)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.owner._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        owner = self.owner
        pending = owner._pending
        push = owner._on_push
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                owner._fail(RedisConnectionError(f"protocol error from Redis: {exc}"))
                return
            if reply is False:
                return
            if push is not None and owner._ready:
                push(reply)
                continue
            if not pending:
                owner._fail(RedisConnectionError("unexpected reply from Redis"))
                return
            fut, _deadline = pending.popleft()
            if not fut.done():
                if isinstance(reply, RedisReplyError):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))


class RespConnection:
    """One Redis connection with implicit pipelining (see the module doc)."""

    def __init__(
        self,
        address: RedisAddress,
        *,
        command_timeout: float | None = 10.0,
        on_push: Callable[[Any], None] | None = None,
        on_close: Callable[[RespConnection, BaseException], None] | None = None,
        name: str | None = None,
    ) -> None:
        self.address = address
        self.command_timeout = command_timeout
        self.name = name
        self._on_push = on_push
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._wbuf: list[bytes] = []
        self._unsent = 0  # commands at the end of _pending whose bytes are still in _wbuf
        self._flush_scheduled = False
        self._closed = False
        self._ready = False
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.close_reason: BaseException | None = None

    @classmethod
    async def open(cls, address: RedisAddress, *, connect_timeout: float = 5.0, **kw: Any) -> RespConnection:
        conn = cls(address, **kw)
        await conn._connect(connect_timeout)
        return conn

    async def _connect(self, connect_timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        a = self.address
        try:
            async with asyncio.timeout(connect_timeout):
                if a.unix_path:
                    await loop.create_unix_connection(lambda: _Protocol(self), a.unix_path)
                else:
                    tls = a.tls.context() if a.tls is not None else None
                    transport, _ = await loop.create_connection(
                        lambda: _Protocol(self), a.host, a.port, ssl=tls, server_hostname=a.host if tls else None
                    )
                    sock = transport.get_extra_info("socket")
                    if sock is not None:
                        import socket

                        try:
                            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        except OSError:
                            pass
                setup: list[asyncio.Future[Any]] = []
                if a.password:
                    auth = ("AUTH", a.username, a.password) if a.username else ("AUTH", a.password)
                    setup.append(self._send(auth, None))
                if a.db:
                    setup.append(self._send(("SELECT", a.db), None))
                if self.name:
                    setup.append(self._send(("CLIENT", "SETNAME", self.name), None))
                for f in setup:
                    await f
        except (OSError, TimeoutError) as exc:
            why = describe_ssl_error(exc) if isinstance(exc, ssl.SSLError) else exc
            self._fail(RedisConnectionError(f"cannot connect to Redis at {a}: {why}"))
            raise RedisConnectionError(f"cannot connect to Redis at {a}: {why}") from exc
        except RedisReplyError as exc:
            self._fail(RedisConnectionError(f"Redis refused the connection setup: {exc}"))
            raise
        self._ready = True
        if self.command_timeout:
            self._watchdog = loop.call_later(min(1.0, self.command_timeout / 2), self._check_deadlines)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        return len(self._pending)

    def execute(self, *args: Arg, timeout: float | None = None) -> asyncio.Future[Any]:
        """Queue one command; the future gets its reply (or RedisReplyError /
        RedisConnectionError). `timeout` overrides ``command_timeout`` (e.g.
        blocking commands pass their block time plus a margin)."""
        return self._send(args, timeout)

    def execute_packed(self, packed: bytes, count: int = 1, timeout: float | None = None) -> list[asyncio.Future[Any]]:
        """Queue `count` commands already RESP-encoded in `packed`."""
        loop = self._loop or asyncio.get_running_loop()
        if self._closed:
            futs = []
            for _ in range(count):
                f = loop.create_future()
                f.set_exception(self.close_reason or RedisConnectionError("connection closed"))
                futs.append(f)
            return futs
        t = timeout if timeout is not None else self.command_timeout
        deadline = time.monotonic() + t if t else float("inf")
        futs = []
        for _ in range(count):
            f = loop.create_future()
            self._pending.append((f, deadline))
            futs.append(f)
        self._unsent += count
        self._write(packed)
        return futs

    def send_push(self, *args: Arg) -> None:
        """Send a command whose replies come as pushes (pub-sub connections)."""
        if self._closed:
            raise self.close_reason or RedisConnectionError("connection closed")
        self._write(pack_command(args))

    def _send(self, args: Sequence[Arg], timeout: float | None) -> asyncio.Future[Any]:
        loop = self._loop or asyncio.get_running_loop()
        fut = loop.create_future()
        if self._closed:
            fut.set_exception(self.close_reason or RedisConnectionError("connection closed"))
            return fut
        t = timeout if timeout is not None else self.command_timeout
        self._pending.append((fut, time.monotonic() + t if t else float("inf")))
        self._unsent += 1
        self._write(pack_command(args))
        return fut

    def _write(self, data: bytes) -> None:
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed or self._transport is None or not self._wbuf:
            self._wbuf.clear()
            return
        data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
        self._wbuf.clear()
        self._unsent = 0
        self._transport.write(data)

    def _check_deadlines(self) -> None:
        self._watchdog = None
        if self._closed:
            return
        if self._pending:
            _, deadline = self._pending[0]
            if time.monotonic() > deadline:
                log.warning("redis %s: no reply in time, closing the connection", self.address)
                self._fail(RedisConnectionError("Redis did not answer in time"))
                return
        assert self._loop is not None and self.command_timeout
        self._watchdog = self._loop.call_later(min(1.0, self.command_timeout / 2), self._check_deadlines)

    def _fail(self, exc: BaseException) -> None:
        if self._closed:
            return
        self._closed = True
        self.close_reason = exc
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, deque()
        # the first commands were written (Redis may have run them), the last `_unsent` were not
        sent = len(pending) - self._unsent
        self._unsent = 0
        unknown: BaseException | None = None
        for i, (fut, _) in enumerate(pending):
            if not fut.done():
                if i < sent and isinstance(exc, RedisConnectionError):
                    if unknown is None:
                        unknown = RedisOutcomeUnknown(f"outcome unknown: {exc} after the command was sent, "
                                                      "Redis may have run it")
                    fut.set_exception(unknown)
                else:
                    fut.set_exception(exc)
                fut.exception()  # waiters still get it; a future nobody awaits any more stays quiet
        self._wbuf.clear()
        if self._transport is not None:
            self._transport.abort()
        if self._on_close is not None:
            try:
                self._on_close(self, exc)
            except Exception:
                log.exception("on_close callback failed")

    def close(self) -> None:
        """Close now; pending commands fail. Idempotent."""
        self._fail(RedisConnectionError("connection closed"))

    async def aclose(self) -> None:
        self.close()


class Script:
    """A Lua script run by EVALSHA, falling back to EVAL on NOSCRIPT (as redigo)."""

    def __init__(self, body: str) -> None:
        self.body = body.encode()
        self.sha = hashlib.sha1(self.body).hexdigest().encode()

    def pack(self, keys: Sequence[Arg], args: Sequence[Arg]) -> bytes:
        return pack_command((b"EVALSHA", self.sha, len(keys), *keys, *args))

    def pack_eval(self, keys: Sequence[Arg], args: Sequence[Arg]) -> bytes:
        return pack_command((b"EVAL", self.body, len(keys), *keys, *args))


class RespPool:
    """A few shared command connections, opened lazily and replaced when they die.

    Commands are spread over the connections (fewest pending first); each
    connection pipelines implicitly, so one or two connections carry a whole
    process's load.
    """

    def __init__(self, address: RedisAddress, *, size: int = 2, command_timeout: float = 10.0,
                 connect_timeout: float = 5.0, name: str | None = None) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.address = address
        self.size = size
        self.command_timeout = command_timeout
        self.connect_timeout = connect_timeout
        self.name = name
        self._conns: list[RespConnection] = []
        self._connecting: asyncio.Task[RespConnection] | None = None
        self._closed = False

    def _pick(self) -> RespConnection | None:
        conns = self._conns
        if len(conns) == 1:  # the common case, once per pipelined batch: no list, no min()
            only = conns[0]
            if not only.closed:
                return None if only.pending > 64 and self.size > 1 else only
        live = [c for c in conns if not c.closed]
        if len(live) != len(self._conns):
            self._conns = live
        if not live:
            return None
        best = min(live, key=lambda c: c.pending)
        if best.pending > 64 and len(live) < self.size:
            return None  # busy: open another
        return best

    async def connection(self) -> RespConnection:
        if self._closed:
            raise RedisConnectionError("broker closed")
        conn = self._pick()
        if conn is not None:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.create_task(self._open())
        task = self._connecting
        try:
            return await asyncio.shield(task)
        except RedisConnectionError:
            if self._conns:
                return self._conns[0]
            raise

    async def _open(self) -> RespConnection:
        try:
            conn = await RespConnection.open(
                self.address, connect_timeout=self.connect_timeout,
                command_timeout=self.command_timeout, name=self.name,
            )
            if self._closed:
                conn.close()
                raise RedisConnectionError("broker closed")
            self._conns.append(conn)
            return conn
        finally:
            self._connecting = None

    @property
    def closed(self) -> bool:
        return self._closed

    async def execute(self, *args: Arg, timeout: float | None = None) -> Any:
        conn = await self.connection()
        return await conn.execute(*args, timeout=timeout)

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        return await evalsha(await self.connection(), script, keys, args)

    async def evalsha_many(self, script: Script, calls: Sequence[tuple[Sequence[Arg], Sequence[Arg]]]) -> list[Any]:
        """Run `script` once per (keys, args), pipelined; returns replies or
        exceptions (RedisReplyError) in order."""
        if not calls:
            return []
        conn = await self.connection()
        packed = b"".join(script.pack(k, a) for k, a in calls)
        futs = conn.execute_packed(packed, len(calls))
        results: list[Any] = await asyncio.gather(*futs, return_exceptions=True)
        retry = [i for i, r in enumerate(results) if isinstance(r, RedisReplyError) and str(r).startswith("NOSCRIPT")]
        if retry:
            futs2 = conn.execute_packed(b"".join(script.pack_eval(*calls[i]) for i in retry), len(retry))
            again = await asyncio.gather(*futs2, return_exceptions=True)
            for i, r in zip(retry, again, strict=True):
                results[i] = r
        for r in results:
            if isinstance(r, RedisConnectionError):
                raise r
        return results

    async def aclose(self) -> None:
        self._closed = True
        for c in self._conns:
            c.close()
        self._conns.clear()


async def evalsha(conn: RespConnection, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
    """EVALSHA on `conn`, EVAL on NOSCRIPT (a promoted replica may not have the script)."""
    (fut,) = conn.execute_packed(script.pack(keys, args))
    try:
        return await fut
    except RedisReplyError as exc:
        if not str(exc).startswith("NOSCRIPT"):
            raise
    (fut,) = conn.execute_packed(script.pack_eval(keys, args))
    return await fut
