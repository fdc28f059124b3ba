"""Worker-ID leases kept in the seq cluster itself (no ZooKeeper), for snowflake workers.

The register. Worker ID ``w`` has one sequence name of its own,
``__snowflake/worker/<w>`` (:func:`lease_name`), held by the members like any
other name. Its value is the lease's **expiry, in Unix milliseconds**. A
worker moves it only by a quorum compare-and-set, the very primitive NextID
rounds use (rrseq.md, Algorithm; ``["c", cluster, name, h, new, epoch]`` on
every member): a member accepts ``h → new`` only if its value is ≤ h, and
the move wins on W yeses, W a majority. Two such moves from the same h
cannot both win; more generally the winning moves of one name form a chain
of disjoint intervals ``[h₁, new₁) [h₂, new₂) …`` with ``newᵢ ≤ hᵢ₊₁``
(any two write quorums share a member, which accepted the second move only
if its value, at least the first's `new`, was ≤ the second's h).

Taking a lease (:meth:`LeaseHolder.acquire`). Read the value v of a worker
ID from a read quorum (its maximum); the lease is free once the local clock
is past ``v + skew`` (``--max-clock-skew-ms``: how far two workers' clocks
may disagree), otherwise try the next worker ID. Then move ``v → E`` with
``E = max(now + ttl, v + 1)``. Won: this worker holds ``w`` until E.
Renewing (every ``ttl / 3``): move ``E → E'`` from the value it last won,
never from a value it merely read or proposed.

What a holder may issue. IDs whose timestamp t (Unix ms) is in
``[v, E)``: at least the value it replaced, below the expiry it last won,
and only while its monotonic clock is before ``sent + (E - now_at_send) -
margin``, ``sent`` the moment it sent the winning move (``--lease-margin``:
it stops serving that long before expiry; failing to renew by then it
answers ``no_lease`` until a renewal wins or it takes another lease).

Why no ID is issued twice. IDs of different worker IDs differ in their
worker bits; one process's IDs strictly increase (seq.snowflake). For one
worker ID, a tenure (an acquisition and the renewals that followed it, each
renewal moving from the value the previous one won, so consecutive in the
chain) covers the chain interval ``[v, E_last)``, and its IDs have
timestamps in that interval. Tenures are disjoint runs of a chain of
disjoint intervals, so two tenures' IDs differ in their timestamps. This
holds whatever the clocks do: a paused or slow holder, a clock stepped
back or forward, only cost availability. It persists nothing on the
worker: a restarted worker takes a lease again and its IDs are above the
value it replaced, which is at least every timestamp the previous holder
of that worker ID could use (Leaf keeps that last timestamp in ZooKeeper;
here it is the lease value itself).

Why a live holder is not displaced (never two live holders of a worker
ID). The holder stops at ``E - margin`` by its monotonic clock, measured
from before it sent the move; a taker waits until its own clock is past
``E + skew``. With clocks within `skew` of each other and a monotonic clock
that does not run more than `margin` slow over a ttl, the taker comes after
the holder stopped. If that assumption fails, two processes may serve the
same worker ID for a while — still with disjoint timestamps, above.

Ambiguous answers (a move that timed out) are never taken as wins; a
holder that cannot tell keeps its last won value and retries from it; a
taker that read a value above it (a partly applied move) waits for that
value's expiry like any other.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from seq.errors import SeqUnavailable
from seq.log import MAX_VALUE
from seq.peerlink import (
    OK,
    OP_ACQUIRE,
    OP_CAS,
    OP_INFO,
    OP_READ,
    WRONG_CLUSTER,
    WRONG_EPOCH,
    PeerLink,
)
from seq.quorum import Outcome, ReadTally, WriteTally
from seq.reads import consume, read_round

__all__ = ["RESERVED_MESSAGE", "RESERVED_PREFIX", "LeaseConfig", "LeaseHolder", "QuorumRegister", "lease_name"]

log = logging.getLogger("seq.lease")

PREFIX = "__snowflake/"
#: names clients may not draw from or set (the members' APIs refuse them; reading them is allowed)
RESERVED_PREFIX = PREFIX
RESERVED_MESSAGE = f"names starting with {PREFIX} are reserved for the worker-ID leases of snowflake workers"


def lease_name(worker: int) -> str:
    """The sequence name holding worker ID `worker`'s lease (reserved: do not draw IDs from it)."""
    return f"{PREFIX}worker/{worker}"


ROTOR = PREFIX + "next"  # NextID on it spreads the workers' first choices


