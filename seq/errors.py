"""The seq exception tree: one root, and subclasses that also inherit the builtin they mean.

    SeqError
    ├── SeqUnavailable (ConnectionError)   no quorum / no server before the deadline
    │   ├── ClockMovedBackwards            a snowflake worker's clock went back past the bound
    │   └── NoLease                        a snowflake worker holds no valid worker-ID lease
    ├── SeqClosed (RuntimeError)           the sequence or server was closed
    ├── SeqInconsistent                    the cluster handed out a range below one already seen
    ├── SeqExhausted (OverflowError)       the 63-bit ID space of a name is used up
    ├── RpcFailed                          one gRPC call ended with a non-OK status (client side)
    ├── UnsafeStart (RuntimeError)         a server refuses to start (data dir vs flags)
    ├── MemberRemoved (RuntimeError)       this member was removed from the cluster: it serves nothing
    ├── MembershipError (RuntimeError)     a membership change (or listing) could not be made
    │   └── ChangeRefused (ValueError)     ... because it was asked wrongly (not a member, too few left, …)
    └── StoreError (OSError)               the durable store failed (write or fsync)
        └── StoreCorrupt (ValueError)      the log is damaged beyond a torn tail
"""

from __future__ import annotations


class SeqError(Exception):
    """Root of every error raised by the seq package."""


class SeqUnavailable(SeqError, ConnectionError):
    """No range could be obtained before the deadline (no quorum, no reachable server)."""


class ClockMovedBackwards(SeqUnavailable):
    """The clock is behind the last millisecond a snowflake worker used by more than it may wait."""

    code = "clock_moved_backwards"

    def __init__(self, behind_ms: int, bound_ms: int) -> None:
        super().__init__(f"the clock moved backwards by {behind_ms} ms (more than the {bound_ms} ms this "
                         "worker waits out); refusing to issue IDs until it catches up")
        self.behind_ms = behind_ms
        self.bound_ms = bound_ms


class NoLease(SeqUnavailable):
    """A snowflake worker holds no valid worker-ID lease (not yet, or it could not renew it in time)."""

    code = "no_lease"


class SeqClosed(SeqError, RuntimeError):
    """The sequence (or server) is closed."""


class SeqInconsistent(SeqError):
    """The cluster returned a range below an ID already handed out.

    Only possible after a majority of members lost their data (see
    docs/seq.md, "Majority data loss"); the client refuses the range rather than hand out
    an ID twice.
    """


class SeqExhausted(SeqError, OverflowError):
    """The sequence reached the end of the 63-bit ID space."""


class RpcFailed(SeqError):
    """One gRPC call ended with a non-OK status (`code`: the gRPC status number)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(f"{_CODE_NAMES.get(code, code)}: {details}")
        self.code = code
        self.details = details

    @property
    def code_name(self) -> str:
        return _CODE_NAMES.get(self.code, str(self.code))


_CODE_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class UnsafeStart(SeqError, RuntimeError):
    """The server refuses to start: its data directory and flags do not fit together."""


class MemberRemoved(SeqError, RuntimeError):
    """This member was removed from the cluster by a membership change; it serves nothing."""


class MembershipError(SeqError, RuntimeError):
    """A membership change could not be made (or the configuration not read): unreachable
    members, another change in progress, no majority; the message says what to do."""


class ChangeRefused(MembershipError, ValueError):
    """A membership change was asked wrongly: the member is already in (or not in) the
    configuration, the removal would leave too few members, the new member was not started
    with ``--join``."""


class StoreError(SeqError, OSError):
    """The durable store could not write or fsync; it refuses further writes."""


class StoreCorrupt(StoreError, ValueError):
    """The log is damaged somewhere other than a torn tail: refuse to guess."""
