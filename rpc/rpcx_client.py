"""The rpcx network client: a ``ServerCaller`` over ``rpc.transport``.

``RpcxCaller`` sends request ``Message``s over the rpcx binary protocol to
``host:port``, ``tcp@host:port`` or ``unix@/path`` addresses, which is what
``Client``, ``XClient``, ``juggler rpc call`` and ``juggler rpc bench`` use
(``rpc.callers.SCHEMES["rpcx"]``)::

    caller = RpcxCaller(pool=4, heartbeat_interval=10, on_push=print)
    async with Client("tcp@127.0.0.1:8972", caller, close_caller=True) as client:
        await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=1)

- ``pool`` multiplexed connections per address (round robin across them),
  each kept by a ``TransportPool`` (reconnect with backoff, "down" state
  that fails fast);
- ``heartbeat_interval``: heartbeats on idle and busy connections; one
  unanswered within ``heartbeat_timeout`` closes the connection (its calls
  fail at once with a retryable ``TransportError``) and reconnecting starts;
- ``on_push(message)``: server push (a oneway request the server sends on
  this connection); may be a coroutine function;
- ``plugins``: client plugins (``rpc.client_plugins``) whose
  ``on_conn_open`` / ``on_conn_close`` hooks see every connection opened
  and closed (a refused connection fails like one that cannot connect).

Errors are mapped onto ``rpc.errors`` for the fail modes: cannot connect →
``TransportError`` (CONNECT); connection lost / closed with the call in
flight → ``TransportError`` (CLOSED); send queue full → ``TransportError``
(OVERLOADED); malformed input → ``TransportError`` (PROTOCOL); deadline →
``CallTimeout``. An error *response* is returned as a Message (status
error), except the server's "shutting down" / "connection is closing"
refusals, which mean the call never ran: they raise ``TransportError``
(CLOSED) so that failover retries them on another server.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from rpc.client_plugins import as_container
from rpc.errors import CallTimeout, TransportError, TransportErrorKind
from rpc.message import META_ERROR, Message, MessageStatus, MessageType, from_wire
from rpc.rpcx_server import endpoint_of
from rpc.transport import errors as terr
from rpc.transport.config import ConnectionConfig, PoolConfig
from rpc.transport.endpoint import Endpoint
from rpc.transport.pool import TransportPool

log = logging.getLogger("rpc.rpcx_client")

#: error texts of requests a server refused without running them
NOT_RUN = ("server is shutting down", "connection is closing")


class RpcxCaller:
    def __init__(
        self,
        *,
        pool: int = 1,
        config: PoolConfig | None = None,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        on_push: Callable[[Message], Any] | None = None,
        tls: Any = None,
        kcp: Any = None,
        plugins: Any = (),
    ) -> None:
        if pool < 1:
            raise ValueError("pool must be >= 1")
        if config is None:
            config = PoolConfig(
                connection=ConnectionConfig(default_timeout=None),
                heartbeat_interval=heartbeat_interval,
                heartbeat_timeout=heartbeat_timeout,
                connect_timeout=connect_timeout,
            )
        self.config = config
        self.on_push = on_push
        # one client context shared by the pools (``rustext.tls.ClientTls`` or an ``ssl.SSLContext``)
        ctx = tls.context() if hasattr(tls, "context") else tls
        #: client plugins whose connection hooks (``on_conn_open``, ``on_conn_close``) run here
        self.plugins = as_container(plugins)
        self._pools = [
            TransportPool("rpcx", config=config, handler=self._on_request, tls=ctx,
                          quic_tls=tls if hasattr(tls, "context") else None, kcp=kcp,
                          on_connect=self._conn_open, on_disconnect=self._conn_close)
            for _ in range(pool)
        ]
        self._next = 0
        self._endpoints: dict[str, Endpoint] = {}
        self._addresses: dict[Endpoint, str] = {}  # endpoint → the address the hooks are given
        self._hook_tasks: set[asyncio.Task[Any]] = set()  # async on_conn_close hooks running
        self._closed = False
        self._push_tasks: set[asyncio.Task[Any]] = set()

    def _endpoint(self, address: str) -> Endpoint:
        ep = self._endpoints.get(address)
        if ep is None:
            ep = self._endpoints[address] = endpoint_of(address)
            self._addresses[ep] = address
        return ep

    async def connection(self, address: str) -> Any:
        """The next connection to ``address`` (round robin over the pool)."""
        if self._closed:
            raise TransportError("caller is closed", TransportErrorKind.CLOSED)
        pools = self._pools
        i = self._next
        self._next = i + 1 if i + 1 < len(pools) else 0
        try:
            return await pools[i].get(self._endpoint(address))
        except terr.TransportClosed as exc:
            raise TransportError(f"{address}: {exc}", TransportErrorKind.CLOSED) from exc
        except terr.TransportLayerError as exc:
            raise TransportError(f"{address}: {exc}", TransportErrorKind.CONNECT) from exc

    async def __call__(self, address: str, request: Message, timeout: float | None) -> Message | None:
        conn = await self.connection(address)
        md = request.metadata
        try:
            if request.oneway:
                await conn.notify(
                    request.payload,
                    service_path=request.service_path,
                    service_method=request.service_method,
                    metadata=md.items() if md else None,
                    serialize_type=int(request.serialize_type),
                    compress_type=int(request.compress_type),
                    timeout=timeout,
                )
                return None
            res = await conn.request(
                request.payload,
                service_path=request.service_path,
                service_method=request.service_method,
                metadata=md.items() if md else None,
                timeout=timeout,
                serialize_type=int(request.serialize_type),
                compress_type=int(request.compress_type),
            )
        except terr.RemoteError as exc:
            return self._error_reply(address, request, exc)
        except terr.RequestTimeout:
            raise CallTimeout(f"{request.service_path}.{request.service_method}: no reply from {address} in {timeout}s") from None
        except terr.QueueFull as exc:
            raise TransportError(f"{address}: {exc}", TransportErrorKind.OVERLOADED) from exc
        except terr.ConnectionLost as exc:
            kind = TransportErrorKind.PROTOCOL if isinstance(exc.__cause__, terr.ProtocolError) else TransportErrorKind.CLOSED
            raise TransportError(f"{address}: {exc}", kind) from exc
        except terr.TransportLayerError as exc:
            raise TransportError(f"{address}: {exc}", TransportErrorKind.CLOSED) from exc
        return from_wire(res)

    @staticmethod
    def _error_reply(address: str, request: Message, exc: BaseException) -> Message:
        raw = getattr(exc, "response", None)
        text = str(exc.args[0]) if exc.args else "remote error"
        if text in NOT_RUN:
            raise TransportError(f"{address}: {text}", TransportErrorKind.CLOSED) from exc
        if raw is not None:
            return from_wire(raw)
        res = request.reply()
        res.message_type = MessageType.RESPONSE
        res.status = MessageStatus.ERROR
        res.metadata = {META_ERROR: text}
        return res

    # -- client plugins (connection hooks) ----------------------------------------------
    def add_plugin(self, plugin: object) -> None:
        """Add a client plugin; its connection hooks see connections opened from now on."""
        self.plugins.add(plugin)

    def remove_plugin(self, plugin: object) -> None:
        self.plugins.remove(plugin)

    async def _conn_open(self, ep: Endpoint, conn: Any) -> None:
        if self.plugins._on_conn_open:
            await self.plugins.conn_open(self._addresses.get(ep, str(ep)), conn)

    def _conn_close(self, ep: Endpoint, conn: Any) -> None:
        if self.plugins._on_conn_close:
            pending = self.plugins.conn_close_now(self._addresses.get(ep, str(ep)), conn)
            if pending is not None:
                task = asyncio.ensure_future(pending)
                self._hook_tasks.add(task)
                task.add_done_callback(self._hook_tasks.discard)

    # -- server push -------------------------------------------------------------------
    def _on_request(self, conn: Any, raw: Any) -> Any:
        """Requests a server sends us: pushes (oneway) go to ``on_push``."""
        if self.on_push is None:
            log.debug("server push %s.%s dropped (no on_push)", raw.service_path, raw.service_method)
            return None
        try:
            result = self.on_push(from_wire(raw))
        except Exception:
            log.exception("on_push failed")
            return None
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._push_tasks.add(task)
            task.add_done_callback(self._push_done)
        return None

    def _push_done(self, task: asyncio.Task[Any]) -> None:
        self._push_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("on_push failed", exc_info=task.exception())

    async def aclose(self) -> None:
        """Close every connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(p.aclose(1.0) for p in self._pools), return_exceptions=True)
        if self._hook_tasks:  # on_conn_close hooks of the connections just closed run to the end
            await asyncio.gather(*list(self._hook_tasks), return_exceptions=True)
        tasks = list(self._push_tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> RpcxCaller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["NOT_RUN", "RpcxCaller"]
