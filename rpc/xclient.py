"""XClient: one service across many servers, with rpcx's governance.

XClient composes discovery (which servers), a selector (which one now), a
fail mode with retries (what to do on failure), and a circuit breaker per
server, over a ``ServerCaller``: the function that sends one request
``Message`` to one server address and returns its response:
``rpc.rpcx_client.RpcxCaller`` over the network (rpcx protocol),
``HTTPCaller`` over the HTTP gateway; an in-process
one (a ``ServiceDispatcher`` behind a function) serves embedded use and tests.

Calls::

    xc = XClient("Arith", discovery, caller, selector=RoundRobinSelector(),
                 options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=2))
    async with xc:
        reply = await xc.call("Mul", {"A": 7, "B": 6}, timeout=1.0)     # {"C": 42}
        fut = xc.go("Mul", {"A": 1, "B": 2})                             # asyncio.Task
        await xc.oneway("Log", {"line": "..."})                          # no reply
        replies = await xc.broadcast("Reload", {})                       # every server must succeed
        first = await xc.fork("Mul", {"A": 1, "B": 2})                   # first success wins
        receipts = await xc.inform("Reload", {})                         # every server's reply or error

The discovery is the caller's to start and close (it may be shared by several
XClients); ``XClient.start`` subscribes to it. Of the servers it reports, the
XClient uses those not marked ``state=inactive`` and, when
``options.group`` is set, only those registered with ``group=`` that name
(``filter_by_state_and_group``, applied again on each discovery update).

``plugins=[...]`` adds client plugins (``rpc.client_plugins``): ``pre_call``
and ``post_call`` run around each try (a failover's every server, each
server of a broadcast), connection hooks in the caller (``RpcxCaller``).

``timeout`` (seconds; None = ``options.timeout``; None there = no deadline)
bounds the whole call including retries, and is sent to the server as
``__ServerTimeout`` (the remaining milliseconds of each try).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote_plus

from rpc.breaker import BreakerConfig, CircuitBreaker
from rpc.client_plugins import CallInfo, as_container, share_conn_hooks, unshare_conn_hooks
from rpc.transport.codec import CodecRegistry
from rpc.discovery.base import Discovery
from rpc.errors import (
    BroadcastError,
    CallTimeout,
    CircuitOpen,
    NoServerAvailable,
    RpcError,
    ServiceError,
    is_retryable,
)
from rpc.failmode import FailMode, RetryPolicy, execute
from rpc.message import META_AUTH, META_SERVER_TIMEOUT, CompressType, Message, MessageType, SerializeType
from rpc.selector import RandomSelector, Selector

if TYPE_CHECKING:
    from rpc.sidechannel import ByteStream


class ServerCaller(Protocol):
    """Send ``request`` to the server at ``address`` and return its response
    (None for a oneway request). ``timeout`` (seconds, None = none) bounds the
    wait. Raises ``TransportError`` when the request could not be carried and
    ``CallTimeout`` when no response came in time; an error *response* is
    returned as a Message (status error), not raised."""

    async def __call__(self, address: str, request: Message, timeout: float | None) -> Message | None: ...


@dataclass(kw_only=True)
class XClientOptions:
    """How an XClient retries, times out, encodes and authenticates its calls."""

    #: FAILFAST (one try), FAILOVER (another server per retry), FAILTRY (the same server), FAILBACKUP
    #: (a second request after ``backup_latency``, the first success wins)
    fail_mode: FailMode = FailMode.FAILFAST
    #: tries after the first one (FAILOVER, FAILTRY); a service error is never retried
    retries: int = 3
    #: seconds between tries
    retry_interval: float = 0.0
    #: FAILBACKUP: seconds before the second request is sent (at once if the first failed)
    backup_latency: float = 0.010
    timeout: float | None = None  # default per-call deadline (seconds)
    #: payload encoding: RAW, JSON, PROTOBUF or MSGPACK
    serialize_type: SerializeType = SerializeType.JSON
    #: NONE or GZIP
    compress_type: CompressType = CompressType.NONE
    auth: str | None = None  # sent as __AUTH
    breaker: BreakerConfig | None = field(default_factory=BreakerConfig)  # None = no breaker
    #: use only servers registered with ``group=`` this name in their metadata ("" = every server,
    #: grouped or not, as rpcx's ``Option.Group``)
    group: str = ""

    def __post_init__(self) -> None:
        self.fail_mode = FailMode.parse(self.fail_mode)
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout must be > 0 or None")

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(retries=self.retries, retry_interval=self.retry_interval, backup_latency=self.backup_latency)


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _go_parse_query(metadata: str) -> dict[str, list[str]] | None:
    """Go's ``url.ParseQuery``: the values of each key, or None where Go
    returns an error (a ``;`` in a pair, a malformed ``%`` escape)."""
    values: dict[str, list[str]] = {}
    ok = True
    for pair in metadata.split("&"):
        if not pair:
            continue
        if ";" in pair:
            ok = False
            continue
        key, _, value = pair.partition("=")
        if _BAD_ESCAPE.search(key) or _BAD_ESCAPE.search(value):
            ok = False
            continue
        values.setdefault(unquote_plus(key, errors="surrogateescape"), []).append(
            unquote_plus(value, errors="surrogateescape"))
    return values if ok else None


def filter_by_state_and_group(group: str, servers: Mapping[str, str]) -> dict[str, str]:
    """The servers an XClient of ``group`` uses, as rpcx v1.9.1's
    ``filterByStateAndGroup``: drop ``state=inactive`` servers and, when
    ``group`` is not empty, servers none of whose ``group=`` values equal it.
    An empty ``group`` keeps grouped and ungrouped servers alike. Metadata Go
    cannot parse as a query leaves its server in (rpcx skips it)."""
    kept: dict[str, str] = {}
    for addr, metadata in servers.items():
        values = _go_parse_query(metadata)
        if values is not None:
            if values.get("state", [""])[0] == "inactive":
                continue
            if group and group not in values.get("group", ()):
                continue
        kept[addr] = metadata
    return kept


@dataclass(frozen=True, slots=True)
class Receipt:
    """One server's answer to ``XClient.inform`` (rpcx's ``client.Receipt``):
    ``address`` without its network (``127.0.0.1:8972``, as rpcx reports
    it), and the decoded ``reply`` or the ``error``."""

    address: str
    reply: Any = None
    error: BaseException | None = None


class XClient:
    def __init__(
        self,
        service: str,
        discovery: Discovery,
        caller: ServerCaller,
        *,
        selector: Selector | None = None,
        options: XClientOptions | None = None,
        codecs: CodecRegistry | None = None,
        clock: Any = time.monotonic,
        plugins: Any = (),
    ) -> None:
        self.service = service
        self.discovery = discovery
        self.caller = caller
        self.selector: Selector = selector or RandomSelector()
        self.options = options or XClientOptions()
        self.codecs = codecs or CodecRegistry()
        self._clock = clock
        self._policy = self.options.policy
        self._servers: dict[str, str] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._unsubscribe: Any = None
        self._observe = getattr(self.selector, "observe", None)
        self._started = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: client plugins (``rpc.client_plugins``): call hooks run on each try, connection hooks in the caller
        self.plugins = as_container(plugins)
        self._conn_plugins = share_conn_hooks(self.plugins, caller)

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to discovery (idempotent)."""
        if self._started:
            return
        self._started = True
        if not self._conn_plugins:  # started again after aclose
            self._conn_plugins = share_conn_hooks(self.plugins, self.caller)
        self._unsubscribe = self.discovery.subscribe(self._on_servers)
        self._on_servers(self.discovery.servers())

    async def aclose(self) -> None:
        """Unsubscribe and cancel ``go`` calls still running. Idempotent."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        tasks, self._tasks = self._tasks, set()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        unshare_conn_hooks(self._conn_plugins, self.caller)
        self._conn_plugins = ()
        self._started = False

    async def __aenter__(self) -> XClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _on_servers(self, servers: Mapping[str, str]) -> None:
        # filtered on every discovery update, as rpcx's watch does
        self._servers = filter_by_state_and_group(self.options.group, servers)
        self.selector.update_servers(self._servers)
        for addr in list(self._breakers):
            if addr not in self._servers:
                del self._breakers[addr]

    @property
    def servers(self) -> dict[str, str]:
        """The servers in use: discovery's, less inactive ones and other groups'."""
        return dict(self._servers)

    def breaker(self, address: str) -> CircuitBreaker | None:
        """The circuit breaker of ``address`` (None when breakers are off)."""
        if self.options.breaker is None:
            return None
        b = self._breakers.get(address)
        if b is None:
            b = self._breakers[address] = CircuitBreaker(self.options.breaker, clock=self._clock)
        return b

    # -- requests ----------------------------------------------------------------

    def _request(self, method: str, args: Any, metadata: Mapping[str, str] | None, oneway: bool) -> Message:
        opts = self.options
        codec = self.codecs.get(opts.serialize_type)
        md = dict(metadata) if metadata else {}
        if opts.auth is not None:
            md[META_AUTH] = opts.auth
        return Message(
            message_type=MessageType.REQUEST,
            oneway=oneway,
            compress_type=opts.compress_type,
            serialize_type=opts.serialize_type,
            service_path=self.service,
            service_method=method,
            metadata=md,
            payload=codec.encode(args),
        )

    def _deadline(self, timeout: float | None) -> float | None:
        t = self.options.timeout if timeout is None else timeout
        if t is None:
            return None
        if t <= 0:
            raise ValueError("timeout must be > 0")
        return asyncio.get_running_loop().time() + t

    def _pick_for(self, method: str, payload: bytes):  # type: ignore[no-untyped-def]
        def pick(exclude: frozenset[str]) -> str:
            if not self._servers:
                raise NoServerAvailable(f"no server for service {self.service}")
            blocked = set(exclude)
            if self.options.breaker is not None:
                blocked.update(a for a, b in self._breakers.items() if not b.available())
            addr = self.selector.select(self.service, method, payload, blocked)
            if addr is None:
                if exclude and not (blocked - exclude):
                    raise NoServerAvailable(f"every server of {self.service} was tried")
                if len(blocked) > len(exclude):
                    raise CircuitOpen(next(iter(blocked - exclude)))
                raise NoServerAvailable(f"no usable server for service {self.service}")
            return addr

        return pick

    async def _attempt(self, address: str, request: Message, deadline: float | None) -> Message | None:
        """One try on one server: breaker, __ServerTimeout, RTT, status error."""
        breaker = self.breaker(address)
        if breaker is not None and not breaker.allow():
            raise CircuitOpen(address)
        loop = asyncio.get_running_loop()
        timeout = None
        req = request
        if deadline is not None:
            timeout = deadline - loop.time()
            if timeout <= 0:
                if breaker is not None:
                    breaker.on_abandon()
                raise CallTimeout("call deadline exceeded")
            req = Message(
                message_type=request.message_type, heartbeat=request.heartbeat, oneway=request.oneway,
                compress_type=request.compress_type, status=request.status,
                serialize_type=request.serialize_type, seq=request.seq,
                service_path=request.service_path, service_method=request.service_method,
                metadata={**request.metadata, META_SERVER_TIMEOUT: str(max(1, int(timeout * 1000)))},
                payload=request.payload,
            )
        started = loop.time()
        try:
            res = await self.caller(address, req, timeout)
        except asyncio.CancelledError:
            if breaker is not None:
                breaker.on_abandon()
            raise
        except Exception as exc:
            if breaker is not None:
                if is_retryable(exc) or isinstance(exc, CallTimeout):
                    breaker.on_failure()
                else:
                    breaker.on_abandon()
            raise
        if breaker is not None:
            breaker.on_success()
        if self._observe is not None:
            self._observe(address, loop.time() - started)
        if res is not None and res.is_error:
            raise ServiceError(res.error_text or "")
        return res

    async def call_message(
        self,
        method: str,
        args: Any,
        *,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Message:
        """Call and return the response Message (payload not decoded; reply metadata)."""
        res = await self._execute(method, args, timeout, metadata, oneway=False)
        if res is None:
            raise RpcError("the server caller returned no response to a two-way call")
        return res

    async def call(
        self,
        method: str,
        args: Any,
        *,
        reply_type: Any = None,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        """Call ``service.method(args)`` and return the decoded reply (decoded as
        ``reply_type``: required for protobuf)."""
        res = await self.call_message(method, args, timeout=timeout, metadata=metadata)
        return self.codecs.get(res.serialize_type).decode(res.payload, reply_type)

    def go(self, method: str, args: Any, **kwargs: Any) -> asyncio.Task[Any]:
        """Start a call in the background; the task's result is the reply.
        Tasks still running at ``aclose()`` are cancelled."""
        task = asyncio.ensure_future(self.call(method, args, **kwargs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def oneway(
        self, method: str, args: Any, *, timeout: float | None = None, metadata: Mapping[str, str] | None = None
    ) -> None:
        """Send without waiting for a reply (the fail mode applies to sending)."""
        await self._execute(method, args, timeout, metadata, oneway=True)

    async def _execute(
        self, method: str, args: Any, timeout: float | None, metadata: Mapping[str, str] | None, *, oneway: bool
    ) -> Message | None:
        """One request to the server the selector picks, under the fail mode
        (retries, failover, backup) and one deadline for all its attempts."""
        request = self._request(method, args, metadata, oneway=oneway)
        deadline = self._deadline(timeout)
        pick = self._pick_for(method, request.payload)
        if self.plugins.call_hooks:
            return await execute(
                self.options.fail_mode, self._policy, pick,
                lambda addr: self._hooked_attempt(addr, request, deadline, args), deadline=deadline,
            )
        return await execute(
            self.options.fail_mode, self._policy, pick,
            lambda addr: self._attempt(addr, request, deadline), deadline=deadline,
        )

    async def _hooked_attempt(self, address: str, request: Message, deadline: float | None, args: Any) -> Message | None:
        """``_attempt`` between the plugins' ``pre_call`` and ``post_call``
        (each try has its own copy of the metadata for ``pre_call`` to change)."""
        call = CallInfo(service=request.service_path, method=request.service_method, address=address,
                        metadata=dict(request.metadata), oneway=request.oneway)
        await self.plugins.pre_call(call, args)
        req = dataclasses.replace(request, metadata=call.metadata)
        try:
            res = await self._attempt(address, req, deadline)
        except Exception as exc:
            await self.plugins.post_call(call, args, None, exc)
            raise
        await self.plugins.post_call(call, args, res, None)
        return res

    # -- file transfer and streams (rpcx's side channel: rpc.filetransfer, rpc.streams) --------
    # As in rpcx, the XClient's service is the file transfer (``_filetransfer``)
    # or stream (``_streamservice``) service.

    async def send_file(self, source: Any, **kwargs: Any) -> int:
        """Upload a file (rpcx's ``SendFile``); see ``rpc.filetransfer.send_file``."""
        from rpc.filetransfer import send_file

        return await send_file(self._side_call, source, serialize_type=self.options.serialize_type, **kwargs)

    async def download_file(self, name: str, dest: Any, **kwargs: Any) -> int:
        """Download a file into ``dest`` (rpcx's ``DownloadFile``); see ``rpc.filetransfer.download_file``."""
        from rpc.filetransfer import download_file

        return await download_file(self._side_call, name, dest, serialize_type=self.options.serialize_type,
                                   **kwargs)

    async def open_download(self, name: str, **kwargs: Any) -> ByteStream:
        """A download as a ``ByteStream`` to iterate; see ``rpc.filetransfer.open_download``."""
        from rpc.filetransfer import open_download

        return await open_download(self._side_call, name, serialize_type=self.options.serialize_type, **kwargs)

    async def open_stream(self, **kwargs: Any) -> ByteStream:
        """A raw connection to a server's stream service (rpcx's ``Stream``);
        see ``rpc.streams.open_stream``."""
        from rpc.streams import open_stream

        return await open_stream(self._side_call, serialize_type=self.options.serialize_type, **kwargs)

    async def _side_call(self, method: str, args: Any) -> Any:
        return await self.call(method, args)

    async def broadcast(
        self,
        method: str,
        args: Any,
        *,
        reply_type: Any = None,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Call every server once (no retries); all must succeed. Returns
        address → reply; raises ``BroadcastError`` (with every error and the
        replies that did arrive) otherwise."""
        calls = self._to_every_server(method, args, timeout, metadata, reply_type)
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
        replies: dict[str, Any] = {}
        errors: dict[str, BaseException] = {}
        for addr, r in zip(calls, results, strict=True):
            if isinstance(r, BaseException):
                if isinstance(r, asyncio.CancelledError):
                    raise r
                errors[addr] = r
            else:
                replies[addr] = r
        if errors:
            raise BroadcastError(errors, replies)
        return replies

    async def fork(
        self,
        method: str,
        args: Any,
        *,
        reply_type: Any = None,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        """Call every server at once; the first success wins (the others are
        cancelled). When all fail, the last error is raised."""
        calls = self._to_every_server(method, args, timeout, metadata, reply_type)
        pending = {asyncio.ensure_future(c) for c in calls.values()}
        last: BaseException | None = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    if fut.exception() is None:
                        return fut.result()
                    last = fut.exception()
            assert last is not None
            raise last
        finally:
            for fut in pending:
                fut.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def inform(
        self,
        method: str,
        args: Any,
        *,
        reply_type: Any = None,
        timeout: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[Receipt]:
        """Call every server once (no retries) and return every server's
        ``Receipt``, successes and failures alike, in server order: rpcx's
        ``XClient.Inform``. Nothing is raised for a server's failure (see
        each receipt's ``error``); ``NoServerAvailable`` when there is no
        server. Cancelling it cancels every call."""
        calls = self._to_every_server(method, args, timeout, metadata, reply_type)
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
        receipts: list[Receipt] = []
        for addr, r in zip(calls, results, strict=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            address = addr.partition("@")[2] or addr
            receipts.append(Receipt(address, error=r) if isinstance(r, BaseException) else Receipt(address, reply=r))
        return receipts

    def _to_every_server(
        self, method: str, args: Any, timeout: float | None, metadata: Mapping[str, str] | None, reply_type: Any
    ) -> dict[str, Coroutine[Any, Any, Any]]:
        """Address → the not yet started call of one request to that server
        (broadcast, fork and inform): one attempt each, no retries, one deadline."""
        request = self._request(method, args, metadata, oneway=False)
        deadline = self._deadline(timeout)
        addrs = sorted(self._servers)
        if not addrs:
            raise NoServerAvailable(f"no server for service {self.service}")
        return {addr: self._one(addr, request, deadline, reply_type, args) for addr in addrs}

    async def _one(self, addr: str, request: Message, deadline: float | None, reply_type: Any, args: Any) -> Any:
        if self.plugins.call_hooks:
            def attempt() -> Coroutine[Any, Any, Message | None]:
                return self._hooked_attempt(addr, request, deadline, args)
        else:
            def attempt() -> Coroutine[Any, Any, Message | None]:
                return self._attempt(addr, request, deadline)
        try:
            if deadline is None:
                res = await attempt()
            else:
                async with asyncio.timeout_at(deadline):
                    res = await attempt()
        except TimeoutError as exc:
            if isinstance(exc, CallTimeout):
                raise
            raise CallTimeout("call deadline exceeded") from None
        assert res is not None
        return self.codecs.get(res.serialize_type).decode(res.payload, reply_type)
