"""Callers of a juggler server in a loop, and the promises every call must
keep under a fault: each CALL answered (its result, an error RES, or a NACK)
within its timeout plus a bound, exactly one RES per ACKed call, none after a
NACK other than 504. Shared by the juggler fault tests."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from juggler.client import ACK, NACK, RES, Client, new_uuid
from juggler.errors import JugglerError
from tests.netutil import wait_until

#: a call's timeout in these tests (s); its RES, or its NACK, comes within RES_BOUND more
CALL_TIMEOUT, RES_BOUND = 5.0, 2.5
#: the bound on service coming back once a fault ends (s)
RECOVERY = 10.0


@dataclass
class Call:
    uri: str
    expected: Any
    sent: float
    ack: float | None = None
    nack: tuple[float, int] | None = None
    res: list[tuple[float, Any]] = field(default_factory=list)

    @property
    def answered_at(self) -> float | None:
        if self.nack is not None:
            return self.nack[0]
        return self.res[0][0] if self.res else None

    @property
    def ok(self) -> bool:
        return self.nack is None and len(self.res) == 1 and self.res[0][1] == self.expected


class Traffic:
    """Callers in a loop, one call at a time each; every CALL, and the ACK,
    NACK and RES that came for it, with their times."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.calls: dict[str, Call] = {}
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def on_message(self, msg: dict[str, Any], _raw: str) -> None:
        payload = msg["payload"]
        call = self.calls.get(payload.get("for", ""))
        if call is None:
            return
        t, kind = self.loop.time(), msg["meta"]["type"]
        if kind == ACK:
            call.ack = t
        elif kind == NACK:
            call.nack = (t, payload.get("code"))
        elif kind == RES:
            call.res.append((t, payload.get("args")))

    def start(self, c: Client, uri: str, arg: str, expected: Any, callers: int = 3) -> None:
        async def caller() -> None:
            while not self.stopping.is_set():
                msg_uuid = new_uuid()
                self.calls[msg_uuid] = Call(uri, expected, self.loop.time())
                try:
                    await c.call(uri, arg, timeout=CALL_TIMEOUT, msg_uuid=msg_uuid)
                except JugglerError:
                    await asyncio.sleep(0.05)  # as a client that retries: no spinning on NACKs

        self.tasks += [asyncio.ensure_future(caller()) for _ in range(callers)]

    def of(self, uri: str, since: float = 0.0, until: float = float("inf")) -> list[Call]:
        return [c for c in self.calls.values() if c.uri == uri and since <= c.sent < until]

    async def back(self, c: Client, uri: str, arg: str, expected: Any, bound: float = RECOVERY) -> float:
        """Seconds until a call to ``uri`` succeeds (within ``bound``)."""
        t0 = self.loop.time()

        async def ok() -> bool:
            with contextlib.suppress(JugglerError):
                return await c.call(uri, arg, timeout=1.0) == expected
            return False

        await wait_until(ok, bound, interval=0.05, what=f"calls to {uri} succeeding again")
        return self.loop.time() - t0

    async def stop(self) -> None:
        """Stop calling, then wait (bounded) for every call to be answered, and check
        the promises that hold for every call."""
        self.stopping.set()
        await asyncio.wait(self.tasks, timeout=CALL_TIMEOUT + 5)
        await wait_until(lambda: all(c.answered_at is not None for c in self.calls.values()),
                         CALL_TIMEOUT + RES_BOUND + 5, interval=0.05, what=lambda: f"every call answered: {self.unanswered()}")
        for msg_uuid, c in self.calls.items():
            at = c.answered_at
            assert at is not None and at - c.sent <= CALL_TIMEOUT + RES_BOUND, (msg_uuid, c)
            assert len(c.res) <= 1, f"call {msg_uuid} got {len(c.res)} RES"
            if c.nack is not None:
                assert c.ack is None, (msg_uuid, c)
                assert c.nack[1] in (500, 504), (msg_uuid, c)
                assert c.nack[1] == 504 or not c.res, f"call {msg_uuid} NACKed {c.nack[1]} and still answered"
            else:
                assert c.ack is not None and c.res, (msg_uuid, c)
                args = c.res[0][1]
                assert args == c.expected or "call timed out" in str(args), (msg_uuid, c)

    def unanswered(self) -> list[Call]:
        return [c for c in self.calls.values() if c.answered_at is None][:3]


