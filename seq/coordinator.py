"""The coordinator: turns NextID requests into quorum rounds (rrseq.md, Algorithm).

One round for name `x`, asked for n IDs in total:

1. read the high-water mark from a read quorum R (this member counted once,
   only when it votes) and keep the maximum h;
2. compare-and-set every member from h to h + n (a member accepts only if
   its value is ≤ h, and says yes after fsync); this member's own store is
   one of them;
3. on W yeses the round owns [h, h + n); otherwise it backs off (full
   jitter, doubling up to a cap) and retries until the requests' deadlines.
   The replies of a failed compare-and-set carry each member's value; when
   R of them answered, their maximum is the next h (a read quorum), so a
   retry skips the read.

Why it is safe whatever sizes are mixed: any two write quorums share a
member; that member accepted both writes, the second only if its value (the
first write's end) was ≤ the second's h, so the two ranges cannot overlap.

Requests for the same name that arrive while a round is running are served
together by the next round (their sizes added, the range split in arrival
order): under load, one quorum round serves many requests. A request that
is cancelled or expires leaves its share as a gap, never reused.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from seq._proto import rrpeer_pb2 as peer_pb
from seq.errors import SeqExhausted, StoreError
from seq.log import MAX_VALUE
from seq.store import Store
from seq.wire import PeerStub

log = logging.getLogger("seq.coordinator")

Range = tuple[int, int]


@dataclass(slots=True)
class _Request:
    n: int
    fut: asyncio.Future[Range | None]
    deadline: float


@dataclass
class CoordinatorStats:
    requests: int = 0
    rounds_won: int = 0
    rounds_conflict: int = 0  # lost a compare-and-set race (contention)
    rounds_no_quorum: int = 0  # too few members answered
    requests_expired: int = 0
    ids_issued: int = 0
    max_attempts: int = 0  # most attempts one round needed
    attempts_hist: dict[int, int] = field(default_factory=dict)


def _consume(t: asyncio.Future[Any]) -> None:
    if not t.cancelled():
        t.exception()


class Coordinator:
    """Serves ``acquire(name, n, deadline)`` with quorum rounds. One per server."""

    def __init__(
        self,
        *,
        store: Store,
        votes: Callable[[], bool],
        peers: Sequence[PeerStub],
        cluster: str,
        read_quorum: int,
        write_quorum: int,
        peer_timeout: float,
        backoff_base: float,
        backoff_cap: float,
        on_store_failure: Callable[[BaseException], None],
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._votes = votes
        self._peers = list(peers)
        self._cluster = cluster
        self._r = read_quorum
        self._w = write_quorum
        self._peer_timeout = peer_timeout
        self._base = backoff_base
        self._cap = backoff_cap
        self._on_store_failure = on_store_failure
        self._rng = rng or random.Random()
        self._queues: dict[str, list[_Request]] = {}
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self.stats = CoordinatorStats()

    async def acquire(self, name: str, n: int, deadline: float) -> Range | None:
        """[from, to) with to - from == n, or None when no quorum was reached by `deadline`.

        `deadline` is on the loop's clock. Cancelling the caller is safe: its
        share of a round in flight becomes a gap.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Range | None] = loop.create_future()
        self._queues.setdefault(name, []).append(_Request(n, fut, deadline))
        self.stats.requests += 1
        if name not in self._drivers:
            self._drivers[name] = loop.create_task(self._drive(name), name=f"seq-round-{name}")
        return await fut

    async def aclose(self) -> None:
        tasks = list(self._drivers.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for q in self._queues.values():
            for r in q:
                if not r.fut.done():
                    r.fut.set_result(None)
        self._queues.clear()

    async def _drive(self, name: str) -> None:
        batch: list[_Request] = []
        try:
            while name in self._queues:
                batch = []
                await self._serve(name, batch)
        except BaseException as exc:
            for r in batch + self._queues.pop(name, []):
                if not r.fut.done():
                    if isinstance(exc, Exception):
                        r.fut.set_exception(exc)
                    else:
                        r.fut.set_result(None)
            if not isinstance(exc, Exception):
                raise
            log.exception("round for %r failed", name)
        finally:
            self._drivers.pop(name, None)

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
            total = sum(r.n for r in batch)
            deadline = max(r.deadline for r in batch)
            attempt += 1
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
                    start = h
                    for r in batch:
                        if not r.fut.done():
                            r.fut.set_result((start, start + r.n))
                        start += r.n
                    self.stats.rounds_won += 1
                    self.stats.ids_issued += total
                    self.stats.max_attempts = max(self.stats.max_attempts, attempt)
                    self.stats.attempts_hist[attempt] = self.stats.attempts_hist.get(attempt, 0) + 1
                    return
                if hint is None:
                    self.stats.rounds_no_quorum += 1
                else:
                    self.stats.rounds_conflict += 1
            # Full jitter: uniform in [0, min(cap, base * 2^attempt)], never past the first deadline.
            window = min(self._cap, self._base * (1 << min(attempt, 16)))
            first = min((r.deadline for r in batch if not r.fut.done()), default=now)
            delay = min(self._rng.uniform(0, window), max(0.0, first - loop.time()))
            await asyncio.sleep(delay)

    def _timeout(self, deadline: float) -> float:
        return min(self._peer_timeout, deadline - asyncio.get_running_loop().time())

    async def _read(self, name: str, deadline: float) -> int | None:
        """Max value over a read quorum, or None."""
        values: list[int] = []
        if self._votes():
            values.append(self._store.get(name))
        need = self._r - len(values)
        if need <= 0:
            return max(values)
        timeout = self._timeout(deadline)
        if timeout <= 0 or len(self._peers) < need:
            return None
        req = peer_pb.ReadRequest(cluster=self._cluster, name=name)
        pending = {asyncio.ensure_future(p.Read(req, timeout=timeout)) for p in self._peers}
        try:
            while pending and need > 0 and len(pending) >= need:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.cancelled() or t.exception() is not None:
                        continue
                    rep = t.result()
                    if rep.status == peer_pb.OK:
                        values.append(rep.value)
                        need -= 1
        finally:
            for t in pending:
                t.add_done_callback(_consume)
        return max(values) if need <= 0 else None

    async def _write(self, name: str, h: int, new: int, deadline: float) -> tuple[bool, int | None]:
        """Compare-and-set h → new on every member; (won, next h hint or None)."""
        currents: list[int] = []
        pending: set[asyncio.Future[Any]] = set()
        local: asyncio.Future[None] | None = None
        if self._votes():
            try:
                accepted, cur, fut = self._store.cas(name, h, new)
            except StoreError as exc:
                self._on_store_failure(exc)
                raise
            currents.append(cur)
            if accepted and fut is not None:
                local = fut
                pending.add(fut)
        timeout = self._timeout(deadline)
        if timeout > 0:
            req = peer_pb.CasRequest(cluster=self._cluster, name=name, expected=h, new_value=new)
            pending.update(asyncio.ensure_future(p.CompareAndSet(req, timeout=timeout)) for p in self._peers)
        yes = 0
        try:
            while pending and yes < self._w and yes + len(pending) >= self._w:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is local:
                        if t.exception() is not None:
                            self._on_store_failure(t.exception())  # type: ignore[arg-type]
                        else:
                            yes += 1
                        continue
                    if t.cancelled() or t.exception() is not None:
                        continue
                    rep = t.result()
                    if rep.status == peer_pb.OK:
                        currents.append(rep.current)
                        if rep.ok:
                            yes += 1
        finally:
            for t in pending:
                if t is not local:
                    t.add_done_callback(_consume)
        if yes >= self._w:
            return True, None
        return False, (max(currents) if len(currents) >= self._r else None)
