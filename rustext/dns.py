"""DNS lookups for service discovery, shared by the balancer's
(``balancer.discovery``) and rpc's (``rpc.discovery.dns``): A/AAAA and SRV
records with their TTL, asked of the nameservers given or the system's.

Each failure (timeout, SERVFAIL, REFUSED, NXDOMAIN, no record) is one
``ResolutionError`` whose message is a line a user can read; what a failure
means (keep the last answer, drop it) and which SRV records to use are the
caller's policy. Nothing is cached: discovery asks again to see changes.
Pure Python, on dnspython's asyncio resolver.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

__all__ = ["FAMILIES", "ResolutionError", "Resolver", "SrvRecord", "parse_nameserver"]

#: address families → the record types asked
FAMILIES: dict[str, tuple[str, ...]] = {"any": ("A", "AAAA"), "ipv4": ("A",), "ipv6": ("AAAA",)}


class ResolutionError(Exception):
    """A name could not be resolved; ``str()`` says why, in one line."""


@dataclass(frozen=True)
class SrvRecord:
    priority: int
    weight: int
    port: int
    #: the target's name, without the final dot ("." when the record says "no service")
    target: str


def parse_nameserver(spec: str) -> tuple[str, int]:
    """``ip``, ``ip:port`` or ``[v6]:port`` → (ip, port); ValueError otherwise."""
    host, port = spec, 53
    bad = ValueError(f"{spec!r} must be an IP address with an optional :port")
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise bad
            port = int(rest[1:])
    elif spec.count(":") == 1:
        host, _, p = spec.partition(":")
        if not p.isdigit():
            raise bad
        port = int(p)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise bad from None
    if not 0 < port <= 65535:
        raise bad
    return host, port


class Resolver:
    """Asks ``nameservers`` (``ip[:port]`` strings, in turn; empty: those of
    ``/etc/resolv.conf``, ValueError when it names none), each resolution
    bounded by ``timeout`` seconds, every nameserver included."""

    def __init__(self, nameservers: Sequence[str] = (), *, timeout: float) -> None:
        servers = [parse_nameserver(ns) for ns in nameservers]
        try:
            resolver = dns.asyncresolver.Resolver(configure=not servers)
        except (dns.resolver.NoResolverConfiguration, OSError) as exc:
            raise ValueError("/etc/resolv.conf names no nameserver") from exc
        if servers:
            resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in servers]
        resolver.timeout = timeout
        resolver.lifetime = timeout
        resolver.cache = None
        self.timeout = timeout
        self._resolver = resolver

    async def query(self, name: str, rdtype: str) -> tuple[list[object], float | None]:
        """The records of one type and their TTL; no record of that type
        (NOERROR, nothing) is ``([], None)``."""
        try:
            answer = await self._resolver.resolve(name, rdtype, search=False)
        except dns.resolver.NoAnswer:
            return [], None
        except dns.resolver.NXDOMAIN:
            raise ResolutionError(f"{name}: no such name (NXDOMAIN)") from None
        except dns.resolver.LifetimeTimeout:
            raise ResolutionError(f"{name}: no answer within {self.timeout:g} s") from None
        except dns.resolver.NoNameservers as exc:
            raise ResolutionError(f"{name}: every nameserver failed ({_first_error(exc)})") from None
        except dns.exception.DNSException as exc:
            raise ResolutionError(f"{name}: {exc}") from None
        ttl = None if answer.rrset is None else float(answer.rrset.ttl)
        return list(answer), ttl

    async def addresses(self, name: str, family: str = "any") -> tuple[list[str], float | None]:
        """The addresses of ``name`` (A then AAAA for ``"any"``), without
        repeats, and the smallest TTL; ResolutionError when there is none."""
        answers = await asyncio.gather(*(self.query(name, rdtype) for rdtype in FAMILIES[family]),
                                       return_exceptions=True)
        ips: list[str] = []
        ttl: float | None = None
        errors: list[str] = []
        for answer in answers:
            if isinstance(answer, ResolutionError):
                errors.append(str(answer))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                records, record_ttl = answer
                ips.extend(ip for ip in (r.to_text() for r in records) if ip not in ips)  # type: ignore[attr-defined]
                ttl = min_ttl(ttl, record_ttl)
        if not ips:
            raise ResolutionError(errors[0] if errors else f"{name} has no address")
        return ips, ttl

    async def srv(self, name: str) -> tuple[list[SrvRecord], float | None]:
        """The SRV records of ``name`` and their TTL; ResolutionError when there is none."""
        records, ttl = await self.query(name, "SRV")
        if not records:
            raise ResolutionError(f"{name} has no SRV record")
        return [SrvRecord(r.priority, r.weight, r.port, str(r.target).rstrip(".") or ".")  # type: ignore[attr-defined]
                for r in records], ttl


def min_ttl(a: float | None, b: float | None) -> float | None:
    """The smaller of two TTLs, None standing for "no TTL known"."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def _first_error(exc: dns.resolver.NoNameservers) -> str:
    for error in exc.kwargs.get("errors") or []:
        if isinstance(error, tuple) and len(error) >= 4:
            return str(error[3])
    return "no usable answer"
