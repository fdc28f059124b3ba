"""etcd v3 registry over etcd's HTTP/JSON gateway (no extra dependency).

Layout (rpcx's etcdv3 plugin): key ``{base}/{service}/{address}``, value the
metadata, attached to a lease of ``ttl`` seconds.

- ``EtcdRegistrar`` (server): grants a lease (``/v3/lease/grant``), puts the
  keys with it (``/v3/kv/put``), renews it every ``ttl / 3``
  (``/v3/lease/keepalive``; a lease found expired is re-granted and the keys
  re-put), and at shutdown deletes the keys and revokes the lease.
- ``EtcdDiscovery`` (client): reads the prefix (``/v3/kv/range``), watches it
  (``/v3/watch``, a streamed response) and re-reads on every event, and at
  least every ``refresh_interval`` seconds.

Keys and values travel base64-encoded, as the gateway requires.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rpc.discovery import _http
from rpc.discovery.base import (
    WatchingDiscovery,
    heartbeat_loop,
    stop_heartbeat_and_unregister,
)
from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable
from rustext.tls import ClientTls, describe_ssl_error

log = logging.getLogger("rpc.discovery.etcd")


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key that starts with ``prefix`` (etcd's range_end)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\x00"  # every key


class EtcdHTTP:
    """The etcd endpoint (``http://host:port``, or ``https://host:port``
    verified as ``tls`` says: the system's trust store by default, a CA, a
    client certificate), with typed errors."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0, tls: ClientTls | None = None) -> None:
        parts = urlsplit(endpoint if "//" in endpoint else f"http://{endpoint}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"etcd endpoint must be http://host:port or https://host:port, got {endpoint!r}")
        if tls is not None and parts.scheme != "https":
            raise ValueError(f"TLS options need an https:// etcd endpoint, got {endpoint!r}")
        self.host = parts.hostname
        self.port = parts.port or 2379
        self.timeout = timeout
        #: client TLS context of an https:// endpoint
        self.ssl = (tls or ClientTls()).context() if parts.scheme == "https" else None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await _http.post_json(self.host, self.port, path, body, timeout=self.timeout, ssl=self.ssl)
        except aiohttp.ClientConnectorCertificateError as exc:
            raise RegistryUnavailable(
                f"etcd {self.host}:{self.port}: {describe_ssl_error(exc.certificate_error)}") from exc
        except (OSError, TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise RegistryUnavailable(f"etcd {self.host}:{self.port}: {exc or type(exc).__name__}") from exc
        except aiohttp.ClientError as exc:
            raise RegistryError(f"etcd {path}: {exc}") from exc
        except (_http.HTTPError, ValueError) as exc:
            raise RegistryError(f"etcd {path}: {exc}") from exc

    def stream(self, path: str, body: dict[str, Any]):  # type: ignore[no-untyped-def]
        return _http.stream_json(self.host, self.port, path, body, timeout=self.timeout, ssl=self.ssl)


class EtcdRegistrar:
    """Server side: keys under one lease, kept alive by keepalive calls."""

    def __init__(self, endpoint: str, *, base: str = "/rpcx", ttl: int = 10, heartbeat: float | None = None,
                 tls: ClientTls | None = None) -> None:
        if ttl < 2:
            raise ValueError("ttl must be >= 2 seconds (etcd leases are in whole seconds)")
        self.http = EtcdHTTP(endpoint, tls=tls)
        self.base = base.rstrip("/")
        self.ttl = int(ttl)
        self.heartbeat = heartbeat if heartbeat is not None else ttl / 3
        if not 0 < self.heartbeat < ttl:
            raise ValueError("heartbeat must be in (0, ttl)")
        self.lease: str | None = None
        self._entries: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def _key(self, service: str, address: str) -> str:
        return f"{self.base}/{service}/{address}"

    async def _grant(self) -> str:
        res = await self.http.post("/v3/lease/grant", {"TTL": self.ttl})
        lease = res.get("ID")
        if not lease:
            raise RegistryError(f"etcd lease grant failed: {res}")
        return str(lease)

    async def _put(self, service: str, address: str, metadata: str) -> None:
        assert self.lease is not None
        await self.http.post(
            "/v3/kv/put", {"key": _b64(self._key(service, address)), "value": _b64(metadata), "lease": self.lease}
        )

    async def register(self, service: str, address: str, metadata: str = "") -> None:
        if self._closed:
            raise RegistryError("registrar is closed")
        async with self._lock:
            if self.lease is None:
                self.lease = await self._grant()
            await self._put(service, address, metadata)
            self._entries[(service, address)] = metadata
        if self._task is None:
            self._task = asyncio.create_task(
                heartbeat_loop(self.heartbeat, self.keepalive, "etcd keepalive", log), name="etcd-registrar-keepalive")

    async def unregister(self, service: str, address: str) -> None:
        self._entries.pop((service, address), None)
        await self.http.post("/v3/kv/deleterange", {"key": _b64(self._key(service, address))})

    async def keepalive(self) -> None:
        """Renew the lease once; re-grant and re-put when it had expired."""
        async with self._lock:
            if self.lease is None:
                return
            res = await self.http.post("/v3/lease/keepalive", {"ID": self.lease})
            result = res.get("result", res)
            if int(result.get("TTL", 0) or 0) > 0:
                return
            log.warning("etcd lease %s expired: registering again", self.lease)
            self.lease = await self._grant()
            for (service, address), metadata in list(self._entries.items()):
                await self._put(service, address, metadata)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        await stop_heartbeat_and_unregister(self, task, list(self._entries), log)
        if self.lease is not None:
            lease, self.lease = self.lease, None
            try:
                await self.http.post("/v3/lease/revoke", {"ID": lease})
            except RegistryError as exc:
                log.warning("cannot revoke etcd lease %s: %s", lease, exc)


class EtcdDiscovery(WatchingDiscovery):
    """Client side: the servers of ``service`` under ``{base}/{service}/``."""

    def __init__(
        self,
        endpoint: str,
        service: str,
        *,
        base: str = "/rpcx",
        refresh_interval: float = 0.5,
        cache: FileCache | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        super().__init__(refresh_interval=refresh_interval, cache=cache)
        self.http = EtcdHTTP(endpoint, tls=tls)
        self.service = service
        self.prefix = f"{base.rstrip('/')}/{service}/"
        key = self.prefix.encode()
        self._range = {"key": _b64(key), "range_end": _b64(prefix_end(key))}

    async def _fetch(self) -> dict[str, str]:
        res = await self.http.post("/v3/kv/range", dict(self._range))
        out: dict[str, str] = {}
        for kv in res.get("kvs", []) or []:
            key = _unb64(kv.get("key", ""))
            addr = key[len(self.prefix):]
            if addr and "/" not in addr:
                out[addr] = _unb64(kv["value"]) if kv.get("value") else ""
        return out

    async def _watch(self, changed: asyncio.Event) -> None:
        stream = self.http.stream("/v3/watch", {"create_request": dict(self._range)})
        try:
            async for msg in stream:
                result = msg.get("result", {})
                if "error" in msg:
                    raise RegistryError(f"etcd watch: {msg['error']}")
                if result.get("created"):
                    changed.set()  # catch up with whatever changed before the watch began
                if result.get("events") or result.get("canceled"):
                    changed.set()
                    if result.get("canceled"):
                        return
        finally:
            await stream.aclose()