class QuorumRegister:
    """Quorum read and compare-and-set of names on all `members` (this process is not one).

    Membership changes (seq.membership): every read and compare-and-set
    carries the configuration epoch the register was given, so members vote
    only in that configuration's rounds, as they do for a member's own rounds;
    a member answering in a newer epoch (or another cluster id) is reported
    to `on_stale` (the worker then learns the configuration again and calls
    :meth:`configure`). A lease stays a chain of compare-and-sets whatever
    epoch each one was made in: the change carries every value over.
    """

    def __init__(self, links: Sequence[PeerLink], cluster: str, *, timeout: float, epoch: int = 1,
                 on_stale: Any = None) -> None:
        self._links: list[PeerLink] = []
        self._cluster = cluster
        self._epoch = epoch
        self._q = 1
        self.configure(links, cluster, epoch)
        self._timeout = timeout
        self._on_stale = on_stale

    def configure(self, links: Sequence[PeerLink], cluster: str, epoch: int) -> None:
        """The members (links), cluster id and epoch of the configuration to use from now on."""
        self._links = list(links)
        self._cluster = cluster
        self._epoch = epoch
        self._q = len(self._links) // 2 + 1

    def _stale(self, rep: Any) -> None:
        if self._on_stale is None or rep is None:
            return
        if rep[0] == WRONG_CLUSTER or (rep[0] == WRONG_EPOCH and type(rep[-1]) is int and rep[-1] > self._epoch):
            self._on_stale()

    async def read(self, name: str) -> int | None:
        """The maximum over a read quorum, or None (too few members answered)."""
        tally = ReadTally(asked=len(self._links), read_quorum=self._q)
        req = [OP_READ, self._cluster, name, self._epoch]
        return await read_round(tally, [p.call(req, self._timeout) for p in self._links], self._stale)

    async def cas(self, name: str, h: int, new: int) -> bool:
        """Move `name` h → new on a write quorum; True only on W durable yeses.

        False covers both "lost" and "could not tell" (some yeses, then
        timeouts): the caller treats the move as not made, and must not
        assume it was not either.
        """
        if not 0 <= h < new <= MAX_VALUE:
            raise ValueError("need 0 <= h < new <= 2**63-1")
        tally = WriteTally(asked=len(self._links), write_quorum=self._q, read_quorum=self._q)
        req = [OP_CAS, self._cluster, name, h, new, self._epoch]
        pending = {p.call(req, self._timeout) for p in self._links}
        ids = {t: i for i, t in enumerate(pending)}
        try:
            while pending and tally.outcome is Outcome.PENDING:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    rep = None if t.cancelled() or t.exception() is not None else t.result()
                    if rep is None or rep[0] != OK:
                        self._stale(rep)
                        tally.failed(ids[t])
                    elif rep[1]:
                        tally.accepted(ids[t], rep[2])
                    else:
                        tally.rejected(ids[t], rep[2])
        finally:
            for t in pending:
                t.add_done_callback(consume)
        return tally.outcome is Outcome.WON

    async def misconfigured(self) -> list[str]:
        """The members that answer that they belong to another cluster than the register's (a
        --cluster naming members of two clusters)."""
        out = []
        for p in self._links:
            try:
                rep = await p.call([OP_INFO, "", ""], self._timeout)
            except Exception:  # noqa: BLE001, S112  # unreachable: not known to be misconfigured
                continue
            if rep[0] == OK and isinstance(rep[1], dict) and rep[1].get("cluster") not in ("", self._cluster):
                out.append(p.addr)
        return out

    async def next(self, name: str) -> int | None:
        """One ID of the counter `name` from any member (NextID through the peer link), or None."""
        for p in random.sample(self._links, len(self._links)):
            try:
                rep = await p.call([OP_ACQUIRE, self._cluster, name, 1, self._timeout * 0.9], self._timeout)
            except Exception as exc:  # noqa: BLE001  # any failure of this member: ask the next one
                log.debug("counter %s from %s failed: %s", name, p.addr, exc)
                continue
            if rep[0] == OK and rep[1] > 0:
                return int(rep[1])
        return None


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    """Times in milliseconds. margin < ttl / 3 keeps one renewal attempt per period before the stop."""

    ttl_ms: int = 10_000  # a lease lasts this long from each renewal
    margin_ms: int = 2_000  # stop serving this long before expiry (by the monotonic clock)
    skew_ms: int = 1_000  # a taker waits this long past expiry (clocks may disagree this much)
    retry_ms: int = 200  # pause between renewal attempts that failed, and between scans for a free worker ID

    def __post_init__(self) -> None:
        if self.ttl_ms < 100:
            raise ValueError("lease ttl must be at least 100 ms")
        if not 0 < self.margin_ms < self.ttl_ms * 2 // 3:
            raise ValueError("lease margin must be above 0 and below 2/3 of the ttl")
        if self.skew_ms < 0:
            raise ValueError("clock skew must be >= 0")
        if self.retry_ms <= 0:
            raise ValueError("retry must be > 0")

    @property
    def renew_ms(self) -> int:
        return self.ttl_ms // 3


