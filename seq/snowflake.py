"""Time-ordered 64-bit IDs (Snowflake layout), sans-I/O: the bit layout, the generator, the decoder.

An ID is, from the top bit down::

    0 | milliseconds since the epoch (41) | worker (10) | sequence (12)

the Twitter/Leaf split (:data:`DEFAULT_BITS`); another split can be chosen
(:class:`Layout`), fixed for a deployment (every worker and decoder must use
the same split and epoch). The default epoch is :data:`DEFAULT_EPOCH`
(2024-01-01T00:00:00Z): 41 bits of milliseconds last about 69 years from it.

:class:`Generator` owns no clock: the caller passes the current time in
milliseconds and gets the first ID of a contiguous block (one millisecond,
consecutive sequence numbers), or a :class:`Wait` saying how long until it
may ask again (the sequence of this millisecond is used up, or the clock is
behind the last millisecond used by at most ``max_backward_ms``), or
:class:`~seq.errors.ClockMovedBackwards` beyond that bound. Every ID it
gives is above every ID it gave before, whatever the clock does.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from seq.errors import ClockMovedBackwards, SeqExhausted

__all__ = ["DEFAULT_BITS", "DEFAULT_EPOCH", "Generator", "Layout", "Wait", "decode", "parse_bits", "parse_epoch"]

#: (time, worker, sequence) bits: the Twitter/Leaf layout
DEFAULT_BITS = (41, 10, 12)
#: the default epoch, as accepted by ``--epoch``
DEFAULT_EPOCH = "2024-01-01T00:00:00Z"


def parse_epoch(text: str) -> int:
    """``2024-01-01T00:00:00Z`` (ISO 8601, a zone required) → Unix milliseconds."""
    try:
        t = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"epoch must be an ISO 8601 time such as {DEFAULT_EPOCH} (got {text[:40]!r})") from None
    if t.tzinfo is None:
        raise ValueError(f"epoch needs a time zone, e.g. {DEFAULT_EPOCH} (got {text[:40]!r})")
    ms = round(t.timestamp() * 1000)
    if ms < 0:
        raise ValueError("epoch must not be before 1970-01-01T00:00:00Z")
    return ms


def parse_bits(text: str) -> tuple[int, int, int]:
    """``41,10,12`` → (time, worker, sequence) bits."""
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"bits must be TIME,WORKER,SEQUENCE, e.g. 41,10,12 (got {text[:40]!r})")
    t, w, s = (int(p) for p in parts)
    return t, w, s


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The bit split and epoch of a deployment's IDs; checked when made."""

    epoch_ms: int = 1704067200000  # DEFAULT_EPOCH
    time_bits: int = DEFAULT_BITS[0]
    worker_bits: int = DEFAULT_BITS[1]
    sequence_bits: int = DEFAULT_BITS[2]

    def __post_init__(self) -> None:
        if self.time_bits + self.worker_bits + self.sequence_bits != 63:
            raise ValueError(
                f"time, worker and sequence bits must add up to 63 (the sign bit stays 0), got "
                f"{self.time_bits}+{self.worker_bits}+{self.sequence_bits}"
            )
        if self.time_bits < 32:
            raise ValueError("time bits must be at least 32 (about 50 days of milliseconds)")
        if not 1 <= self.worker_bits <= 16:
            raise ValueError("worker bits must be from 1 to 16")
        if not 1 <= self.sequence_bits <= 22:
            raise ValueError("sequence bits must be from 1 to 22")
        if self.epoch_ms < 0:
            raise ValueError("epoch must not be before 1970")

    @property
    def workers(self) -> int:
        return 1 << self.worker_bits

    @property
    def per_ms(self) -> int:
        """IDs one worker can issue in one millisecond (the largest count of one request)."""
        return 1 << self.sequence_bits

    @property
    def max_ms(self) -> int:
        return (1 << self.time_bits) - 1

    def compose(self, ms: int, worker: int, sequence: int) -> int:
        return (ms << (self.worker_bits + self.sequence_bits)) | (worker << self.sequence_bits) | sequence

    def split(self, id_: int) -> tuple[int, int, int]:
        """(ms since the epoch, worker, sequence) of an ID."""
        if not 0 <= id_ < 1 << 63:
            raise ValueError("an ID is an integer from 0 to 2**63-1")
        seq = id_ & ((1 << self.sequence_bits) - 1)
        worker = (id_ >> self.sequence_bits) & ((1 << self.worker_bits) - 1)
        return id_ >> (self.worker_bits + self.sequence_bits), worker, seq


