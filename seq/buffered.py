"""The buffer shared by :class:`seq.RRSeq` and :class:`seq.SimpleBufSeq`.

A sequence hands out IDs from a current range ``[cur, end)`` and keeps at
most one more range queued. With ``buf_size`` ≥ 1 it asks for ``buf_size``
IDs at a time and starts fetching the next range in the background as soon
as half of the current one is used (double buffering), so consumers rarely
wait. With ``buf_size`` 0 nothing is fetched ahead: each fetch asks for as
many IDs as there are callers waiting at that moment (one for a lone
caller), so no ID is taken that no one asked for.

Adaptive prefetch: when consumers drain a range faster than a background
fetch takes, the next fetch asks for more IDs: four times as many when they
had to wait for it, twice as many when it arrived with less than 1/16 of
the current range left; up to
``max_fetch`` (default 64 × ``buf_size``); when a fetched range arrives
while more than a quarter of the current one is still unused, the size
halves again, down to ``buf_size``. So ``buf_size`` is the least a
fetch asks for and the size a slow consumer keeps; a consumer outpacing the
round trip gets ranges big enough to hide it, with one fetch in flight
(hence no reordering and no gaps). What a sequence holds unused at any time
is at most two ranges of at most ``max_fetch`` IDs each (lost as a gap if
the process dies). ``max_fetch=buf_size`` turns the adaptation off.

At most one fetch is in flight, and ranges are used in the order they were
obtained, so the IDs one sequence hands out are strictly increasing, in the
order ``next()`` returns them, whichever task calls it. A range below an
ID already handed out is refused (:class:`SeqInconsistent`).

Safe to share among tasks of one event loop. Not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from seq.errors import SeqClosed, SeqError, SeqInconsistent

log = logging.getLogger("seq.client")

# Loop turns a consumer gives a remote fetch it just started (task start, the gRPC
# call's own task, the send).
_PREFETCH_YIELDS = 3


class BufferedSeq:
    """Base class: subclasses implement :meth:`_fetch` (and may implement :meth:`_fetch_now`)."""

    _local = False  # True when _fetch_now always answers (a local source: refills never wait)

    def __init__(self, buf_size: int, *, max_fetch: int | None = None) -> None:
        if buf_size < 0:
            raise ValueError("buf_size must be >= 0")
        if max_fetch is not None and max_fetch < buf_size:
            raise ValueError("max_fetch must be >= buf_size")
        self.buf_size = buf_size
        self.max_fetch = buf_size * 64 if max_fetch is None else max_fetch
        self.fetch_size = buf_size  # what the next background fetch asks for (adaptive)
        self._background = False  # the fetch in flight was started ahead of need
        self._cur = 0
        self._end = 0
        self._start = 0
        self._refill_at = -1  # handing out this ID starts a background fetch
        self._queued: tuple[int, int] | None = None
        self._fetch_task: asyncio.Task[BaseException | None] | None = None
        self._waiting = 0
        self._high = 0  # one past the highest ID ever obtained: ranges must start at or above it
        self._closed = False

    # -- to implement -----------------------------------------------------------

    async def _fetch(self, n: int) -> tuple[int, int]:
        """Obtain a fresh range [from, to) of n IDs, or raise a SeqError."""
        raise NotImplementedError

    def _fetch_now(self, n: int) -> tuple[int, int] | None:
        """A range without waiting, when the source is local (None: use _fetch)."""
        return None

    async def _close_source(self) -> None:
        pass

    # -- public API -------------------------------------------------------------

    async def next(self) -> int:
        """The next ID. Raises SeqUnavailable (no range before the deadline) or SeqClosed."""
        cur = self._cur
        if cur < self._end:
            if cur == self._refill_at:
                if not self._local:
                    return await self._next_slow()  # yields while the fetch goes out
                self._refill_at = -1
                self._prefetch()
            self._cur = cur + 1
            return cur
        return await self._next_slow()

    async def stream(self) -> AsyncIterator[int]:
        """``async for id in seq.stream()``: IDs until the sequence is closed (ends quietly)."""
        while True:
            cur = self._cur
            if cur < self._end and (cur != self._refill_at or self._local):
                if cur == self._refill_at:
                    self._refill_at = -1
                    self._prefetch()
                self._cur = cur + 1
                yield cur
                continue
            try:
                cur = await self._next_slow()
            except SeqClosed:
                return
            yield cur

    async def aclose(self) -> None:
        """Stop fetching; waiting callers get SeqClosed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cur = self._end = 0
        self._queued = None
        if self._fetch_task is not None:
            self._fetch_task.cancel()
            await asyncio.gather(self._fetch_task, return_exceptions=True)
        await self._close_source()

    async def __aenter__(self) -> BufferedSeq:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals --------------------------------------------------------------

    def _install(self, rng: tuple[int, int]) -> None:
        lo, hi = rng
        if lo < self._high or hi <= lo:
            raise SeqInconsistent(f"range [{lo}, {hi}) is below ID {self._high - 1} already obtained")
        self._high = hi
        if self._cur < self._end:
            if self._local:  # refills never wait: nothing to adapt
                self._queued = rng
                return
            left, size = self._end - self._cur, self._end - self._start
            if left * 4 > size:
                # Arrived with more than a quarter of the current range unused: the
                # consumers are slower than a round trip, fetch less next time.
                self.fetch_size = max(self.buf_size, self.fetch_size // 2)
            elif left * 16 < size and self.buf_size:
                # Arrived just in time: grow before the consumers run dry.
                self.fetch_size = min(self.max_fetch, self.fetch_size * 2)
            self._queued = rng
            return
        self._set_current(lo, hi)

    def _set_current(self, lo: int, hi: int) -> None:
        self._cur, self._end, self._start = lo, hi, lo
        self._refill_at = max(lo, hi - 1 - (hi - lo) // 2) if self.buf_size else -1

    def _prefetch(self) -> bool:
        """Start the background fetch; True when one went out to a remote source."""
        if self._fetch_task is None and self._queued is None and not self._closed:
            now = self._fetch_now(self.fetch_size)
            if now is not None:
                self._install(now)  # a local source: no task needed
                return False
            self._start_fetch(self.fetch_size, background=True)
            return True
        return False

    def _start_fetch(self, n: int, *, background: bool = False) -> None:
        self._background = background
        self._fetch_task = asyncio.get_running_loop().create_task(self._run_fetch(n))

    async def _run_fetch(self, n: int) -> BaseException | None:
        """Fetch and install one range; returns the error (for the waiters) instead of raising."""
        try:
            rng = await self._fetch(n)
            if not self._closed:
                self._install(rng)
            return None
        except SeqError as exc:
            if self._waiting == 0:
                log.warning("background fetch failed: %s", exc)
            return exc
        finally:
            self._fetch_task = None

    async def _next_slow(self) -> int:
        while True:
            if self._closed:
                raise SeqClosed("sequence is closed")
            cur = self._cur
            if cur < self._end:
                if cur == self._refill_at:
                    self._refill_at = -1
                    if self._prefetch():
                        # Let the fetch send its request now. Consumers that never block
                        # (every next() served from the buffer) would otherwise keep the loop
                        # from starting it until the buffer ran dry, and every refill would
                        # cost a full round trip of waiting. Done before taking an ID, so
                        # IDs still come out increasing in the order next() returns them.
                        for _ in range(_PREFETCH_YIELDS):
                            await asyncio.sleep(0)
                    continue
                self._cur = cur + 1
                return cur
            if self._queued is not None:
                lo, hi = self._queued
                self._queued = None
                self._set_current(lo, hi)
                continue
            if self._fetch_task is None:
                n = max(self.fetch_size, self._waiting + 1)
                now = self._fetch_now(n)
                if now is not None:
                    self._install(now)
                    continue
                self._start_fetch(n)
            elif self._background and self.buf_size:
                # Ran dry while the prefetch was still in flight: ask for (much) more next time.
                self._background = False
                self.fetch_size = min(self.max_fetch, self.fetch_size * 4)
            task = self._fetch_task
            assert task is not None
            self._waiting += 1
            try:
                err = await asyncio.shield(task)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if self._closed and (me is None or not me.cancelling()):
                    raise SeqClosed("sequence is closed") from None
                raise
            finally:
                self._waiting -= 1
            if err is not None and self._cur >= self._end and self._queued is None:
                raise err
