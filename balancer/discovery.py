"""DNS service discovery: backends given by name, resolved again and again.

A backend ``address = "app.internal:8080"`` (with a ``[dns]`` table) is
resolved to its A/AAAA records every ``dns.interval`` seconds; a backend
``srv = "_http._tcp.app.internal"`` to the targets, ports and weights of its
SRV records (the lowest priority present), each target resolved in turn.
Every address found becomes one backend of the data plane, so the pool
follows DNS through the ordinary reload path (no connection dropped).

What happens when DNS misbehaves, as HAProxy's ``resolvers`` section does it:

- a failed resolution (timeout, SERVFAIL, REFUSED, NXDOMAIN, an answer with
  no address) keeps the last good set: logged, counted, retried next round;
  ``hold_valid`` > 0 bounds how long that set outlives the failures;
- an address that leaves a good answer is kept ``hold_obsolete`` seconds
  more (0: dropped at once; requests in flight to it finish anyway);
- a name that does not resolve at start starts with no address and is
  retried every round (``init_addr = "none"``), or makes the configuration
  invalid (``init_addr = "error"``).

:class:`Discovery` owns the resolver and the last answers; it knows nothing
of the data plane: :class:`balancer.service.LoadBalancer` asks it for the
addresses of each named backend and pushes the expansion. The clock is
injectable so that the holds can be tested without waiting.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from balancer.errors import BalancerConfigError
from rustext.dns import ResolutionError, Resolver, parse_nameserver
from rustext.net import join_hostport

log = logging.getLogger("balancer.dns")

__all__ = ["Discovery", "DnsConfig", "Target", "is_ip"]

def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _nameserver(spec: str) -> tuple[str, int]:
    """``ip``, ``ip:port`` or ``[v6]:port`` → (ip, port)."""
    try:
        return parse_nameserver(spec)
    except ValueError as exc:
        raise BalancerConfigError(f"dns.nameservers: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class DnsConfig:
    """Resolution of backends given by name (the ``[dns]`` table)."""

    #: ``"ip"`` or ``"ip:port"`` of the DNS servers asked, in turn; empty = those of ``/etc/resolv.conf``
    nameservers: tuple[str, ...] = ()
    #: seconds between two resolutions of each name
    interval: float = 5.0
    #: seconds one resolution may take, all nameservers included
    timeout: float = 2.0
    #: seconds an address missing from a good answer keeps serving; 0 = removed at once
    hold_obsolete: float = 0.0
    #: seconds the last good addresses are kept while resolutions fail; 0 = until one succeeds
    hold_valid: float = 0.0
    #: a name that does not resolve at start: ``"none"`` starts without its addresses and keeps trying,
    #: ``"error"`` rejects the configuration
    init_addr: str = "none"
    #: addresses taken from one name at most (the first ones of the answer); the others are left out
    max_addresses: int = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "nameservers", tuple(self.nameservers))
        for ns in self.nameservers:
            if not isinstance(ns, str):
                raise BalancerConfigError(f"dns.nameservers: expected strings, got {ns!r}")
            _nameserver(ns)
        for name in ("interval", "timeout", "hold_obsolete", "hold_valid"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise BalancerConfigError(f"dns.{name} must be a number >= 0, got {v!r}")
        if self.interval <= 0 or self.timeout <= 0:
            raise BalancerConfigError("dns.interval and dns.timeout must be > 0")
        if isinstance(self.max_addresses, bool) or not isinstance(self.max_addresses, int) or not (
                1 <= self.max_addresses <= 1024):
            raise BalancerConfigError(f"dns.max_addresses must be an integer in 1..1024, got {self.max_addresses!r}")
        if self.init_addr not in ("none", "error"):
            raise BalancerConfigError(f"dns.init_addr must be \"none\" or \"error\", got {self.init_addr!r}")


@dataclass(frozen=True)
class Target:
    """One backend given by name: ``kind`` is ``"a"`` (``name`` resolved to
    addresses, ``port`` from the config) or ``"srv"`` (ports and weights
    from the records); ``key`` is the backend's identity in the config."""

    key: str
    kind: str
    name: str
    port: int = 0
    resolve: str = "any"


@dataclass
class _State:
    #: "ip:port" → (weight from SRV or None, monotonic time last seen in a good answer)
    addresses: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    last_good: float | None = None
    resolutions: int = 0
    failures: int = 0
    last_error: str = ""


def _hostport(ip: str, port: int) -> str:
    return join_hostport(ip, port)


