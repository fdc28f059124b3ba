"""Consul registry over Consul's HTTP API, in Go rpcx's layout.

Go rpcx registers in Consul with github.com/rpcxio/rpcx-consul v0.1.0
(``ConsulRegisterPlugin``, ``ConsulDiscovery``), which goes through
github.com/rpcxio/libkv v0.5.1's Consul store. The same KV entries are
written and read here (``base`` defaults to ``/rpcx``; Consul keys have no
leading ``/``, so ``/rpcx`` is the key ``rpcx``)::

    {base}                     "rpcx_path"
    {base}/{service}           "{service}"
    {base}/{service}/{address} "{metadata}", held by a session of TTL ttl/2
                               whose behaviour is "delete"

every one with libkv's flags (``LOCK_FLAG``). libkv gives an entry with a
TTL a session (``PUT /v1/session/create``, TTL half the entry's: Consul
invalidates a session after twice its TTL), acquires the key with it, renews
the session, then writes the value; a refresh finds the key's session and
renews it. A server that stops refreshing has its entry deleted by Consul
when the session expires. Consul's sessions last at least 10 s, so the
entry's ``ttl`` is at least ``MIN_TTL`` (20 s).

- ``ConsulRegistrar`` (server) writes the three entries, refreshes the
  server's every ``heartbeat`` seconds as the plugin does (re-reading its
  value, so an edit made in Consul such as ``state=inactive`` stays, and
  re-creating it if it vanished), and deletes it at unregistering, then
  destroys its session. The base entry gets no session: the plugin's
  ``Start`` gives it one that nothing renews, so Go's disappears after a
  while; no client reads it.
- ``ConsulDiscovery`` (client) lists ``{base}/{service}`` recursively and
  watches it with Consul's blocking queries (``?index=…&wait=15s``, as
  libkv's ``WatchTree``), re-reading on each change and at least every
  ``refresh_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import aiohttp

from rpc.discovery.base import (
    WatchingDiscovery,
    heartbeat_loop,
    stop_heartbeat_and_unregister,
)
from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable

log = logging.getLogger("rpc.discovery.consul")

#: libkv's flags on every entry it writes (Consul's api.LockFlagValue)
LOCK_FLAG = 0x2DDCCBC058A50C18

#: the smallest entry TTL: Consul refuses sessions under 10 s, and libkv asks for half the TTL
MIN_TTL = 20.0

#: how long a blocking query waits for a change (libkv's DefaultWatchWaitTime)
WATCH_WAIT = 15.0

DEFAULT_PORT = 8500

#: the value libkv gives the base path's entry
BASE_VALUE = "rpcx_path"


def _go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String`` writes whole and decimal seconds."""
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds:g}s"


def _reencode(metadata: str) -> str:
    """The metadata as the Go plugin rewrites it at each refresh
    (``url.ParseQuery`` then ``Values.Encode``: keys sorted, query-escaped)."""
    pairs = parse_qsl(metadata, keep_blank_values=True)
    return urlencode(sorted(pairs, key=lambda kv: kv[0]))


def _strip_base(path: str) -> str:
    """A base path as libkv keys it: without its leading ``/`` (and trailing ones)."""
    key = path.removeprefix("/")
    return key.rstrip("/")


