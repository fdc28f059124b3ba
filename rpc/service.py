"""The service layer: registered Python services and the request dispatcher.

This is the server's protocol logic without I/O. ``ServiceDispatcher`` turns a
request ``Message`` into an ``Outcome`` (the response to write, if any, and
whether to close the connection); the transport (``rpc.transport``) owns the
sockets and drives one ``ServerSession`` per connection::

    session = dispatcher.session(peer)
    if not await session.accept():         # on_conn_accept hooks (conn rate limit)
        close()
    ...
    outcome = await session.handle(msg)    # post_read, heartbeat, auth, call, pre_write
    if outcome.reply is not None:
        write(outcome.reply); await session.written(msg, outcome.reply)
    if outcome.close:
        close()
    ...
    await session.close()                  # on_conn_close hooks

Handlers are methods ``async def Method(self, ctx, args) -> reply`` or plain
``def Method(self, ctx, args)``. A sync handler runs in a bounded thread pool,
or inline on the event loop when marked ``@fast`` (for handlers that never
block). ``args`` is decoded from the payload by the request's serialize type
and the annotation of the parameter (see ``rpc.transport.codec``); the reply is encoded
the same way.

Deadline: ``__ServerTimeout`` (milliseconds) sets ``ctx.deadline``; an async
handler still running then is cancelled and the client gets an error
(``HandlerTimeout``). A sync handler in the pool cannot be interrupted: the
client gets the error at the deadline and the thread finishes in the
background (its result is dropped).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import itertools
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rpc.transport.codec import CodecRegistry, Decoder
from rpc.errors import (
    AuthFailed,
    CodecError,
    HandlerTimeout,
    RpcError,
    ServerClosing,
    ServiceError,
    UnknownMethod,
    UnknownService,
)
from rpc.message import (
    META_AUTH,
    META_SERVER_TIMEOUT,
    Message,
    MessageStatus,
    MessageType,
    SerializeType,
)
from rpc.plugins.container import PluginContainer

log = logging.getLogger("rpc.service")

_conn_ids = itertools.count(1)


def fast(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a sync handler as non-blocking: it runs inline on the event loop
    instead of in the thread pool (cheaper; it must never block)."""
    func.__rpc_inline__ = True  # type: ignore[attr-defined]
    return func


@dataclass(slots=True, eq=False)
class Peer:
    """One connected client, as the service layer sees it.

    ``send`` is filled by the transport: it writes a message to this
    connection (used for server push); None when pushing is not possible.
    """

    address: str = ""
    conn_id: int = field(default_factory=lambda: next(_conn_ids))
    local_address: str = ""
    send: Callable[[Message], Awaitable[None]] | None = None


