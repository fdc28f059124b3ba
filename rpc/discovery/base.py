"""Discovery interfaces, static discovery, and the watching base of registries.

Client side, a ``Discovery`` knows the servers of one service: a mapping
address → rpcx metadata string (``"weight=2&state=active"``). Subscribers
are called with the new mapping whenever it changes. Server side, a
``Registrar`` publishes (service, address, metadata) and keeps it alive.

Addresses follow rpcx: ``network@host:port`` (``tcp@127.0.0.1:8972``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

from rustext.backoff import Backoff, BackoffPolicy

from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable

#: how a registry watch that ended is restarted (each delay jittered)
WATCH_BACKOFF = BackoffPolicy(initial=0.1, maximum=5.0)

log = logging.getLogger("rpc.discovery")

Subscriber = Callable[[dict[str, str]], None]


class Discovery:
    """Servers of one service, with change subscriptions.

    ``servers()`` is a snapshot; ``subscribe(fn)`` returns an unsubscribe
    function. Subclasses call ``_publish`` with each new mapping.
    """

    def __init__(self) -> None:
        self._servers: dict[str, str] = {}
        self._subscribers: list[Subscriber] = []

    def servers(self) -> dict[str, str]:
        return dict(self._servers)

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subscribers.append(fn)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(fn)

        return unsubscribe

    def _publish(self, servers: Mapping[str, str]) -> bool:
        """Set the servers; notify subscribers when they changed. True if changed."""
        new = dict(servers)
        if new == self._servers:
            return False
        self._servers = new
        for fn in list(self._subscribers):
            try:
                fn(dict(new))
            except Exception:
                log.exception("discovery subscriber failed")
        return True

    async def start(self) -> None:
        """Begin discovering (idempotent)."""

    async def aclose(self) -> None:
        """Stop discovering (idempotent)."""

    async def __aenter__(self) -> Discovery:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _normalize(servers: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(servers, Mapping):
        return {str(a): str(m) for a, m in servers.items()}
    return {str(a): "" for a in servers}


class StaticDiscovery(Discovery):
    """A fixed list of servers (rpcx's peer-to-peer and multiple-servers
    discovery); ``update`` replaces it and notifies subscribers."""

    def __init__(self, servers: Mapping[str, str] | Iterable[str] = ()) -> None:
        super().__init__()
        self._servers = _normalize(servers)

    @classmethod
    def peer(cls, address: str, metadata: str = "") -> StaticDiscovery:
        """One server (rpcx's Peer2PeerDiscovery)."""
        return cls({address: metadata})

    def update(self, servers: Mapping[str, str] | Iterable[str]) -> None:
        self._publish(_normalize(servers))


class Registrar(Protocol):
    """Server side of a registry."""

    async def register(self, service: str, address: str, metadata: str = "") -> None:
        """Publish (service, address) with metadata; kept alive until unregistered."""

    async def unregister(self, service: str, address: str) -> None:
        """Remove the entry now (before the server stops accepting)."""

    async def aclose(self) -> None:
        """Unregister everything still registered and stop heartbeats (idempotent)."""


async def stop_heartbeat_and_unregister(
    registrar: Registrar, task: asyncio.Task[None] | None, entries: Iterable[tuple[str, str]], logger: logging.Logger
) -> None:
    """The first half of a registrar's ``aclose``: cancel its heartbeat task,
    then unregister each (service, address) still registered, logging (not
    raising) a failure so that one unreachable entry does not keep the others."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for service, address in list(entries):
        try:
            await registrar.unregister(service, address)
        except RegistryError as exc:
            logger.warning("cannot unregister %s %s: %s", service, address, exc)


async def heartbeat_loop(
    period: float,
    beat: Callable[[], Awaitable[object]],
    what: str,
    logger: logging.Logger,
    *,
    wake: asyncio.Event | None = None,
) -> None:
    """A registrar's heartbeat task: ``beat()`` every ``period`` seconds (or
    as soon as ``wake`` is set: a reconnection), for ever; a failed beat is
    logged as ``"{what} failed: …"`` and the next one comes on time. Runs
    until cancelled (``stop_heartbeat_and_unregister``)."""
    while True:
        if wake is None:
            await asyncio.sleep(period)
        else:
            # asyncio.wait, not wait_for: on Python 3.11 wait_for returns the result of an inner
            # wait that ends in the same loop turn as a cancel, and the cancel is lost
            woken = asyncio.ensure_future(wake.wait())
            try:
                await asyncio.wait((woken,), timeout=period)
            finally:
                woken.cancel()
            wake.clear()
        try:
            await beat()
        except RegistryError as exc:
            logger.warning("%s failed: %s", what, exc)
        _end_if_cancelled()


def _end_if_cancelled() -> None:
    """Raise CancelledError when the current task was cancelled but the
    cancellation never surfaced: a registry client can swallow it (redis-py's
    asyncio client returns a reply to a command cancelled in flight), and a
    loop that carried on would make ``aclose`` wait for ever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class WatchingDiscovery(Discovery):
    """Base of registry discoveries: fetch now, then on each watch event and at
    least every ``refresh_interval`` seconds.

    When the registry is unreachable, the last known servers stay in use; at
    start, they come from ``cache`` (a ``FileCache``) if one is given and the
    registry cannot be reached (else ``start`` raises ``RegistryUnavailable``).
    Every successful fetch is written to the cache.

    A registry the servers could not reach either expires their entries
    meanwhile (a TTL, a lease, a session), and lists them again only at their
    next heartbeat. So the first answer after an outage does not drop a known
    server at once: servers it leaves out are kept ``outage_grace`` seconds
    more (0: dropped at once), unless a later answer lists them again.

    Subclasses implement ``_fetch()`` and ``_watch(changed)`` (a long-running
    coroutine that sets ``changed`` on a change notification and returns or
    raises when its connection ends; it is restarted with backoff).
    """

    def __init__(self, *, refresh_interval: float = 0.5, cache: FileCache | None = None,
                 outage_grace: float = 30.0) -> None:
        super().__init__()
        if refresh_interval <= 0:
            raise ValueError("refresh_interval must be > 0")
        if outage_grace < 0:
            raise ValueError("outage_grace must be >= 0")
        self.refresh_interval = refresh_interval
        self.outage_grace = outage_grace
        self.cache = cache
        self._failing = False  # the last fetch failed
        self._fetches = 0  # fetches begun, and the number of the last one begun that succeeded
        self._last_success = 0
        self._held: dict[str, str] = {}  # servers left out by the first answer after an outage, still in use
        self._held_until = 0.0
        self._clock = time.monotonic  # (the tests' own clock replaces it)
        self.from_cache = False  # the servers in use came from the cache (registry unreachable)
        self._changed = asyncio.Event()
        self._saving = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.fetch_errors = 0

    async def _fetch(self) -> dict[str, str]:
        raise NotImplementedError

    async def _watch(self, changed: asyncio.Event) -> None:
        raise NotImplementedError

    async def _close_backend(self) -> None:
        """Release the subclass's connections."""

    async def start(self) -> None:
        if self._started:
            return
        try:
            servers = await self._fetch()
        except RegistryError as exc:
            cached = self.cache.load() if self.cache is not None else None
            if cached is None:
                await self._close_backend()
                raise RegistryUnavailable(f"registry unreachable and no cache: {exc}") from exc
            log.warning("registry unreachable (%s): using %d cached server(s)", exc, len(cached))
            self.from_cache = True
            self._publish(cached)
        else:
            await self._accept(servers)
        self._started = True
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="discovery-refresh"),
            asyncio.create_task(self._watch_loop(), name="discovery-watch"),
        ]

    async def refresh(self) -> bool:
        """Fetch now; True when it succeeded."""
        self._fetches += 1
        started = self._fetches
        try:
            servers = await self._fetch()
        except RegistryError as exc:
            self.fetch_errors += 1
            # a fetch that began before the last success (a slow one, overtaken) says nothing of the registry now
            if started > self._last_success:
                self._failing = True
            log.warning("registry fetch failed (keeping %d known server(s)): %s", len(self._servers), exc)
            return False
        self._last_success = max(self._last_success, started)
        await self._accept(self._after_outage(servers))
        return True

    def _after_outage(self, servers: dict[str, str]) -> dict[str, str]:
        """``servers`` plus the known ones the first answer after an outage left
        out, for ``outage_grace`` seconds (see the class doc)."""
        now = self._clock()
        if self._failing:
            self._failing = False
            missing = {a: m for a, m in self._servers.items() if a not in servers}
            if missing and self.outage_grace > 0:
                log.warning("registry back without %d server(s) it listed before its outage (their entries may have "
                            "expired meanwhile): keeping them %gs for their next heartbeat", len(missing),
                            self.outage_grace)
                self._held, self._held_until = missing, now + self.outage_grace
        if not self._held:
            return servers
        if now >= self._held_until:
            log.info("dropping %d server(s) the registry did not list again after its outage", len(self._held))
            self._held = {}
            return servers
        self._held = {a: m for a, m in self._held.items() if a not in servers}
        return {**self._held, **servers}

    async def _accept(self, servers: dict[str, str]) -> None:
        self.from_cache = False
        self._publish(servers)
        if self.cache is not None:
            # save() fsyncs: off the event loop; the lock keeps the writes in
            # the order of the fetches
            async with self._saving:
                try:
                    await asyncio.to_thread(self.cache.save, servers)
                except OSError as exc:
                    log.warning("cannot write discovery cache %s: %s", self.cache.path, exc)

    async def _refresh_loop(self) -> None:
        while True:
            # asyncio.wait, not asyncio.timeout: on Python 3.11 a cancel that lands as the timeout
            # expires is turned into TimeoutError and lost, and aclose() would wait for ever
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait((changed,), timeout=self.refresh_interval)
            finally:
                changed.cancel()
            self._changed.clear()
            try:
                await self.refresh()
            except Exception:  # a bug or an unexpected reply must not end the refreshing
                self.fetch_errors += 1
                log.exception("registry refresh failed")
            _end_if_cancelled()

    async def _watch_loop(self) -> None:
        backoff = Backoff(WATCH_BACKOFF)
        while True:
            try:
                await self._watch(self._changed)
                backoff.reset()
                delay = backoff.next_delay()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = backoff.next_delay()
                log.info("registry watch ended (%s); retrying in %.1fs", exc, delay)
            _end_if_cancelled()
            await asyncio.sleep(delay)
            self._changed.set()  # we may have missed events while not watching

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._started = False
        await self._close_backend()