class ConsulHTTP:
    """The Consul agent's HTTP API at ``host:port`` (or ``http://host:port``),
    the calls libkv's Consul store makes, with typed errors."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0) -> None:
        parts = urlsplit(endpoint if "//" in endpoint else f"http://{endpoint}")
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"Consul endpoint must be HOST:PORT or http://HOST:PORT, got {endpoint!r}")
        self.host = parts.hostname
        self.port = parts.port or DEFAULT_PORT
        self.timeout = timeout
        authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        self.base_url = f"http://{authority}"
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                      data: bytes | None = None, timeout: float | None = None) -> tuple[int, Any, int]:
        """``(status, decoded JSON or None, X-Consul-Index)``; 404 is returned,
        other non-2xx statuses raise ``RegistryError``."""
        limit = aiohttp.ClientTimeout(total=timeout or self.timeout, sock_connect=self.timeout)
        url = self.base_url + quote(path, safe="/@:")
        try:
            async with self._client().request(method, url, params=params, data=data, timeout=limit) as resp:
                body = await resp.read()
                index = int(resp.headers.get("X-Consul-Index", "0") or 0)
                if resp.status == 404:
                    return 404, None, index
                if not 200 <= resp.status < 300:
                    raise RegistryError(f"consul {method} {path}: HTTP {resp.status}: {body[:200].decode(errors='replace')}")
                return resp.status, (await resp.json(content_type=None)) if body.strip() else None, index
        except (OSError, TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise RegistryUnavailable(f"consul {self.host}:{self.port}: {exc or type(exc).__name__}") from exc
        except (aiohttp.ClientError, ValueError) as exc:
            raise RegistryError(f"consul {method} {path}: {exc}") from exc

    async def get(self, key: str, *, consistent: bool = False) -> dict[str, Any] | None:
        """The entry of ``key`` (Key, Value base64, Flags, Session…), or None."""
        status, body, _ = await self.request("GET", f"/v1/kv/{key}", params={"consistent": ""} if consistent else None)
        return body[0] if status != 404 and body else None

    async def list(self, prefix: str, *, index: int = 0, wait: float | None = None) -> tuple[list[dict[str, Any]], int]:
        """Every entry whose key starts with ``prefix``, and the index to wait
        on; with ``wait``, a blocking query returning once the index passes ``index``."""
        params = {"recurse": ""}
        if wait is not None:
            params.update(index=str(index), wait=f"{int(wait * 1000)}ms")
        # Consul answers a blocking query within wait + wait/16 (its jitter)
        timeout = None if wait is None else wait * 17 / 16 + self.timeout
        status, body, new_index = await self.request("GET", f"/v1/kv/{prefix}", params=params, timeout=timeout)
        return ((body or []) if status != 404 else []), new_index

    async def put(self, key: str, value: str, *, acquire: str | None = None) -> bool:
        params = {"flags": str(LOCK_FLAG)}
        if acquire is not None:
            params = {"acquire": acquire, **params}
        _, body, _ = await self.request("PUT", f"/v1/kv/{key}", params=params, data=value.encode())
        return body is True

    async def delete(self, key: str) -> None:
        await self.request("DELETE", f"/v1/kv/{key}")

    async def create_session(self, ttl: float) -> str:
        """A session whose expiry deletes the keys it holds (libkv's, for an entry of TTL ``ttl``)."""
        body = {"LockDelay": "1ms", "Behavior": "delete", "TTL": _go_duration(ttl / 2)}
        _, res, _ = await self.request("PUT", "/v1/session/create", data=json.dumps(body).encode())
        if not isinstance(res, dict) or not res.get("ID"):
            raise RegistryError(f"consul session create answered {res!r}")
        return str(res["ID"])

    async def renew_session(self, session: str) -> bool:
        """False when the session no longer exists."""
        status, _, _ = await self.request("PUT", f"/v1/session/renew/{session}")
        return status != 404

    async def destroy_session(self, session: str) -> None:
        await self.request("PUT", f"/v1/session/destroy/{session}")

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class ConsulRegistrar:
    """Server side: Go's ``ConsulRegisterPlugin`` entries, kept alive by
    renewing their sessions every ``heartbeat`` seconds (default ttl/3)."""

    def __init__(self, endpoint: str, *, base: str = "/rpcx", ttl: float = MIN_TTL,
                 heartbeat: float | None = None) -> None:
        if ttl < MIN_TTL:
            raise ValueError(f"ttl must be >= {MIN_TTL:g} s with Consul (its sessions last at least 10 s, "
                             "and an entry's session gets half its TTL)")
        self.http = ConsulHTTP(endpoint)
        self.base = _strip_base(base)
        if not self.base:
            raise ValueError(f"the Consul base path must name a key, e.g. /rpcx, got {base!r}")
        self.ttl = float(ttl)
        self.heartbeat = heartbeat if heartbeat is not None else ttl / 3
        if not 0 < self.heartbeat < ttl:
            raise ValueError("heartbeat must be in (0, ttl)")
        self._entries: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def key(self, service: str, address: str) -> str:
        """The Consul key of a server of ``service``."""
        return f"{self.base}/{service}/{address}"

    async def _put_with_ttl(self, key: str, value: str) -> None:
        """libkv's ``Put`` with a TTL: the key's session (a new one acquiring
        the key if it has none) renewed, then the value written."""
        entry = await self.http.get(key)
        session = entry.get("Session") if entry else None
        if not session:
            session = await self.http.create_session(self.ttl)
            if not await self.http.put(key, "", acquire=session):
                raise RegistryError(f"consul: cannot acquire {key} with session {session}")
        if not await self.http.renew_session(session):
            raise RegistryError(f"consul: session {session} of {key} vanished while renewing it")
        await self.http.put(key, value)

    async def register(self, service: str, address: str, metadata: str = "") -> None:
        if self._closed:
            raise RegistryError("registrar is closed")
        async with self._lock:
            await self.http.put(self.base, BASE_VALUE)
            await self.http.put(f"{self.base}/{service}", service)
            await self._put_with_ttl(self.key(service, address), metadata)
            self._entries[(service, address)] = metadata
        if self._task is None:
            self._task = asyncio.create_task(
                heartbeat_loop(self.heartbeat, self.refresh, "consul refresh", log), name="consul-registrar-refresh")

    async def unregister(self, service: str, address: str) -> None:
        self._entries.pop((service, address), None)
        key = self.key(service, address)
        entry = await self.http.get(key)
        if entry is None:
            return
        await self.http.delete(key)
        if entry.get("Session"):
            await self.http.destroy_session(entry["Session"])

    async def refresh(self) -> None:
        """One refresh of every entry, as the plugin's ticker does."""
        async with self._lock:
            for (service, address), metadata in list(self._entries.items()):
                key = self.key(service, address)
                entry = await self.http.get(key, consistent=True)
                if entry is None:
                    log.warning("consul entry %s vanished: registering it again", key)
                    await self._put_with_ttl(key, metadata)
                    continue
                current = base64.b64decode(entry["Value"]).decode() if entry.get("Value") else ""
                await self._put_with_ttl(key, _reencode(current))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        await stop_heartbeat_and_unregister(self, task, list(self._entries), log)
        await self.http.aclose()


class ConsulDiscovery(WatchingDiscovery):
    """Client side: the servers of ``service``, the keys under ``{base}/{service}/``."""

    def __init__(self, endpoint: str, service: str, *, base: str = "/rpcx", refresh_interval: float = 0.5,
                 cache: FileCache | None = None, watch_wait: float = WATCH_WAIT) -> None:
        super().__init__(refresh_interval=refresh_interval, cache=cache)
        self.http = ConsulHTTP(endpoint)
        self.service = service
        self.directory = _strip_base(f"{base}/{service}")
        self.prefix = self.directory + "/"
        self.watch_wait = watch_wait

    def _servers_of(self, entries: list[dict[str, Any]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for entry in entries:
            key = str(entry.get("Key", ""))
            if key.startswith(self.prefix) and len(key) > len(self.prefix):  # the list is by prefix: skip {service}x/
                value = entry.get("Value")
                out[key[len(self.prefix):]] = base64.b64decode(value).decode() if value else ""
        return out

    async def _fetch(self) -> dict[str, str]:
        entries, _ = await self.http.list(self.directory)
        return self._servers_of(entries)

    async def _watch(self, changed: asyncio.Event) -> None:
        index = 0
        while True:
            _, new_index = await self.http.list(self.directory, index=index, wait=self.watch_wait)
            if new_index != index:
                changed.set()
            # Consul's advice: an index that went backwards (a snapshot restore) starts over, and
            # one under 1 is taken as 1 (index 0 does not block)
            index = max(new_index, 1) if new_index >= index else 0

    async def _close_backend(self) -> None:
        await self.http.aclose()