class Context:
    """Per-request context given to handlers and plugins.

    - ``metadata``: the request's metadata (read it; do not mutate).
    - ``reply_metadata``: metadata to send back with the reply.
    - ``deadline``: ``loop.time()`` at which the request expires, or None.
    - ``peer``: the connection the request came from.
    """

    __slots__ = (
        "service", "method", "seq", "metadata", "reply_metadata", "deadline", "peer",
        "serialize_type", "started", "values", "_codecs",
    )

    def __init__(
        self,
        service: str,
        method: str,
        *,
        seq: int = 0,
        metadata: dict[str, str] | None = None,
        deadline: float | None = None,
        peer: Peer | None = None,
        serialize_type: SerializeType = SerializeType.JSON,
        codecs: CodecRegistry | None = None,
    ) -> None:
        self.service = service
        self.method = method
        self.seq = seq
        self.metadata: dict[str, str] = metadata if metadata is not None else {}
        self.reply_metadata: dict[str, str] = {}
        self.deadline = deadline
        self.peer = peer
        self.serialize_type = serialize_type
        self.started = time.perf_counter()
        self.values: dict[str, Any] | None = None  # per-request plugin state, created on demand
        self._codecs = codecs

    def remaining(self) -> float | None:
        """Seconds until the deadline (may be negative), None without deadline."""
        if self.deadline is None:
            return None
        return self.deadline - asyncio.get_running_loop().time()

    async def push(
        self,
        service: str,
        method: str,
        args: Any,
        *,
        serialize_type: SerializeType | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Server push: send a oneway request to the client of this request."""
        if self.peer is None or self.peer.send is None:
            raise RpcError("this connection does not support server push")
        st = self.serialize_type if serialize_type is None else serialize_type
        codecs = self._codecs or CodecRegistry()
        msg = Message(
            message_type=MessageType.REQUEST,
            oneway=True,
            serialize_type=st,
            service_path=service,
            service_method=method,
            metadata=dict(metadata or {}),
            payload=codecs.get(st).encode(args),
        )
        await self.peer.send(msg)

    def __repr__(self) -> str:
        return f"<Context {self.service}.{self.method} seq={self.seq}>"


@dataclass(slots=True, eq=False)
class MethodSpec:
    name: str
    func: Callable[..., Any]
    is_async: bool
    inline: bool
    arg_type: Any
    decoders: dict[int, Decoder] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Service:
    name: str
    obj: object
    methods: dict[str, MethodSpec]
    metadata: str = ""


def _arg_annotation(func: Callable[..., Any], param: inspect.Parameter) -> Any:
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: fall back to "as decoded"
        hints = {}
    ann = hints.get(param.name, param.annotation)
    return None if ann is inspect.Parameter.empty else ann


def _method_spec(name: str, func: Callable[..., Any]) -> MethodSpec | None:
    """A MethodSpec when ``func`` (bound) has the handler shape ``(ctx, args)``."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    params = [
        p for p in sig.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) != 2 or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return None
    target = getattr(func, "__func__", func)
    return MethodSpec(
        name=name,
        func=func,
        is_async=inspect.iscoroutinefunction(func),
        inline=bool(getattr(target, "__rpc_inline__", False)),
        arg_type=_arg_annotation(func, params[1]),
    )


class ServiceRegistry:
    """Services by name. Registration happens before serving (not thread-safe)."""

    def __init__(self) -> None:
        self._services: dict[str, Service] = {}

    def register(
        self, obj: object, name: str | None = None, metadata: str = "", *, methods: Iterable[str] | None = None
    ) -> Service:
        """Register an object (or a class, instantiated without arguments).

        Every public method with the handler shape ``(ctx, args)`` is exported
        under its own name; ``name`` defaults to the class name. ``metadata``
        is the rpcx service metadata published to registries (``weight=3&...``).
        ``methods``, when given, is an allow-list: only these methods are
        exported, a call to any other gets ``rpcx: can't find method X``; a
        name that is not such a method raises ``ValueError`` naming it.
        """
        if isinstance(methods, str):
            raise TypeError("methods must be a list of method names, not a string")
        allowed = None if methods is None else list(dict.fromkeys(methods))
        if allowed is not None and not allowed:
            raise ValueError("methods= is empty: a service needs at least one method")
        if isinstance(obj, type):
            obj = obj()
        sname = name or type(obj).__name__
        if not sname:
            raise ValueError("a service needs a name")
        if sname in self._services:
            raise ValueError(f"service {sname!r} is already registered")
        exported: dict[str, MethodSpec] = {}
        for attr in dir(type(obj)):
            if attr.startswith("_"):
                continue
            func = getattr(obj, attr, None)
            if not callable(func) or isinstance(func, type):
                continue
            spec = _method_spec(attr, func)
            if spec is not None:
                exported[attr] = spec
        if not exported:
            raise ValueError(f"{type(obj).__name__} has no method of the shape Method(self, ctx, args)")
        if allowed is not None:
            unknown = [m for m in allowed if m not in exported]
            if unknown:
                raise ValueError(
                    f"{type(obj).__name__} has no method {', '.join(unknown)} of the shape Method(self, ctx, args)"
                )
            exported = {m: exported[m] for m in allowed}
        service = Service(sname, obj, exported, metadata)
        self._services[sname] = service
        return service

    def register_function(
        self, service: str, func: Callable[..., Any], name: str | None = None, metadata: str = ""
    ) -> MethodSpec:
        """Register a plain function ``f(ctx, args)`` as ``service.name``."""
        mname = name or func.__name__
        spec = _method_spec(mname, func)
        if spec is None:
            raise ValueError(f"{mname} does not have the shape f(ctx, args)")
        svc = self._services.get(service)
        if svc is None:
            svc = self._services[service] = Service(service, None, {}, metadata)
        if mname in svc.methods:
            raise ValueError(f"{service}.{mname} is already registered")
        svc.methods[mname] = spec
        return spec

    def unregister(self, name: str) -> None:
        self._services.pop(name)

    def get(self, name: str) -> Service | None:
        return self._services.get(name)

    @property
    def services(self) -> dict[str, Service]:
        return dict(self._services)


