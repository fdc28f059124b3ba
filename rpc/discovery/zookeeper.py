"""ZooKeeper registry, wire-compatible with Go rpcx's rpcx-zookeeper plugin
(``ZooKeeperRegisterPlugin`` / ``ZookeeperDiscovery`` over rpcxio/libkv's
zookeeper store).

Layout (``base`` defaults to ``/rpcx``)::

    /rpcx                              persistent  "rpcx_path"   (its parents: empty)
    /rpcx/Arith                        persistent  "Arith"       (the service name)
    /rpcx/Arith/tcp@10.0.0.5:8972      ephemeral   "weight=2&group=canary"

- ``ZooKeeperRegistrar`` (server): creates the base and service nodes as the
  Go plugin does, replaces the address node with an ephemeral one holding the
  metadata, and at shutdown deletes it and closes its session. The node lives
  as long as the session: a crashed server's node goes when ZooKeeper expires
  its session (``ttl`` = the session timeout asked for; the server bounds it).
  Every ``heartbeat`` and at once after a new session, a node found missing
  (its session expired) is created again, as the Go plugin's refresh does.
- ``ZooKeeperDiscovery`` (client): lists the children of ``{base}/{service}``
  and reads each one's data; a children watch (or, before the service node
  exists, an exists watch) re-reads at once on every registration and
  removal; a data change (``state=inactive``) is seen by the re-read every
  ``refresh_interval`` seconds.

kazoo runs the session in its own threads; ``ZooKeeperSession`` hands its
results and watch events to the event loop, so no coroutine blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import EventType, WatchedEvent

from rpc.discovery.base import WatchingDiscovery, heartbeat_loop, stop_heartbeat_and_unregister
from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable

log = logging.getLogger("rpc.discovery.zookeeper")

#: data of the base node, as the Go plugin writes it
BASE_NODE_DATA = b"rpcx_path"

#: how kazoo reconnects: for ever, at most this many seconds apart (its default grows to an hour)
RECONNECT_MAX_DELAY = 5.0


def base_path(base: str) -> str:
    """``base`` as a ZooKeeper path: ``/`` in front, none behind (the Go
    plugin takes ``rpcx`` and ``/rpcx`` alike)."""
    path = "/" + base.strip("/")
    if path == "/":
        raise ValueError("the ZooKeeper base path must name a node, e.g. /rpcx (not the root)")
    if "//" in path:
        raise ValueError(f"bad ZooKeeper base path {base!r}: empty segment")
    return path


def _threadsafe(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    """Run ``fn`` on ``loop`` from a kazoo thread; dropped once the loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _settle(fut: asyncio.Future[Any], result: Any) -> None:
    if fut.done():
        return
    try:
        fut.set_result(result.get_nowait())
    except Exception as exc:  # noqa: BLE001 - the call's own error, raised where it is awaited
        fut.set_exception(exc)


