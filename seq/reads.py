"""The read of a quorum round over peer links: one loop for the members'
coordinator and the snowflake workers' lease register.

The calls to the members go out at once; their answers are fed to a
:class:`seq.quorum.ReadTally` as they come, until it is decided. Calls still
running then are left to finish on their own (their outcome consumed, so
that nothing logs a lost exception).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from seq.peerlink import OK
from seq.quorum import Outcome, ReadTally

__all__ = ["consume", "read_round"]


def consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve a finished call's exception, if any: it is not waited for any more."""
    if not fut.cancelled():
        fut.exception()


async def read_round(tally: ReadTally, calls: Iterable[asyncio.Future[Any]],
                     refused: Callable[[Any], None] | None = None) -> int | None:
    """Feed `tally` the members' answers to a READ until it is decided; the
    maximum value over a read quorum, or None. ``refused(reply)`` sees each
    answer that is not OK (None: an error or a timeout), e.g. to notice a
    newer configuration."""
    pending = set(calls)
    try:
        while pending and tally.outcome is Outcome.PENDING:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                rep = None if t.cancelled() or t.exception() is not None else t.result()
                if rep is not None and rep[0] == OK:
                    tally.answered(rep[1])
                else:
                    if refused is not None:
                        refused(rep)
                    tally.failed()
    finally:
        for t in pending:
            t.add_done_callback(consume)
    return tally.value()