@dataclass(slots=True)
class Outcome:
    """What the transport must do after a request: write ``reply`` (if any),
    then close the connection if ``close``."""

    reply: Message | None = None
    close: bool = False


_NOTHING = Outcome()
_LOOK_UP: Any = object()  # _request's service not looked up yet


class ServiceDispatcher:
    """Request → response for the registered services, with plugins.

    ``max_sync_workers`` bounds the thread pool of sync handlers;
    ``handler_timeout`` (seconds) applies to requests without
    ``__ServerTimeout``. Call ``aclose()`` to stop the pool.
    """

    def __init__(
        self,
        registry: ServiceRegistry | None = None,
        *,
        plugins: PluginContainer | None = None,
        codecs: CodecRegistry | None = None,
        max_sync_workers: int = 32,
        handler_timeout: float | None = None,
    ) -> None:
        if max_sync_workers < 1:
            raise ValueError("max_sync_workers must be >= 1")
        if handler_timeout is not None and handler_timeout <= 0:
            raise ValueError("handler_timeout must be > 0 or None")
        self.registry = registry or ServiceRegistry()
        self.plugins = plugins or PluginContainer()
        self.codecs = codecs or CodecRegistry()
        self.handler_timeout = handler_timeout
        self._max_workers = max_sync_workers
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self.closing = False

    # -- lifecycle ------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests being handled right now (dispatch started, outcome not returned)."""
        return self._in_flight

    def begin_shutdown(self) -> None:
        """New requests get an error ("server is shutting down"); in-flight ones finish."""
        self.closing = True

    async def drain(self, timeout: float | None) -> bool:
        """Wait until no request is in flight; False if ``timeout`` passed
        first or :meth:`abort_drain` was called."""
        if self._in_flight == 0:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                while self._in_flight:
                    if self._drain_aborted:
                        return False
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def abort_drain(self) -> None:
        """End a :meth:`drain` in progress at once (a second Ctrl-C)."""
        self._drain_aborted = True
        if self._idle is not None:
            self._idle.set()

    _drain_aborted = False

    async def aclose(self) -> None:
        """Stop the thread pool (does not wait for running sync handlers). Idempotent."""
        self.closing = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def session(self, peer: Peer | None = None) -> ServerSession:
        return ServerSession(self, peer or Peer())

    # -- dispatch ---------------------------------------------------------------

    async def dispatch(self, msg: Message, peer: Peer | None = None) -> Outcome:
        """Handle one decoded request. Never raises for a bad request: errors
        become error replies (or a close for failed auth)."""
        if msg.message_type != MessageType.REQUEST:
            return _NOTHING  # responses to our pushes are not expected (pushes are oneway)
        if peer is None:
            peer = Peer()
        if msg.heartbeat:
            return await self._request(msg, peer)
        self._in_flight += 1
        try:
            return await self._request(msg, peer)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle is not None:
                self._idle.set()

    def dispatch_now(self, msg: Message, peer: Peer) -> Outcome | None:
        """The whole request without awaiting, when nothing on its path can
        wait: the method is a ``@fast`` sync handler (or does not exist) and
        every hook of the request's steps is a plain method
        (``plugins.request_path_sync``). Returns None, having run nothing, when
        the request needs ``dispatch()``. Heartbeats always go to ``dispatch``.
        ``post_write`` hooks are the transport's to run (``ServerSession.written``).

        It runs the same request path as :meth:`dispatch`, to its end in one
        step: with those conditions that coroutine never suspends."""
        if msg.heartbeat or msg.message_type != MessageType.REQUEST:
            return None
        if not self.plugins.request_path_sync:
            return None
        service = self.registry.get(msg.service_path)
        spec = service.methods.get(msg.service_method) if service is not None else None
        if spec is not None and (spec.is_async or not spec.inline):
            return None
        path = self._request(msg, peer, service, spec)
        try:
            path.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        path.close()  # it waited for something: the conditions above missed a case
        raise RuntimeError(f"{msg.service_path}.{msg.service_method}: the request path suspended in dispatch_now")

    def _context(self, msg: Message, peer: Peer) -> Context:
        """The handler's context of one request. Its deadline: the client's
        ``__ServerTimeout`` (ms) when positive, else the server's
        ``handler_timeout``; a timeout that is not a number is no deadline."""
        metadata = msg.metadata
        deadline = None
        raw_timeout = metadata.get(META_SERVER_TIMEOUT) if metadata else None
        if raw_timeout is not None:
            try:
                ms = int(raw_timeout)
            except ValueError:
                ms = 0
            if ms > 0:
                deadline = asyncio.get_running_loop().time() + ms / 1000.0
        elif self.handler_timeout is not None:
            deadline = asyncio.get_running_loop().time() + self.handler_timeout
        return Context(
            msg.service_path,
            msg.service_method,
            seq=msg.seq,
            metadata=metadata,
            deadline=deadline,
            peer=peer,
            serialize_type=msg.serialize_type,
            codecs=self.codecs,
        )

    async def _request(self, msg: Message, peer: Peer, service: Any = _LOOK_UP,
                       spec: MethodSpec | None = None) -> Outcome:
        """The request path, written once: post_read, heartbeat, authenticate,
        decode, pre_call, the handler, post_call, encode, pre_write. Its awaits
        suspend only for an async hook or handler, so :meth:`dispatch_now`
        runs it to its end in one step when there is none (and passes the
        service and method it has looked up already)."""
        plugins = self.plugins
        if plugins._post_read:
            try:
                await plugins.run("post_read", peer, msg)
            except Exception as exc:
                return self._error_outcome(msg, exc)
        if msg.heartbeat:
            if plugins._on_heartbeat:
                await plugins.run_logged("on_heartbeat", peer, msg)
            return Outcome(msg.heartbeat_reply())
        ctx = self._context(msg, peer)
        metadata = ctx.metadata
        if plugins._authenticate:
            if not await plugins.all_true("authenticate", ctx, metadata.get(META_AUTH)):
                reply = None if msg.oneway else msg.error_reply("auth failed")
                return Outcome(reply, close=True)
        if self.closing:
            return self._error_outcome(msg, ServerClosing("server is shutting down"))

        args: Any = None
        reply_obj: Any = None
        error: BaseException | None = None
        try:
            if service is _LOOK_UP:
                service = self.registry.get(msg.service_path)
                spec = service.methods.get(msg.service_method) if service is not None else None
            if service is None:
                raise UnknownService(msg.service_path)
            if spec is None:
                raise UnknownMethod(msg.service_method)
            codec = self.codecs.get(msg.serialize_type)
            decoder = spec.decoders.get(msg.serialize_type)
            if decoder is None:
                decoder = spec.decoders[msg.serialize_type] = codec.decoder_for(spec.arg_type)
            args = decoder(msg.payload)
            if plugins._pre_call:
                await plugins.run("pre_call", ctx, args)
            if spec.inline and not spec.is_async:
                reply_obj = spec.func(ctx, args)
            else:
                reply_obj = await self._invoke(spec, ctx, args)
            payload = b"" if msg.oneway else codec.encode(reply_obj)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc
        if plugins._post_call:
            try:
                await plugins.run("post_call", ctx, args, None if error else reply_obj, error)
            except Exception as exc:
                error = error or exc
        if error is not None:
            return self._handler_failed(msg, error, ctx)
        if msg.oneway:
            return _NOTHING
        res = msg.reply(payload, ctx.reply_metadata)
        if plugins._pre_write:
            try:
                await plugins.run("pre_write", ctx, msg, res)
            except Exception as exc:
                return self._error_outcome(msg, exc, ctx)
        return Outcome(res)

    async def _invoke(self, spec: MethodSpec, ctx: Context, args: Any) -> Any:
        deadline = ctx.deadline
        if spec.is_async:
            if deadline is None:
                return await spec.func(ctx, args)
            cm = asyncio.timeout_at(deadline)
            try:
                async with cm:
                    return await spec.func(ctx, args)
            except TimeoutError:
                if cm.expired():
                    raise HandlerTimeout(
                        f"{ctx.service}.{ctx.method}: deadline exceeded ({ctx.metadata.get(META_SERVER_TIMEOUT, '')} ms)"
                    ) from None
                raise
        if self._executor is None:  # a sync handler not marked inline: a thread runs it
            if self.closing:
                raise ServerClosing("server is shutting down")
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="rpc-handler"
            )
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, functools.partial(spec.func, ctx, args))
        if deadline is None:
            return await fut
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(fut)
        except TimeoutError:
            if fut.done():
                return fut.result()
            fut.cancel()  # drops the result; a running thread finishes on its own
            raise HandlerTimeout(
                f"{ctx.service}.{ctx.method}: deadline exceeded ({ctx.metadata.get(META_SERVER_TIMEOUT, '')} ms)"
            ) from None

    def _handler_failed(self, msg: Message, error: BaseException, ctx: Context) -> Outcome:
        """The reply to a request whose decode, handler or hooks raised; an
        error that is not an ``RpcError`` is a bug in the handler: logged."""
        if not isinstance(error, (RpcError, CodecError)):
            log.error("%s.%s raised", msg.service_path, msg.service_method, exc_info=error)
        return self._error_outcome(msg, error, ctx)

    def _error_outcome(self, msg: Message, exc: BaseException, ctx: Context | None = None) -> Outcome:
        if msg.oneway:
            return _NOTHING
        text = exc.text if isinstance(exc, ServiceError) else str(exc) or type(exc).__name__
        res = msg.error_reply(text, ctx.reply_metadata if ctx is not None else None)
        return Outcome(res, close=isinstance(exc, AuthFailed))