@dataclass(frozen=True, slots=True)
class Tenure:
    """A lease won: worker ID, IDs from `floor_ms` (Unix ms) up to below `expiry_ms`,
    served until `serve_until` on the loop's clock."""

    worker: int
    floor_ms: int
    expiry_ms: int
    serve_until: float


class LeaseHolder:
    """Takes, renews and gives up one worker-ID lease; see the module docstring.

    ``now_ms()`` is the wall clock in Unix ms (the worker's, shiftable in
    tests); the loop's monotonic clock bounds serving. ``on_change(tenure or
    None)`` is called on every win (acquisition or renewal) and on loss.
    """

    def __init__(
        self,
        register: QuorumRegister,
        *,
        workers: int,
        config: LeaseConfig,
        now_ms: Callable[[], int],
        on_change: Callable[[Tenure | None], None],
    ) -> None:
        self._reg = register
        self._workers = workers
        self._cfg = config
        self._now_ms = now_ms
        self._on_change = on_change
        self.tenure: Tenure | None = None
        self.renewals = 0
        self.renewal_failures = 0
        self.losses = 0

    async def acquire(self, stopped: Callable[[], bool] = lambda: False) -> Tenure:
        """Scan worker IDs (from a spot spread by a cluster counter) until one is won."""
        loop = asyncio.get_running_loop()
        start = await self._reg.next(ROTOR)
        k = (start if start is not None else random.randrange(self._workers)) % self._workers
        warned = False
        while not stopped():
            soonest: int | None = None
            for i in range(self._workers):
                w = (k + i) % self._workers
                name = lease_name(w)
                v = await self._reg.read(name)
                if v is None:
                    if not warned:
                        warned = True
                        wrong = await self._reg.misconfigured()
                        if wrong:
                            log.error("%s answer that they form another cluster: --cluster must name members "
                                      "of one cluster, with their addresses as the members list each other",
                                      ", ".join(wrong))
                    break  # no quorum: wait and scan again
                now = self._now_ms()
                if now <= v + self._cfg.skew_ms:
                    soonest = v + self._cfg.skew_ms if soonest is None else min(soonest, v + self._cfg.skew_ms)
                    continue  # held (or not safely expired yet)
                expiry = min(max(now + self._cfg.ttl_ms, v + 1), MAX_VALUE)
                sent = loop.time()
                if await self._reg.cas(name, v, expiry):
                    t = Tenure(w, v, expiry, sent + (expiry - now - self._cfg.margin_ms) / 1000)
                    self.tenure = t
                    log.info("leased worker ID %d until %d (Unix ms); IDs from %d", w, expiry, v)
                    self._on_change(t)
                    return t
            await asyncio.sleep(self._cfg.retry_ms / 1000)
        raise SeqUnavailable("stopped while taking a lease")

    async def renew(self) -> bool:
        """One renewal from the value last won; False if it did not win (lost or no quorum)."""
        t = self.tenure
        if t is None:
            return False
        loop = asyncio.get_running_loop()
        now = self._now_ms()
        expiry = min(max(now + self._cfg.ttl_ms, t.expiry_ms + 1), MAX_VALUE)
        sent = loop.time()
        if await self._reg.cas(lease_name(t.worker), t.expiry_ms, expiry):
            if self.tenure is not t:
                return False  # given up meanwhile
            nt = Tenure(t.worker, t.floor_ms, expiry, sent + (expiry - now - self._cfg.margin_ms) / 1000)
            self.tenure = nt
            self.renewals += 1
            self._on_change(nt)
            return True
        self.renewal_failures += 1
        return False

    async def keep(self, stopped: Callable[[], bool] = lambda: False) -> None:
        """Acquire, then renew every ttl/3 for ever; past the serving bound with no renewal,
        give the worker ID up and take a lease again. Cancel to stop."""
        loop = asyncio.get_running_loop()
        while not stopped():
            if self.tenure is None:
                await self.acquire(stopped)
                continue
            await asyncio.sleep(self._cfg.renew_ms / 1000)
            while self.tenure is not None and not await self.renew():
                if loop.time() >= self.tenure.serve_until:
                    log.warning("could not renew the lease of worker ID %d before its serving bound: "
                                "stopped serving; taking a lease again", self.tenure.worker)
                    self.losses += 1
                    self.tenure = None
                    self._on_change(None)
                    break
                await asyncio.sleep(self._cfg.retry_ms / 1000)