def decode(id_: int, layout: Layout) -> dict[str, object]:
    """``{"id", "time" (ISO 8601, UTC), "ms" (since the epoch), "worker", "sequence"}``."""
    ms, worker, seq = layout.split(id_)
    wall = datetime.datetime.fromtimestamp((layout.epoch_ms + ms) / 1000, datetime.UTC)
    return {"id": id_, "time": wall.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "ms": ms, "worker": worker, "sequence": seq}


@dataclass(frozen=True, slots=True)
class Wait:
    """Ask again in `ms` milliseconds; `backwards`: the clock is behind (not just a full millisecond)."""

    ms: int
    backwards: bool


class Generator:
    """IDs of one worker. ``take(n, now_ms)`` → first ID of n contiguous ones, or a :class:`Wait`.

    `now_ms` is Unix milliseconds. :meth:`rebase` starts a new lease: the
    worker number, and the first millisecond (Unix) it may use. State is
    three integers; no allocation per call beyond the result.
    """

    __slots__ = (
        "_base",
        "_epoch",
        "_max_ms",
        "_per_ms",
        "_shift",
        "_wshift",
        "last_ms",
        "layout",
        "max_backward_ms",
        "seq",
        "worker",
    )

    def __init__(self, layout: Layout, *, max_backward_ms: int) -> None:
        if max_backward_ms < 0:
            raise ValueError("max_backward_ms must be >= 0")
        self.layout = layout
        self._epoch = layout.epoch_ms
        self._shift = layout.worker_bits + layout.sequence_bits
        self._wshift = layout.sequence_bits
        self._per_ms = layout.per_ms
        self._max_ms = layout.max_ms
        self.max_backward_ms = max_backward_ms
        self.worker = -1
        self._base = 0
        self.last_ms = -1  # ms since the epoch of the last ID (-1: none)
        self.seq = self._per_ms  # sequence numbers used in last_ms (full: the next ID needs a later ms)

    def rebase(self, worker: int, floor_unix_ms: int) -> None:
        """A new lease: IDs from now on carry `worker` and a time ≥ `floor_unix_ms`, and stay
        above every ID given before (the next one starts a new millisecond)."""
        if not 0 <= worker < self.layout.workers:
            raise ValueError("worker out of range")
        self.worker = worker
        self._base = worker << self._wshift
        self.last_ms = max(self.last_ms, floor_unix_ms - self._epoch - 1)
        self.seq = self._per_ms

    def take(self, n: int, now_ms: int) -> int | Wait:
        """First of `n` (1 ≤ n ≤ 2**sequence_bits) contiguous IDs at `now_ms` (Unix ms), or a Wait.

        Raises ClockMovedBackwards when the clock is behind the last millisecond
        used by more than ``max_backward_ms``; SeqExhausted past the time bits.
        """
        ms = now_ms - self._epoch
        last = self.last_ms
        if ms > last:
            if ms > self._max_ms:
                raise SeqExhausted(f"the {self.layout.time_bits}-bit time field is used up (epoch too old)")
            self.last_ms = ms
            self.seq = n
            return (ms << self._shift) | self._base
        if ms == last:
            s = self.seq
            if s + n <= self._per_ms:
                self.seq = s + n
                return (ms << self._shift) | self._base | s
            return Wait(1, False)
        behind = last - ms
        if behind <= self.max_backward_ms:
            return Wait(behind + (1 if self.seq + n > self._per_ms else 0), True)
        raise ClockMovedBackwards(behind, self.max_backward_ms)
