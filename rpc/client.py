"""Client: calls to one server (``XClient`` is the many-servers version).

``Client(address, caller)`` encodes arguments with the configured codec,
adds ``__AUTH`` and ``__ServerTimeout``, sends through a ``ServerCaller``
(``RpcxCaller`` for ``tcp@host:port``, ``HTTPCaller`` for the HTTP
gateway, ``GrpcCaller``... see ``rpc.callers``), and decodes the reply::

    async with Client("http://127.0.0.1:8080", HTTPCaller()) as client:
        reply = await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=1.0)   # {"C": 42}
        task = client.go("Arith", "Add", {"A": 1, "B": 2})                          # asyncio.Task
        await client.oneway("Log", "Write", {"line": "x"})

``plugins=[...]`` adds client plugins (``rpc.client_plugins``): hooks before
and after each call, and, through a caller that owns connections
(``RpcxCaller``), when connections open and close.

An error response raises ``ServiceError``; transport failures raise
``TransportError``; the deadline ``CallTimeout``. No retries here (that is
XClient's fail modes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rpc.client_plugins import CallInfo, as_container, share_conn_hooks, unshare_conn_hooks
from rpc.transport.codec import CodecRegistry
from rpc.errors import CallTimeout, RpcError, ServiceError
from rpc.message import META_AUTH, META_SERVER_TIMEOUT, CompressType, Message, SerializeType
from rpc.xclient import ServerCaller

if TYPE_CHECKING:
    from rpc.sidechannel import ByteStream


class Client:
    def __init__(
        self,
        address: str,
        caller: ServerCaller,
        *,
        serialize_type: SerializeType = SerializeType.JSON,
        compress_type: CompressType = CompressType.NONE,
        auth: str | None = None,
        timeout: float | None = None,
        codecs: CodecRegistry | None = None,
        close_caller: bool = False,
        plugins: Any = (),
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0 or None")
        self.address = address
        self.caller = caller
        self.serialize_type = serialize_type
        self.compress_type = compress_type
        self.auth = auth
        self.timeout = timeout
        self.codecs = codecs or CodecRegistry()
        self._close_caller = close_caller
        #: client plugins (``rpc.client_plugins``): call hooks run here, connection hooks in the caller
        self.plugins = as_container(plugins)
        self._conn_plugins = share_conn_hooks(self.plugins, caller)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def _request(self, service: str, method: str, args: Any, metadata: Mapping[str, str] | None,
                 oneway: bool, timeout: float | None) -> tuple[Message, float | None]:
        if self._closed:
            raise RpcError("client is closed")
        t = self.timeout if timeout is None else timeout
        md = dict(metadata) if metadata else {}
        if self.auth is not None:
            md[META_AUTH] = self.auth
        if t is not None:
            if t <= 0:
                raise ValueError("timeout must be > 0")
            md[META_SERVER_TIMEOUT] = str(max(1, int(t * 1000)))
        msg = Message(
            oneway=oneway,
            compress_type=self.compress_type,
            serialize_type=self.serialize_type,
            service_path=service,
            service_method=method,
            metadata=md,
            payload=self.codecs.get(self.serialize_type).encode(args),
        )
        return msg, t

    async def call_message(self, service: str, method: str, args: Any, *, timeout: float | None = None,
                           metadata: Mapping[str, str] | None = None) -> Message:
        """Call and return the response Message (reply metadata, undecoded payload)."""
        req, t = self._request(service, method, args, metadata, False, timeout)
        call = None
        if self.plugins.call_hooks:
            call = CallInfo(service=service, method=method, address=self.address, metadata=req.metadata)
            await self.plugins.pre_call(call, args)
        try:
            try:
                async with asyncio.timeout(t):
                    res = await self.caller(self.address, req, t)
            except TimeoutError as exc:
                if isinstance(exc, CallTimeout):
                    raise
                raise CallTimeout(f"{service}.{method}: no reply in {t}s") from None
            if res is None:
                raise RpcError("the server caller returned no response to a two-way call")
            if res.is_error:
                raise ServiceError(res.error_text or "")
        except Exception as exc:
            if call is not None:
                await self.plugins.post_call(call, args, None, exc)
            raise
        if call is not None:
            await self.plugins.post_call(call, args, res, None)
        return res

    async def call(self, service: str, method: str, args: Any, *, reply_type: Any = None,
                   timeout: float | None = None, metadata: Mapping[str, str] | None = None) -> Any:
        res = await self.call_message(service, method, args, timeout=timeout, metadata=metadata)
        return self.codecs.get(res.serialize_type).decode(res.payload, reply_type)

    def go(self, service: str, method: str, args: Any, **kwargs: Any) -> asyncio.Task[Any]:
        """The call as a background task (cancelled by ``aclose``)."""
        task = asyncio.ensure_future(self.call(service, method, args, **kwargs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def oneway(self, service: str, method: str, args: Any, *, timeout: float | None = None,
                     metadata: Mapping[str, str] | None = None) -> None:
        req, t = self._request(service, method, args, metadata, True, timeout)
        if not self.plugins.call_hooks:
            await self.caller(self.address, req, t)
            return
        call = CallInfo(service=service, method=method, address=self.address, metadata=req.metadata, oneway=True)
        await self.plugins.pre_call(call, args)
        try:
            await self.caller(self.address, req, t)
        except Exception as exc:
            await self.plugins.post_call(call, args, None, exc)
            raise
        await self.plugins.post_call(call, args, None, None)

    # -- file transfer and streams (rpcx's side channel: rpc.filetransfer, rpc.streams) --------

    async def send_file(self, source: Any, *, service: str = "_filetransfer", **kwargs: Any) -> int:
        """Upload a file (rpcx's ``SendFile``); see ``rpc.filetransfer.send_file``."""
        from rpc.filetransfer import send_file

        return await send_file(self._side_call(service), source, serialize_type=self.serialize_type,
                               server_address=self.address, **kwargs)

    async def download_file(self, name: str, dest: Any, *, service: str = "_filetransfer", **kwargs: Any) -> int:
        """Download a file into ``dest`` (rpcx's ``DownloadFile``); see ``rpc.filetransfer.download_file``."""
        from rpc.filetransfer import download_file

        return await download_file(self._side_call(service), name, dest, serialize_type=self.serialize_type,
                                   server_address=self.address, **kwargs)

    async def open_download(self, name: str, *, service: str = "_filetransfer", **kwargs: Any) -> ByteStream:
        """A download as a ``ByteStream`` to iterate; see ``rpc.filetransfer.open_download``."""
        from rpc.filetransfer import open_download

        return await open_download(self._side_call(service), name, serialize_type=self.serialize_type,
                                   server_address=self.address, **kwargs)

    async def open_stream(self, *, service: str = "_streamservice", **kwargs: Any) -> ByteStream:
        """A raw connection to the server's stream service (rpcx's ``Stream``);
        see ``rpc.streams.open_stream``."""
        from rpc.streams import open_stream

        return await open_stream(self._side_call(service), serialize_type=self.serialize_type,
                                 server_address=self.address, **kwargs)

    def _side_call(self, service: str) -> Any:
        async def call(method: str, args: Any) -> Any:
            return await self.call(service, method, args)
        return call

    async def aclose(self) -> None:
        """Cancel ``go`` tasks; close the caller if this client owns it. Idempotent."""
        self._closed = True
        tasks, self._tasks = self._tasks, set()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._close_caller:
            self._close_caller = False
            close = getattr(self.caller, "aclose", None)
            if close is not None:
                await close()
        # after closing the caller, so that its connections' close hooks still ran
        unshare_conn_hooks(self._conn_plugins, self.caller)
        self._conn_plugins = ()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