class ZooKeeperSession:
    """One kazoo client (one ZooKeeper session) used from asyncio.

    ``hosts`` is kazoo's ``HOST:PORT[,HOST:PORT…]``. The session is opened on
    the first ``call`` and kazoo keeps reconnecting (a new session after an
    expiry) until ``aclose``. Each call waits at most ``timeout`` seconds;
    cancelling one only drops its result. ``on_state`` is called on the event
    loop with each new kazoo state (``CONNECTED``, ``SUSPENDED``, ``LOST``).
    """

    def __init__(self, hosts: str, *, session_timeout: float = 10.0, timeout: float = 5.0,
                 on_state: Callable[[str], None] | None = None) -> None:
        hosts = hosts.strip()
        if not hosts or "/" in hosts or "://" in hosts:
            raise ValueError(f"ZooKeeper hosts must be HOST:PORT[,HOST:PORT…], got {hosts!r}")
        if session_timeout <= 0 or timeout <= 0:
            raise ValueError("session_timeout and timeout must be > 0")
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.timeout = timeout
        self.on_state = on_state
        self._zk: KazooClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def session_id(self) -> int | None:
        """The id of the current session (the ``ephemeralOwner`` of its nodes), None when not connected."""
        zk = self._zk
        if zk is None or not zk.connected or zk.client_id is None:
            return None
        return int(zk.client_id[0])

    def _state_changed(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if self.on_state is not None:
            self.on_state(state)

    async def _client(self) -> KazooClient:
        if self._zk is not None and self._connected.is_set():
            return self._zk
        async with self._lock:
            if self._zk is None:
                loop = self._loop = asyncio.get_running_loop()
                zk = KazooClient(
                    hosts=self.hosts, timeout=self.session_timeout,
                    connection_retry={"max_tries": -1, "max_delay": RECONNECT_MAX_DELAY},
                )
                zk.add_listener(lambda state: _threadsafe(loop, self._state_changed, state))
                self._zk = zk
                zk.start_async()
            changed = asyncio.ensure_future(self._connected.wait())
            try:
                await asyncio.wait((changed,), timeout=self.timeout)
            finally:
                changed.cancel()
            if not self._connected.is_set():
                raise RegistryUnavailable(f"zookeeper {self.hosts}: not connected within {self.timeout:g} s")
            return self._zk

    async def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """kazoo's ``{op}_async(*args, **kwargs)``, awaited. ``NoNodeError`` and
        ``NodeExistsError`` pass through for the caller to handle; the rest
        become ``RegistryUnavailable`` (connection) or ``RegistryError``."""
        zk = await self._client()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        try:
            result = getattr(zk, f"{op}_async")(*args, **kwargs)
            result.rawlink(lambda r: _threadsafe(loop, _settle, fut, r))
            await asyncio.wait((fut,), timeout=self.timeout)
            if not fut.done():
                raise RegistryUnavailable(f"zookeeper {self.hosts}: no answer to {op} within {self.timeout:g} s")
            return fut.result()
        except (NoNodeError, NodeExistsError):
            raise
        except (ConnectionLoss, SessionExpiredError, ConnectionClosedError) as exc:
            raise RegistryUnavailable(f"zookeeper {self.hosts}: {type(exc).__name__}") from exc
        except KazooException as exc:
            raise RegistryError(f"zookeeper {op} {args[0] if args else ''}: {type(exc).__name__} {exc}") from exc
        finally:
            fut.cancel()

    def watcher(self, fut: asyncio.Future[WatchedEvent]) -> Callable[[WatchedEvent], None]:
        """A kazoo watch function that completes ``fut`` (once) with its event."""
        loop = asyncio.get_running_loop()

        def fire(event: WatchedEvent) -> None:
            if not fut.done():
                fut.set_result(event)

        return lambda event: _threadsafe(loop, fire, event)

    async def aclose(self) -> None:
        """Close the session (its ephemeral nodes go at once) and kazoo's threads. Idempotent."""
        zk, self._zk = self._zk, None
        self._connected.clear()
        if zk is not None:
            await asyncio.to_thread(zk.stop)
            zk.close()


class ZooKeeperRegistrar:
    """Server side: an ephemeral node per (service, address) in one session."""

    def __init__(self, hosts: str, *, base: str = "/rpcx", ttl: float = 10.0, heartbeat: float | None = None,
                 timeout: float = 5.0) -> None:
        if ttl <= 0:
            raise ValueError("ttl (the ZooKeeper session timeout) must be > 0")
        self.base = base_path(base)
        self.ttl = ttl
        self.heartbeat = heartbeat if heartbeat is not None else ttl / 3
        if self.heartbeat <= 0:
            raise ValueError("heartbeat must be > 0")
        self.session = ZooKeeperSession(hosts, session_timeout=ttl, timeout=timeout, on_state=self._on_state)
        self._entries: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._reconnected = asyncio.Event()
        self._closed = False

    def node(self, service: str, address: str) -> str:
        """The path of (service, address)'s node."""
        return f"{self.base}/{service}/{address}"

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._reconnected.set()  # possibly a new session: check the nodes now

    async def _put_dirs(self, service: str) -> None:
        """The base and service nodes, persistent, with the Go plugin's data."""
        await self.session.call("ensure_path", self.base)
        await self.session.call("set", self.base, BASE_NODE_DATA)
        path = f"{self.base}/{service}"
        try:
            await self.session.call("create", path, service.encode())
        except NodeExistsError:
            await self.session.call("set", path, service.encode())

    async def _create(self, service: str, address: str, metadata: str) -> None:
        await self.session.call("create", self.node(service, address), metadata.encode(), ephemeral=True)

    async def register(self, service: str, address: str, metadata: str = "") -> None:
        if self._closed:
            raise RegistryError("registrar is closed")
        if not service.strip() or "/" in service or "/" in address:
            raise ValueError(f"service and address must be non-empty node names, got {service!r} {address!r}")
        async with self._lock:
            await self._put_dirs(service)
            # as the Go plugin: a node left by an earlier session of this address is replaced
            with contextlib.suppress(NoNodeError):
                await self.session.call("delete", self.node(service, address))
            try:
                await self._create(service, address, metadata)
            except NodeExistsError as exc:
                raise RegistryError(f"zookeeper node {self.node(service, address)} was created meanwhile by "
                                    "another session (is another server registering this address?)") from exc
            self._entries[(service, address)] = metadata
        if self._task is None:
            self._task = asyncio.create_task(
                heartbeat_loop(self.heartbeat, self.restore, "zookeeper heartbeat", log, wake=self._reconnected),
                name="zookeeper-registrar-heartbeat")

    async def unregister(self, service: str, address: str) -> None:
        self._entries.pop((service, address), None)
        with contextlib.suppress(NoNodeError):
            await self.session.call("delete", self.node(service, address))

    async def restore(self) -> int:
        """Create again the nodes that are missing (their session expired); the number created."""
        created = 0
        async with self._lock:
            for (service, address), metadata in list(self._entries.items()):
                if await self.session.call("exists", self.node(service, address)) is not None:
                    continue
                try:
                    await self._put_dirs(service)
                    await self._create(service, address, metadata)
                except NodeExistsError:
                    continue
                created += 1
                log.warning("zookeeper node %s was gone (session expired?): registered again",
                            self.node(service, address))
        return created

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        await stop_heartbeat_and_unregister(self, task, list(self._entries), log)
        await self.session.aclose()


class ZooKeeperDiscovery(WatchingDiscovery):
    """Client side: the servers of ``service``, the children of ``{base}/{service}``."""

    def __init__(
        self,
        hosts: str,
        service: str,
        *,
        base: str = "/rpcx",
        refresh_interval: float = 0.5,
        cache: FileCache | None = None,
        session_timeout: float = 10.0,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(refresh_interval=refresh_interval, cache=cache)
        self.session = ZooKeeperSession(hosts, session_timeout=session_timeout, timeout=timeout)
        self.service = service
        self.path = f"{base_path(base)}/{service}"

    async def _fetch(self) -> dict[str, str]:
        try:
            children = await self.session.call("get_children", self.path)
        except NoNodeError:
            return {}
        reads = await asyncio.gather(
            *(self.session.call("get", f"{self.path}/{child}") for child in children), return_exceptions=True
        )
        out: dict[str, str] = {}
        for child, read in zip(children, reads, strict=True):
            if isinstance(read, NoNodeError):
                continue  # removed between the listing and the read
            if isinstance(read, BaseException):
                raise read
            data, _stat = read
            out[child] = (data or b"").decode("utf-8", errors="replace")
        return out

    async def _watch(self, changed: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            fired: asyncio.Future[WatchedEvent] = loop.create_future()
            watch = self.session.watcher(fired)
            try:
                await self.session.call("get_children", self.path, watch=watch)
            except NoNodeError:
                # no server registered yet: wait for the service node
                if await self.session.call("exists", self.path, watch=watch) is not None:
                    continue
            changed.set()  # whatever changed before this watch was set is read now
            try:
                event = await fired
            finally:
                fired.cancel()
            if event.type == EventType.NONE:
                # kazoo fires every watch with no event type when the connection drops (they are gone)
                raise RegistryUnavailable(f"zookeeper {self.session.hosts}: connection lost")

    async def _close_backend(self) -> None:
        await self.session.aclose()
