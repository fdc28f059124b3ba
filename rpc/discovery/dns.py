"""DNS discovery: the servers of a service are what a DNS name resolves to.

Kubernetes publishes the pods behind a headless service as DNS records, and
any DNS server can do the same; nothing registers, the client only reads:

- ``dns://NAME:PORT``  the A and AAAA records of NAME, each address with PORT
  (every server listens on the same port; weight 1 each);
- ``dns+srv://NAME``   the SRV records of NAME (``_rpcx._tcp.app.ns.svc.cluster.local``):
  each target's addresses with the record's port, and the record's weight as
  the server's ``weight=`` (what the weighted selector uses; SRV weight 0,
  "rarely", counts as 1). Only the lowest priority whose targets resolve is
  used: the others are fallbacks.

The query takes ``nameserver=IP[:PORT]`` (repeatable; default: those of
``/etc/resolv.conf``), ``interval=S`` (a fixed refresh period; default: the
records' smallest TTL, kept between ``min_ttl`` and ``max_ttl``) and
``timeout=S`` (one resolution, all nameservers included).

A failed resolution (no answer, SERVFAIL, NXDOMAIN, no address at all) keeps
the last good set, as the other registries keep theirs when they are
unreachable: logged once until the name resolves again, retried every
``min_ttl`` (or ``interval``) seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from rpc.discovery.base import WatchingDiscovery
from rpc.discovery.cache import FileCache
from rpc.errors import RegistryError, RegistryUnavailable
from rustext.dns import ResolutionError, Resolver, SrvRecord, min_ttl, parse_nameserver
from rustext.net import join_hostport

log = logging.getLogger("rpc.discovery.dns")

__all__ = ["DnsDiscovery", "DnsName", "SrvRecord", "refresh_delay", "srv_choice"]

#: URL schemes of DNS discovery
SCHEMES = ("dns", "dns+srv")

EXPECTED = "expected dns://NAME:PORT or dns+srv://NAME, with ?nameserver=IP[:PORT]&interval=S&timeout=S"


def _seconds(url: str, key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"DNS URL {url!r}: {key} must be a number of seconds > 0, got {value!r}")
    return v


def _nameserver(url: str, spec: str) -> str:
    """``IP`` or ``IP:PORT`` (``[v6]:PORT``), checked; returned as given."""
    try:
        parse_nameserver(spec)
    except ValueError as exc:
        raise ValueError(f"DNS URL {url!r}: nameserver {exc}") from None
    return spec


@dataclass(frozen=True, kw_only=True)
class DnsName:
    """What to resolve and how: ``name``; ``port`` (A/AAAA) or ``srv``; the
    ``nameservers`` asked (empty: the system's); ``interval`` (None: follow
    the TTL, kept within ``min_ttl``..``max_ttl``); ``timeout`` of one
    resolution. A frozen, picklable value (benchmark processes receive it)."""

    name: str
    port: int = 0
    srv: bool = False
    nameservers: tuple[str, ...] = ()
    interval: float | None = None
    timeout: float = 2.0
    min_ttl: float = 1.0
    max_ttl: float = 60.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a DNS name is needed")
        if not self.srv and not 0 < self.port <= 65535:
            raise ValueError(f"dns://{self.name}: a port is needed (dns://NAME:PORT; SRV records carry theirs: "
                             "dns+srv://NAME)")
        if not 0 < self.min_ttl <= self.max_ttl:
            raise ValueError("min_ttl must be > 0 and <= max_ttl")
        if self.timeout <= 0 or (self.interval is not None and self.interval <= 0):
            raise ValueError("timeout and interval must be > 0")

    @classmethod
    def parse(cls, url: str) -> DnsName:
        """Raises ValueError with a one-line reason for a URL that is not a DNS one."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES or "://" not in url:
            raise ValueError(f"not a DNS URL: {url!r}; {EXPECTED}")
        if not parts.hostname:
            raise ValueError(f"no name in DNS URL {url!r}; {EXPECTED}")
        if parts.username or parts.password or parts.fragment or parts.path not in ("", "/"):
            raise ValueError(f"DNS URL {url!r} takes a name, a port and a query only; {EXPECTED}")
        try:
            port = parts.port or 0
        except ValueError:
            raise ValueError(f"bad port in DNS URL {url!r}; {EXPECTED}") from None
        srv = scheme == "dns+srv"
        if srv and port:
            raise ValueError(f"DNS URL {url!r}: SRV records carry the ports; drop :{port}")
        if not srv and not port:
            raise ValueError(f"DNS URL {url!r} needs a port (dns://NAME:PORT); SRV records carry theirs: dns+srv://NAME")
        nameservers: list[str] = []
        interval: float | None = None
        timeout = 2.0
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key == "nameserver":
                nameservers.append(_nameserver(url, value))
            elif key == "interval":
                interval = _seconds(url, key, value)
            elif key == "timeout":
                timeout = _seconds(url, key, value)
            else:
                raise ValueError(f"DNS URL {url!r}: unknown query parameter {key!r} "
                                 "(only nameserver=IP[:PORT], interval=S, timeout=S)")
        return cls(name=parts.hostname.rstrip("."), port=port, srv=srv, nameservers=tuple(nameservers),
                   interval=interval, timeout=timeout)

    @property
    def display(self) -> str:
        return f"dns+srv://{self.name}" if self.srv else f"dns://{join_hostport(self.name, self.port)}"