class Discovery:
    """The last good answer for each :class:`Target`, refreshed on demand.

    Not thread-safe; one asyncio loop. :meth:`refresh` never raises for a DNS
    failure (it records it); cancelling it leaves the previous answers.
    """

    def __init__(self, config: DnsConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[Target, _State] = {}
        self.config = config
        self._resolver = self._make_resolver(config)

    @staticmethod
    def _make_resolver(config: DnsConfig) -> Resolver:
        try:
            return Resolver(config.nameservers, timeout=config.timeout)
        except ValueError as exc:
            raise BalancerConfigError(
                "backends given by name need dns.nameservers: /etc/resolv.conf names none") from exc

    def configure(self, config: DnsConfig, targets: Iterable[Target]) -> list[Target]:
        """Use ``config`` and follow ``targets`` from now on; the answers of
        targets kept are kept. Returns the targets new to it (to resolve)."""
        if config != self.config:
            self._resolver = self._make_resolver(config)
            self.config = config
        wanted = list(dict.fromkeys(targets))
        for t in list(self._states):
            if t not in wanted:
                del self._states[t]
        new = [t for t in wanted if t not in self._states]
        for t in new:
            self._states[t] = _State()
        return new

    def snapshot(self) -> tuple[DnsConfig, dict[Target, _State]]:
        """What :meth:`restore` needs to undo a :meth:`configure` (a rejected reload)."""
        return self.config, dict(self._states)

    def restore(self, snapshot: tuple[DnsConfig, dict[Target, _State]]) -> None:
        config, states = snapshot
        if config != self.config:
            self._resolver = self._make_resolver(config)
            self.config = config
        self._states = dict(states)

    @property
    def targets(self) -> list[Target]:
        return list(self._states)

    def addresses(self, target: Target) -> list[tuple[str, int | None]]:
        """("ip:port", SRV weight or None) of ``target`` now, in answer order."""
        state = self._states.get(target)
        return [] if state is None else [(a, w) for a, (w, _) in state.addresses.items()]

    def resolved(self, target: Target) -> bool:
        state = self._states.get(target)
        return state is not None and state.last_good is not None

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per name: resolutions, failures, addresses in use, the last error."""
        return {
            t.key: {"resolutions": s.resolutions, "failures": s.failures, "addresses": len(s.addresses),
                    "last_error": s.last_error}
            for t, s in self._states.items()
        }

    async def refresh(self, targets: Iterable[Target] | None = None) -> bool:
        """Resolve ``targets`` (default: all) at once; True if any address set changed."""
        chosen = list(self._states) if targets is None else [t for t in targets if t in self._states]
        results = await asyncio.gather(*(self._lookup(t) for t in chosen), return_exceptions=True)
        changed = False
        for target, result in zip(chosen, results):
            if isinstance(result, BaseException) and not isinstance(result, ResolutionError):
                raise result
            state = self._states.get(target)
            if state is not None:  # configure() may have dropped it meanwhile
                changed |= self._record(target, state, result)
        return changed

    def _record(self, target: Target, state: _State, result: object) -> bool:
        now = self._clock()
        before = dict(state.addresses)
        state.resolutions += 1
        if isinstance(result, ResolutionError):
            state.failures += 1
            if str(result) != state.last_error:
                log.warning("dns: %s: %s; keeping its %d address(es)", target.key, result, len(state.addresses))
            state.last_error = str(result)
            hold = self.config.hold_valid
            if hold and state.addresses and state.last_good is not None and now - state.last_good >= hold:
                log.warning("dns: %s: no good answer for %g s (hold_valid): dropping its addresses", target.key, hold)
                state.addresses.clear()
        else:
            assert isinstance(result, list)
            if state.last_error:
                log.info("dns: %s resolves again", target.key)
            state.last_error = ""
            state.last_good = now
            if len(result) > self.config.max_addresses:
                log.warning("dns: %s gives %d addresses; using the first %d (dns.max_addresses)",
                            target.key, len(result), self.config.max_addresses)
                result = result[:self.config.max_addresses]
            fresh = {addr: (weight, now) for addr, weight in result}
            for addr, (weight, seen) in state.addresses.items():
                if addr not in fresh and now - seen < self.config.hold_obsolete:
                    fresh[addr] = (weight, seen)
            state.addresses = fresh
        if [(a, w) for a, (w, _) in before.items()] != [(a, w) for a, (w, _) in state.addresses.items()]:
            log.info("dns: %s → %s", target.key, ", ".join(state.addresses) or "no address")
            return True
        return False

    async def _lookup(self, target: Target) -> list[tuple[str, int | None]]:
        if target.kind == "srv":
            return await self._lookup_srv(target)
        ips, _ = await self._resolver.addresses(target.name, target.resolve)
        return [(_hostport(ip, target.port), None) for ip in ips]

    async def _lookup_srv(self, target: Target) -> list[tuple[str, int | None]]:
        answer, _ = await self._resolver.srv(target.name)
        records = [r for r in answer if r.port and r.target != "."]
        if not records:
            raise ResolutionError(f"{target.name} has no SRV record with a target")
        best = min(r.priority for r in records)  # the others are fallbacks, used when this group is gone
        records = [r for r in records if r.priority == best]
        resolved = await asyncio.gather(
            *(self._resolver.addresses(r.target, target.resolve) for r in records), return_exceptions=True)
        out: dict[str, int | None] = {}
        for r, result in zip(records, resolved):
            if isinstance(result, ResolutionError):
                log.warning("dns: %s: SRV target %s: %s", target.key, r.target, result)
                continue
            if isinstance(result, BaseException):
                raise result
            for ip in result[0]:
                # SRV weight 0 means "rarely", not "never"; the data plane's weights stop at 10000
                out.setdefault(_hostport(ip, r.port), min(max(r.weight, 1), 10_000))
        if not out:
            raise ResolutionError(f"{target.name}: no SRV target resolves")
        return list(out.items())
