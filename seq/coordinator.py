"""The coordinator: turns NextID requests into quorum rounds (rrseq.md, Algorithm).

One round for name `x`, asked for n IDs in total:

1. read: h = the maximum high-water mark over a read quorum R;
2. compare-and-set every member from h to h + n: a member accepts only if
   its value is ≤ h, and says yes after its fsync; this member's own store
   is one of them;
3. on W yeses the round owns [h, h + n); otherwise it retries until the
   requests' deadlines.

How the read is done. Every compare-and-set reply carries the member's
value, so a compare-and-set is also a read: W yeses are W ≥ R members that
hold nothing above h (a read quorum whose maximum is at most h), and a
failed one that got R answers gives the next h (their maximum). So when
this member votes, a round proposes h = max(its own value, what the last
round learned) and lets the compare-and-set confirm it against a quorum;
an explicit read of R members (this one counted once) is made only when
this member does not vote or when fewer than R members answered. This
saves one network round trip per round and is no weaker: safety never rests
on the read at all (below), only the choice of an h that will be accepted.

Retries: a conflict (another coordinator took h) is retried at once with
the values learned; further failures back off with full jitter (uniform in
[0, min(cap, base·2^k)]), so competing coordinators spread out instead of
colliding forever (no livelock; ``stats`` counts conflicts and attempts).

Why it is safe whatever sizes are mixed: any two write quorums share a
member; that member accepted both writes, the second only if its value (the
first write's end) was ≤ the second's h, so the two ranges cannot overlap.

A preferred coordinator per name avoids those conflicts in the first place:
the name's hash picks one member (``preferred``); the others forward their
batched requests for that name to it (one ``Acquire`` peer call per batch)
and split the range it returns. If it cannot be reached they run rounds
themselves (it is a preference for speed, not a leader: correctness never
depends on it) and try it again after a backoff.

Requests for the same name that arrive while a round runs are served
together by the next one (their sizes added, the range split in arrival
order). ``max_inflight`` > 1 lets several rounds per name run at once, each
proposing the value the previous one is moving to (this member applies its
own compare-and-set at once, so its value already says where the last round
ends); the default 1 measured best on a CPU-bound machine (bigger batches,
fewer calls). Either way any two acknowledged ranges are disjoint (the
argument above does not care about timing), and a range acknowledged after
another one was acknowledged is above it, so each client's stream stays
increasing. A request that is cancelled or expires leaves its share as a
gap, never reused.

Membership changes (:mod:`seq.membership`): every read and compare-and-set
carries the configuration epoch this member votes in; a member in another
epoch, or fenced for a change, answers WRONG_EPOCH or NOT_READY, which
counts as no answer. :meth:`Coordinator.reconfigure` swaps the member list
and quorums between rounds (a round in flight finishes with the list it
started with, in its epoch); a newer epoch seen in a reply is reported to
``on_newer_epoch``. A member that is not (or no longer) a member refuses
every request with the error of :meth:`Coordinator.refuse`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rustext.backoff import BackoffPolicy

from seq.errors import SeqExhausted, StoreError
from seq.log import MAX_VALUE
from seq.peerlink import EXHAUSTED, OK, OP_ACQUIRE, OP_CAS, OP_READ, WRONG_EPOCH, PeerLink
from seq.quorum import Outcome, ReadTally, WriteTally
from seq.reads import consume, read_round
from seq.store import Store

log = logging.getLogger("seq.coordinator")

Range = tuple[int, int]

LINGER_MIN_BATCH = 4  # a round that served at least this many requests lets the next one linger


class Sink(Protocol):
    """Where a request's outcome goes: an asyncio future, or anything with the same three methods
    (the native gRPC endpoint's per-call object, see :mod:`seq.api`)."""

    def done(self) -> bool: ...
    def set_result(self, result: Range | None, /) -> None: ...
    def set_exception(self, exc: BaseException, /) -> None: ...


@dataclass(slots=True)
class _Request:
    n: int
    fut: Sink
    deadline: float
    forward: bool


@dataclass
class CoordinatorStats:
    requests: int = 0
    rounds_won: int = 0
    rounds_conflict: int = 0  # lost a compare-and-set race (contention)
    rounds_no_quorum: int = 0  # too few members answered
    requests_expired: int = 0
    forwarded: int = 0  # batches served by the preferred coordinator
    forward_failures: int = 0
    ids_issued: int = 0
    max_attempts: int = 0  # most attempts one round needed
    attempts_hist: dict[int, int] = field(default_factory=dict)


class Coordinator:
    """Serves ``acquire(name, n, deadline)`` with quorum rounds. One per server."""

    def __init__(
        self,
        *,
        store: Store,
        votes: Callable[[], bool],
        peers: Sequence[PeerLink],
        peer_addrs: Sequence[str] = (),
        self_addr: str = "",
        cluster: str,
        read_quorum: int,
        write_quorum: int,
        peer_timeout: float,
        backoff_base: float,
        backoff_cap: float,
        on_store_failure: Callable[[BaseException], None],
        max_inflight: int = 1,
        linger: float = 0.0,
        rng: random.Random | None = None,
        epoch: int = 1,
        on_newer_epoch: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._votes = votes
        self._peers: list[PeerLink] = []
        self._ring: list[tuple[str, PeerLink | None]] = []
        self._cluster = cluster
        self._epoch = epoch
        self._r = read_quorum
        self._w = write_quorum
        self.reconfigure(peers=peers, peer_addrs=peer_addrs, self_addr=self_addr, cluster=cluster, epoch=epoch,
                         read_quorum=read_quorum, write_quorum=write_quorum)
        self._on_newer_epoch = on_newer_epoch
        #: set by refuse(): every request fails with it (a removed member, one not yet a member)
        self.refusal: BaseException | None = None
        self._down_until: dict[str, float] = {}
        self._down_count: dict[str, int] = {}
        self._peer_timeout = peer_timeout
        self._backoff = BackoffPolicy(initial=min(backoff_base, backoff_cap), maximum=backoff_cap, jitter=1.0)
        self._on_store_failure = on_store_failure
        self._rng = rng or random.Random()
        self._queues: dict[str, list[_Request]] = {}
        self._inflight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._max_inflight = max_inflight
        self._linger = linger
        self._closed = False
        self.stats = CoordinatorStats()

    def reconfigure(
        self,
        *,
        peers: Sequence[PeerLink],
        peer_addrs: Sequence[str],
        self_addr: str,
        cluster: str,
        epoch: int,
        read_quorum: int,
        write_quorum: int,
    ) -> None:
        """A new configuration: the other members, this member's epoch, the quorums.
        Rounds started from now on use it; rounds in flight end in their own epoch."""
        self._peers = list(peers)
        # Preferred coordinator per name: hash over the sorted member list (same on every member).
        by_addr = dict(zip(peer_addrs, self._peers))
        self._ring = [(a, by_addr.get(a)) for a in sorted((self_addr, *peer_addrs))] if peer_addrs else []
        self._cluster = cluster
        self._epoch = epoch
        self._r = read_quorum
        self._w = write_quorum

    def refuse(self, exc: BaseException | None) -> None:
        """Fail every request (and those waiting) with `exc`; None: serve again."""
        self.refusal = exc
        if exc is None:
            return
        for q in self._queues.values():
            for r in q:
                if not r.fut.done():
                    r.fut.set_exception(exc)
        self._queues.clear()

    def _newer(self, epoch: object) -> None:
        if type(epoch) is int and epoch > self._epoch and self._on_newer_epoch is not None:
            self._on_newer_epoch(epoch)

    def preferred(self, name: str) -> tuple[str, PeerLink | None] | None:
        """The member that coordinates `name` by preference (stub None: this one)."""
        if not self._ring:
            return None
        return self._ring[zlib.crc32(name.encode()) % len(self._ring)]

    async def acquire(self, name: str, n: int, deadline: float, *, forward: bool = True) -> Range | None:
        """[from, to) with to - from == n, or None when no quorum was reached by `deadline`.

        `deadline` is on the loop's clock. Cancelling the caller is safe: its
        share of a round in flight becomes a gap.
        """
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Range | None] = loop.create_future()
        self.submit(name, n, deadline, fut, forward=forward)
        return await fut

    def submit(self, name: str, n: int, deadline: float, sink: Sink, *, forward: bool = True) -> None:
        """Like :meth:`acquire`, without a coroutine: the outcome goes to `sink`.

        Requests submitted for one name in the same loop turn are served by one round.
        """
        if self._closed:
            sink.set_result(None)
            return
        if self.refusal is not None:
            sink.set_exception(self.refusal)
            return
        self._queues.setdefault(name, []).append(_Request(n, sink, deadline, forward))
        self.stats.requests += 1
        self._kick(name)

    def _kick(self, name: str, *, after: int = 0) -> None:
        """Start a round for `name` if requests wait and fewer than max_inflight run."""
        if self._closed:
            return
        if name in self._queues and self._inflight.get(name, 0) < self._max_inflight:
            self._inflight[name] = self._inflight.get(name, 0) + 1
            t = asyncio.get_running_loop().create_task(self._round(name, after), name=f"seq-round-{name}")
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    def _forwards(self, name: str) -> bool:
        """Whether a batch of `name` would be forwarded (not coordinated here) right now."""
        pref = self.preferred(name)
        if pref is None or pref[1] is None:
            return False
        return self._down_until.get(pref[0], 0.0) <= asyncio.get_running_loop().time()

    async def aclose(self) -> None:
        """Cancel the rounds; waiting requests get None (no range). Idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for q in self._queues.values():
            for r in q:
                if not r.fut.done():
                    r.fut.set_result(None)
        self._queues.clear()

    async def _round(self, name: str, after: int) -> None:
        """One batch; `after`: how many requests the round just before this one served (0: none)."""
        batch: list[_Request] = []
        try:
            if after >= LINGER_MIN_BATCH and self._linger > 0 and not self._forwards(name):
                # Back-to-back rounds with several requests each mean load: let the batch
                # grow a little (fewer rounds, fsyncs and peer calls per ID: the cluster is
                # CPU-bound there). A request at an idle name, or light load, starts at once.
                await asyncio.sleep(self._linger)
            await self._serve(name, batch)
        except BaseException as exc:
            for r in batch:
                if not r.fut.done():
                    if isinstance(exc, Exception):
                        r.fut.set_exception(exc)
                    else:
                        r.fut.set_result(None)
            if not isinstance(exc, Exception):
                raise
            if not isinstance(exc, SeqExhausted):
                log.exception("round for %r failed", name)
        finally:
            left = self._inflight.get(name, 1) - 1
            if left:
                self._inflight[name] = left
            else:
                self._inflight.pop(name, None)
            self._kick(name, after=len(batch))

    async def _serve(self, name: str, batch: list[_Request]) -> None:
        loop = asyncio.get_running_loop()
        hint: int | None = None
        attempt = 0
        while True:
            batch.extend(self._queues.pop(name, ()))
            now = loop.time()
            live = []
            for r in batch:
                if r.fut.done():
                    continue
                if r.deadline <= now:
                    r.fut.set_result(None)
                    self.stats.requests_expired += 1
                    continue
                live.append(r)
            batch[:] = live
            if not batch:
                return
            if self.refusal is not None:
                for r in batch:
                    r.fut.set_exception(self.refusal)
                return
            total = sum(r.n for r in batch)
            deadline = max(r.deadline for r in batch)
            attempt += 1
            pref = self.preferred(name)
            if pref is not None and all(r.forward for r in batch):
                addr, stub = pref
                if stub is not None and self._down_until.get(addr, 0.0) <= now:
                    got = await self._forward(addr, stub, name, total, deadline)
                    if got is not None:
                        self._split(batch, got[0])
                        self.stats.forwarded += 1
                        return
            h: int | None
            if self._votes():
                h = max(self._store.get(name), hint or 0)
            else:
                h = hint if hint is not None else await self._read(name, deadline)
            if h is None:
                self.stats.rounds_no_quorum += 1
            else:
                if h + total > MAX_VALUE:
                    err = SeqExhausted(f"sequence {name!r} would pass 2**63-1")
                    for r in batch:
                        if not r.fut.done():
                            r.fut.set_exception(err)
                    return
                won, hint = await self._write(name, h, h + total, deadline)
                if won:
                    self._split(batch, h)
                    self.stats.rounds_won += 1
                    self.stats.ids_issued += total
                    self.stats.max_attempts = max(self.stats.max_attempts, attempt)
                    self.stats.attempts_hist[attempt] = self.stats.attempts_hist.get(attempt, 0) + 1
                    return
                if hint is None:
                    self.stats.rounds_no_quorum += 1
                else:
                    self.stats.rounds_conflict += 1
            if attempt == 1 and hint is not None:
                continue  # a first conflict: retry at once with the values just learned
            # full jitter (uniform up to min(cap, base * 2^k)), never past the first deadline
            first = min((r.deadline for r in batch if not r.fut.done()), default=now)
            delay = min(self._backoff.delay(attempt, self._rng), max(0.0, first - loop.time()))
            await asyncio.sleep(delay)

    @staticmethod
    def _split(batch: list[_Request], start: int) -> None:
        for r in batch:
            if not r.fut.done():
                r.fut.set_result((start, start + r.n))
            start += r.n

    async def _forward(self, addr: str, link: PeerLink, name: str, total: int, deadline: float) -> Range | None:
        loop = asyncio.get_running_loop()
        timeout = min(deadline - loop.time(), 2 * self._peer_timeout)
        if timeout <= 0:
            return None
        # The preferred member answers [0, 0) a little before our deadline, not after it.
        remote = timeout - min(0.05, timeout * 0.1)
        try:
            rep = await link.call([OP_ACQUIRE, self._cluster, name, total, remote], timeout)
            status, lo, hi = rep[0], rep[1], rep[2]
        except Exception:
            k = self._down_count.get(addr, 0) + 1
            self._down_count[addr] = k
            self._down_until[addr] = loop.time() + min(5.0, 0.25 * (1 << min(k - 1, 5))) * (0.5 + self._rng.random() / 2)
            self.stats.forward_failures += 1
            return None
        if status == EXHAUSTED:
            raise SeqExhausted(f"sequence {name!r} would pass 2**63-1")
        if status != OK or hi - lo != total or lo == 0:
            self.stats.forward_failures += 1
            return None  # no quorum there (or not its name): try a round here
        self._down_count.pop(addr, None)
        return lo, hi

    def _timeout(self, deadline: float) -> float:
        return min(self._peer_timeout, deadline - asyncio.get_running_loop().time())

    async def _read(self, name: str, deadline: float) -> int | None:
        """Max value over a read quorum, or None."""
        peers = self._peers
        tally = ReadTally(asked=len(peers) + 1, read_quorum=self._r)
        if self._votes():
            tally.answered(self._store.get(name))
        else:
            tally.failed()
        timeout = self._timeout(deadline)
        if tally.outcome is not Outcome.PENDING or timeout <= 0:
            return tally.value()
        req = [OP_READ, self._cluster, name, self._epoch]
        return await read_round(tally, [p.call(req, timeout) for p in peers], self._refused)

    def _refused(self, rep: Any) -> None:
        if rep is not None and rep[0] == WRONG_EPOCH:
            self._newer(rep[-1])

    async def _write(self, name: str, h: int, new: int, deadline: float) -> tuple[bool, int | None]:
        """Compare-and-set h → new on every member; (won, next h or None)."""
        # this round's members and quorums, whatever reconfigure() does meanwhile
        peers, epoch = self._peers, self._epoch
        tally = WriteTally(asked=len(peers) + 1, write_quorum=self._w, read_quorum=self._r)
        member: dict[asyncio.Future[Any], int] = {}
        local: asyncio.Future[None] | None = None
        if self._votes():
            try:
                accepted, cur, fut = self._store.cas(name, h, new)
            except StoreError as exc:
                self._on_store_failure(exc)
                raise
            if accepted and fut is not None:
                tally.observe(0, cur)  # its yes counts once on disk
                local = fut
                member[fut] = 0
            else:
                tally.rejected(0, cur)
        else:
            tally.failed(0)
        timeout = self._timeout(deadline)
        if timeout > 0:
            req = [OP_CAS, self._cluster, name, h, new, epoch]
            for i, p in enumerate(peers, 1):
                member[p.call(req, timeout)] = i
        else:
            for i in range(1, len(peers) + 1):
                tally.failed(i)
        pending = set(member)
        try:
            while pending and tally.outcome is Outcome.PENDING:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    i = member[t]
                    if t is local:
                        err = t.exception()
                        if err is not None:
                            self._on_store_failure(err)
                            tally.failed(i)
                        else:
                            tally.accepted(i)
                        continue
                    rep = None if t.cancelled() or t.exception() is not None else t.result()
                    if rep is None or rep[0] != OK:
                        if rep is not None and rep[0] == WRONG_EPOCH:
                            self._newer(rep[-1])
                        tally.failed(i)
                    elif rep[1]:
                        tally.accepted(i, rep[2])
                    else:
                        tally.rejected(i, rep[2])
        finally:
            for t in pending:
                if t is not local:
                    t.add_done_callback(consume)
        if tally.outcome is Outcome.WON:
            return True, None
        return False, tally.next_h()
