"""Vote counting for one quorum round, sans-I/O (no network, no clock).

The coordinator feeds each member's answer in as it arrives and asks
whether the round is decided; tested on its own in tests/seq/test_seq_quorum.py.
"""

from __future__ import annotations

from enum import Enum


class Outcome(Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


class WriteTally:
    """Answers to one compare-and-set h → h + n sent to `asked` members.

    Each member ends in exactly one of: ``accepted`` (a durable yes),
    ``rejected`` (its value was above h), ``failed`` (error, timeout, not
    voting). ``observe`` records a value before the member's final answer
    (this member's own store answers at once, its yes waits for the fsync).
    Every value seen is also a read: :meth:`next_h` is the maximum once at
    least `read_quorum` members gave one, else None (read again).
    """

    def __init__(self, *, asked: int, write_quorum: int, read_quorum: int) -> None:
        if not 1 <= write_quorum <= asked or read_quorum < 1:
            raise ValueError("need 1 <= write_quorum <= asked and read_quorum >= 1")
        self._w = write_quorum
        self._r = read_quorum
        self._pending = asked
        self.yes = 0
        self._values: dict[int, int] = {}  # member -> value seen

    def observe(self, member: int, current: int) -> None:
        self._values[member] = max(current, self._values.get(member, 0))

    def accepted(self, member: int, current: int | None = None) -> None:
        if current is not None:
            self.observe(member, current)
        self._final()
        self.yes += 1

    def rejected(self, member: int, current: int) -> None:
        self.observe(member, current)
        self._final()

    def failed(self, member: int) -> None:
        self._final()

    def _final(self) -> None:
        if self._pending == 0:
            raise RuntimeError("more answers than members asked")
        self._pending -= 1

    @property
    def outcome(self) -> Outcome:
        if self.yes >= self._w:
            return Outcome.WON
        if self.yes + self._pending < self._w:
            return Outcome.LOST
        return Outcome.PENDING

    def next_h(self) -> int | None:
        """Max value over the members that answered, if they are a read quorum."""
        if len(self._values) < self._r:
            return None
        return max(self._values.values())


class ReadTally:
    """Values from a read quorum: decided once `read_quorum` members answered."""

    def __init__(self, *, asked: int, read_quorum: int) -> None:
        self._r = read_quorum
        self._pending = asked
        self._values: list[int] = []

    def answered(self, value: int) -> None:
        self._pending -= 1
        self._values.append(value)

    def failed(self) -> None:
        self._pending -= 1

    @property
    def outcome(self) -> Outcome:
        if len(self._values) >= self._r:
            return Outcome.WON
        if len(self._values) + self._pending < self._r:
            return Outcome.LOST
        return Outcome.PENDING

    def value(self) -> int | None:
        """The maximum, once a read quorum answered."""
        return max(self._values) if len(self._values) >= self._r else None