def srv_choice(records: Iterable[SrvRecord]) -> list[list[SrvRecord]]:
    """The records worth resolving, by priority group, lowest first (RFC 2782:
    a higher priority is used only when no server of the lower one is
    reachable); a record with port 0 or target ``.`` ("no service") is left out."""
    groups: dict[int, list[SrvRecord]] = {}
    for r in records:
        if r.port and r.target not in ("", "."):
            groups.setdefault(r.priority, []).append(r)
    return [groups[p] for p in sorted(groups)]


def refresh_delay(ttl: float | None, *, interval: float | None, min_ttl: float, max_ttl: float) -> float:
    """Seconds until the next resolution: the fixed ``interval`` if given, else
    the records' TTL kept within [``min_ttl``, ``max_ttl``] (a TTL of 0, as
    some servers give, must not make the client ask in a loop)."""
    if interval is not None:
        return interval
    if ttl is None:
        return min_ttl
    return min(max(float(ttl), min_ttl), max_ttl)


class DnsDiscovery(WatchingDiscovery):
    """Servers (``tcp@ip:port`` → ``""`` or ``"weight=N"``) from DNS records,
    resolved at start and again when their TTL runs out (or every
    ``interval``). ``start`` raises ``RegistryUnavailable`` when the name does
    not resolve (and ``cache`` has nothing); later failures keep the last
    good set. The service name is not part of the DNS name: one name, one service."""

    def __init__(self, target: DnsName, *, cache: FileCache | None = None) -> None:
        super().__init__(refresh_interval=refresh_delay(None, interval=target.interval, min_ttl=target.min_ttl,
                                                        max_ttl=target.max_ttl), cache=cache)
        self.target = target
        self.last_error = ""
        try:
            self._resolver = Resolver(target.nameservers, timeout=target.timeout)
        except ValueError as exc:
            raise ValueError(f"{target.display}: {exc}; give one with ?nameserver=IP[:PORT]") from exc

    async def _watch(self, changed: asyncio.Event) -> None:
        await asyncio.Event().wait()  # DNS pushes nothing: the refresh loop's timer is the watch

    async def refresh(self) -> bool:
        """Resolve now; True when it succeeded. A failure keeps the servers
        and is logged once (until a resolution succeeds again)."""
        try:
            servers, ttl = await self._resolve()
        except RegistryError as exc:
            self.fetch_errors += 1
            if str(exc) != self.last_error:
                log.warning("%s: %s; keeping its %d server(s)", self.target.display, exc, len(self._servers))
            self.last_error = str(exc)
            self.refresh_interval = self._delay(None)
            return False
        if self.last_error:
            log.info("%s resolves again", self.target.display)
        self.last_error = ""
        self.refresh_interval = self._delay(ttl)
        if servers != self._servers:
            log.info("%s → %s", self.target.display, ", ".join(servers))
        await self._accept(servers)
        return True

    async def _fetch(self) -> dict[str, str]:
        servers, ttl = await self._resolve()
        self.refresh_interval = self._delay(ttl)
        return servers

    def _delay(self, ttl: float | None) -> float:
        t = self.target
        return refresh_delay(ttl, interval=t.interval, min_ttl=t.min_ttl, max_ttl=t.max_ttl)

    async def _resolve(self) -> tuple[dict[str, str], float | None]:
        """(servers, the smallest TTL of the records used); RegistryUnavailable
        when there is no server to give."""
        try:
            return await self._lookup()
        except ResolutionError as exc:
            raise RegistryUnavailable(str(exc)) from None

    async def _lookup(self) -> tuple[dict[str, str], float | None]:
        if not self.target.srv:
            ips, ttl = await self._resolver.addresses(self.target.name)
            return {f"tcp@{join_hostport(ip, self.target.port)}": "" for ip in ips}, ttl
        records, ttl = await self._resolver.srv(self.target.name)
        for group in srv_choice(records):
            found = await asyncio.gather(*(self._resolver.addresses(r.target) for r in group), return_exceptions=True)
            servers: dict[str, str] = {}
            for r, result in zip(group, found):
                if isinstance(result, ResolutionError):
                    log.debug("%s: SRV target %s: %s", self.target.display, r.target, result)
                    continue
                if isinstance(result, BaseException):
                    raise result
                ips, target_ttl = result
                ttl = min_ttl(ttl, target_ttl)
                for ip in ips:
                    servers.setdefault(f"tcp@{join_hostport(ip, r.port)}", f"weight={max(r.weight, 1)}")
            if servers:
                return servers, ttl
        raise ResolutionError(f"{self.target.name}: no SRV target resolves")
