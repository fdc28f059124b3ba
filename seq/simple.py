"""SimpleBufSeq: the single-process baseline (a local counter behind the RRSeq interface)."""

from __future__ import annotations

from seq.buffered import BufferedSeq


class LocalCounter:
    """The source of SimpleBufSeq: hands out ranges of one in-process counter."""

    def __init__(self, start: int = 1) -> None:
        self._next = start

    def take(self, n: int) -> tuple[int, int]:
        lo = self._next
        self._next = lo + n
        return lo, lo + n


class SimpleBufSeq(BufferedSeq):
    """IDs from a local counter, through the same buffer as RRSeq.

    Sequences built on one `counter` share it (like RRSeq clients of one
    cluster); by default each has its own, starting at 1. Not durable, one
    process: it exists to measure what the distribution costs (benches/seq).
    """

    _local = True

    def __init__(self, buf_size: int = 0, *, counter: LocalCounter | None = None, max_fetch: int | None = None) -> None:
        super().__init__(buf_size, max_fetch=max_fetch)
        self._counter = counter or LocalCounter()

    def _fetch_now(self, n: int) -> tuple[int, int]:
        return self._counter.take(n)

    async def _fetch(self, n: int) -> tuple[int, int]:
        return self._counter.take(n)