class ServerSession:
    """The hooks of one connection, in rpcx's order; driven by the transport."""

    __slots__ = ("dispatcher", "peer", "closed")

    def __init__(self, dispatcher: ServiceDispatcher, peer: Peer) -> None:
        self.dispatcher = dispatcher
        self.peer = peer
        self.closed = False

    async def accept(self) -> bool:
        """``on_conn_accept`` hooks: False means close the connection now."""
        plugins = self.dispatcher.plugins
        if not plugins._on_conn_accept:
            return True
        return await plugins.all_true("on_conn_accept", self.peer)

    async def before_read(self) -> None:
        """``pre_read`` hooks (raise → close the connection)."""
        if self.dispatcher.plugins._pre_read:
            await self.dispatcher.plugins.run("pre_read", self.peer)

    async def handle(self, msg: Message) -> Outcome:
        return await self.dispatcher.dispatch(msg, self.peer)

    async def written(self, req: Message, res: Message, error: BaseException | None = None) -> None:
        """``post_write`` hooks, after the transport wrote ``res`` (or failed to)."""
        if self.dispatcher.plugins._post_write:
            await self.dispatcher.plugins.run_logged("post_write", self.peer, req, res, error)

    async def close(self) -> None:
        """``on_conn_close`` hooks. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.dispatcher.plugins._on_conn_close:
            await self.dispatcher.plugins.run_logged("on_conn_close", self.peer)


def response_status_error(res: Message) -> ServiceError | None:
    """The ServiceError carried by an error response (None for a normal one)."""
    if res.status != MessageStatus.ERROR:
        return None
    return ServiceError(res.error_text or "")
