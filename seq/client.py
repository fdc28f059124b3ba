"""RRSeq: the client of an RRSeq cluster, with a double buffer (see :mod:`seq.buffered`).

Servers are tried round robin. A server that fails (unreachable, error,
timeout) is skipped for a backoff that doubles per consecutive failure (100
ms up to 5 s, with jitter); a server that answers "no quorum" ([0, 0)) is
skipped briefly too. When every server is being skipped, the client sleeps
until the first one may be tried again, never spinning, and a fetch that
cannot complete within `timeout` raises :class:`SeqUnavailable` with the
last reason.

Calls go through an :class:`seq.channel.ApiChannel` (the native gRPC client:
one HTTP/2 connection per server, calls completed in batches), its own or
one shared by several sequences of the same loop (``channel=``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from rustext.backoff import BackoffPolicy
from rustext.tls import ClientTls

from seq.buffered import BufferedSeq
from seq.channel import ApiChannel
from seq.errors import RpcFailed, SeqExhausted, SeqUnavailable

OUT_OF_RANGE = 11
FAILED_PRECONDITION = 9  # the server was removed from the cluster (seq.membership)


class _Server:
    __slots__ = ("addr", "index", "failures", "retry_at", "removed")

    def __init__(self, addr: str, index: int) -> None:
        self.addr = addr
        self.index = index
        self.failures = 0
        self.retry_at = 0.0
        self.removed = False


class RRSeq(BufferedSeq):
    """IDs of sequence `name` from the servers `servers` (HOST:PORT).

    `timeout` bounds one fetch (all retries included); `attempt_timeout`
    bounds one server's answer (default: a third of `timeout`), so one hung
    server cannot use a whole fetch's time. `max_fetch` caps the adaptive
    fetch size (default 64 × `buf_size`; see :mod:`seq.buffered`).
    `tls` (a :class:`rustext.tls.ClientTls`): the servers speak TLS (for
    the sequence's own channel). `channel`: an :class:`ApiChannel` to use, shared with other sequences
    (its servers are used when `servers` is empty; the caller closes it);
    without one, the sequence opens a channel of its own to `servers` on its
    first fetch and closes it in :meth:`aclose`.
    """

    def __init__(
        self,
        name: str,
        buf_size: int,
        servers: Sequence[str] = (),
        *,
        timeout: float = 5.0,
        attempt_timeout: float | None = None,
        backoff_min: float = 0.1,
        backoff_max: float = 5.0,
        max_fetch: int | None = None,
        rng: random.Random | None = None,
        channel: ApiChannel | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        super().__init__(buf_size, max_fetch=max_fetch)
        if channel is not None and tls is not None:
            raise ValueError("give tls to the channel, not to a sequence that shares it")
        self._tls = tls
        if channel is not None and not servers:
            servers = channel.servers
        if not servers:
            raise ValueError("at least one server")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.name = name
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout or timeout / 3
        self._backoff = BackoffPolicy(initial=min(backoff_min, backoff_max), maximum=backoff_max)
        self._rng = rng or random.Random()
        self._addrs = tuple(servers)
        self._owns_channel = channel is None
        self._channel = channel  # opened on the first fetch when None (needs the running loop)
        known = {a: i for i, a in enumerate(channel.servers if channel is not None else self._addrs)}
        missing = [a for a in servers if a not in known]
        if missing:
            raise ValueError(f"servers {missing} are not in the channel's list")
        self._servers = [_Server(a, known[a]) for a in servers]
        self._rr = 0

    async def _fetch(self, n: int) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        reason = "no server tried"
        channel = self._channel
        if channel is None:
            channel = self._channel = ApiChannel(self._addrs, tls=self._tls)
        while True:
            now = loop.time()
            if now >= deadline:
                raise SeqUnavailable(f"no range of {self.name!r} within {self.timeout}s: {reason}")
            server = self._pick(now)
            if server is None:
                if all(s.removed for s in self._servers):
                    raise SeqUnavailable(f"no range of {self.name!r}: every server given was removed from the "
                                         f"cluster ({reason}); give the current members")
                wake = min(s.retry_at for s in self._servers if not s.removed)
                await asyncio.sleep(max(0.0, min(wake, deadline) - now))
                continue
            call = channel.next_id(server.index, self.name, n, min(self.attempt_timeout, deadline - now))
            try:
                lo, hi = await call
            except asyncio.CancelledError:
                channel.cancel(call)  # the call too, not only our wait for it
                raise
            except RpcFailed as exc:
                if exc.code == OUT_OF_RANGE:
                    raise SeqExhausted(exc.details or "sequence exhausted") from exc
                reason = f"{server.addr}: {exc.code_name} {exc.details}"
                if exc.code == FAILED_PRECONDITION:
                    server.removed = True
                    continue
                self._failed(server, loop.time())
                continue
            if hi <= lo or lo == 0:
                reason = f"{server.addr}: no quorum"
                self._failed(server, loop.time(), soft=True)
                continue
            server.failures = 0
            return lo, hi

    def _pick(self, now: float) -> _Server | None:
        k = len(self._servers)
        for i in range(k):
            s = self._servers[(self._rr + i) % k]
            if s.retry_at <= now and not s.removed:
                self._rr = (self._rr + i + 1) % k
                return s
        return None

    def _failed(self, server: _Server, now: float, *, soft: bool = False) -> None:
        server.failures += 1
        server.retry_at = now + self._backoff.delay(1 if soft else server.failures, self._rng)

    async def _close_source(self) -> None:
        if self._owns_channel and self._channel is not None:
            await self._channel.aclose()
