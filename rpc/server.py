"""The RPC server's front object: services, plugins, registry publication and
graceful shutdown in rpcx's order.

The network side (accepting TCP/unix connections, framing, the rpcx codec)
is ``rpc.rpcx_server.RpcxServer`` over ``rpc.transport``; it plugs in
through ``Listener``::

    server = Server(registrars=[RedisRegistrar(url)])
    server.register(Arith(), metadata="weight=2")
    listener = RpcxServer(server, "tcp@0.0.0.0:8972"); await listener.start()
    await server.publish("tcp@10.0.0.5:8972")       # announce every service
    ...
    await server.shutdown(listener, timeout=10)     # see below

``shutdown`` runs, in order: (1) unregister from every registry, so clients
stop choosing this server; (2) ``listener.stop_accepting()``; (3) new
requests on open connections are refused with "server is shutting down" and
in-flight requests are drained up to ``timeout``; (4)
``listener.close_connections()``, and attached side listeners (file
transfer, streams: ``attach``) close; (5) the dispatcher's thread pool stops.
It is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from rpc.transport.codec import CodecRegistry
from rpc.discovery.base import Registrar
from rpc.errors import RegistryError
from rpc.plugins.container import PluginContainer
from rpc.service import Service, ServiceDispatcher, ServiceRegistry

log = logging.getLogger("rpc.server")


class Listener(Protocol):
    """What shutdown needs from the transport's server side."""

    async def stop_accepting(self) -> None: ...

    async def close_connections(self) -> None: ...


class Server:
    def __init__(
        self,
        *,
        plugins: Iterable[object] = (),
        codecs: CodecRegistry | None = None,
        registrars: Iterable[Registrar] = (),
        max_sync_workers: int = 32,
        handler_timeout: float | None = None,
    ) -> None:
        self.registry = ServiceRegistry()
        self.plugins = PluginContainer(list(plugins))
        self.dispatcher = ServiceDispatcher(
            self.registry,
            plugins=self.plugins,
            codecs=codecs,
            max_sync_workers=max_sync_workers,
            handler_timeout=handler_timeout,
        )
        self.registrars = list(registrars)
        self.address: str | None = None
        self._published: list[tuple[Registrar, str, str]] = []
        self._shutdown: asyncio.Task[bool] | None = None
        #: listeners beside the rpcx one (file transfer, streams): see ``attach``
        self.attached: list[Any] = []

    # -- services ---------------------------------------------------------------

    def register(
        self, obj: object, name: str | None = None, metadata: str = "", *, methods: Iterable[str] | None = None
    ) -> Service:
        """Register a service object (or class); ``methods`` is an allow-list of
        the methods exported (default: all); see ``ServiceRegistry.register``."""
        return self.registry.register(obj, name, metadata, methods=methods)

    def register_function(self, service: str, func: Callable[..., Any], name: str | None = None, metadata: str = "") -> None:
        self.registry.register_function(service, func, name, metadata)

    def add_plugin(self, plugin: object) -> None:
        self.plugins.add(plugin)

    def attach(self, listener: Any) -> None:
        """Tie a side listener (``rpc.sidechannel.SideListener``: file
        transfer, streams) to this server's lifecycle: ``shutdown`` closes it
        (port, then running transfers within its drain timeout) after the
        requests drained; whoever starts the main listener starts it
        (``juggler rpc serve`` does)."""
        self.attached.append(listener)

    # -- registry publication ------------------------------------------------------

    async def publish(self, address: str) -> None:
        """Announce every registered service at ``address`` (``tcp@host:port``)
        on every registrar."""
        self.address = address
        for registrar in self.registrars:
            for service in self.registry.services.values():
                await registrar.register(service.name, address, service.metadata)
                self._published.append((registrar, service.name, address))

    async def unpublish(self) -> None:
        """Remove every announcement (errors are logged: shutdown goes on)."""
        published, self._published = self._published, []
        for registrar, service, address in published:
            try:
                await registrar.unregister(service, address)
            except (RegistryError, OSError) as exc:
                log.warning("cannot unregister %s at %s: %s", service, address, exc)

    # -- lifecycle -----------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self.dispatcher.in_flight

    async def shutdown(self, listener: Listener | None = None, timeout: float = 10.0) -> bool:
        """Graceful shutdown in rpcx's order (module doc). True when every
        in-flight request finished within ``timeout``. Idempotent; concurrent
        callers share the same shutdown."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._do_shutdown(listener, timeout))
        return await asyncio.shield(self._shutdown)

    async def _do_shutdown(self, listener: Listener | None, timeout: float) -> bool:
        await self.unpublish()
        if listener is not None:
            await listener.stop_accepting()
        self.dispatcher.begin_shutdown()
        drained = await self.dispatcher.drain(timeout)
        if not drained:
            log.warning("shutdown: %d request(s) still in flight after %.1fs", self.in_flight, timeout)
        if listener is not None:
            await listener.close_connections()
        if self.attached:  # after the drain: a token issued by a drained call can still be used
            await asyncio.gather(*(side.close_connections() for side in self.attached))
        for registrar in self.registrars:
            try:
                await registrar.aclose()
            except Exception:
                log.exception("closing registrar failed")
        await self.dispatcher.aclose()
        return drained


def load_app(spec: str, server: Server) -> None:
    """Load ``module:object`` into ``server``.

    ``object`` may be a service object or class (registered under its class
    name), a function ``f(server)`` that registers what it wants, or a
    ``dict`` name → service object. ``module:object.attr`` paths work.
    """
    import inspect

    from rustext.appspec import import_object

    obj = import_object(spec)
    if isinstance(obj, dict):
        for name, service in obj.items():
            server.register(service, name)
    elif inspect.isfunction(obj):
        obj(server)
    else:
        server.register(obj)
