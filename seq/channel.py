"""ApiChannel: ``pb.RRAPI`` calls over the native gRPC client (:class:`rustext.GrpcClient`).

One HTTP/2 connection per server (made on first use, remade after a
failure), calls multiplexed as streams, all on one Rust thread. A call
returns an asyncio future at once; finished calls come back in batches: the
client makes one fd readable when its completion queue goes non-empty, and
the loop's reader callback takes every finished call in one native call and
resolves their futures. Any gRPC server works on the other end (grpc.aio
included: tests/seq/test_seq_grpc.py).

One channel serves many :class:`seq.RRSeq` of one event loop. An RRSeq
made without ``channel=`` leases the loop's channel for its server list
(:meth:`ApiChannel.lease`, reference-counted: the last sequence to close
closes it and its thread), the way grpc's own subchannel pool shares
connections among channels: 32 sequences with a channel (and a Rust
thread) each cost 3x the CPU per call of one shared channel, since every
completion then wakes the loop separately. Pass ``channel=`` to manage
one yourself (``await ch.aclose()`` after its sequences). Not thread-safe.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence

from rustext import GrpcClient
from seq.errors import RpcFailed, SeqClosed

Range = tuple[int, int]

# The channels leased per event loop and server list (see the module doc).
_LEASED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], ApiChannel]] = (
    weakref.WeakKeyDictionary()
)


class ApiChannel:
    """Calls to the RRAPI servers `servers` (HOST:PORT each), addressed by index."""

    def __init__(self, servers: Sequence[str], *, connect_timeout: float = 1.0) -> None:
        if not servers:
            raise ValueError("at least one server")
        self.servers = tuple(servers)
        self._connect_timeout = connect_timeout
        self._native: GrpcClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        self._futs: dict[int, asyncio.Future[Range]] = {}
        self._closed = False
        self._leases = 0

    @classmethod
    def lease(cls, servers: Sequence[str]) -> ApiChannel:
        """The running loop's shared channel to `servers`; give it back with :meth:`release`."""
        loop = asyncio.get_running_loop()
        key = tuple(servers)
        by_servers = _LEASED.setdefault(loop, {})
        ch = by_servers.get(key)
        if ch is None or ch._closed:
            ch = by_servers[key] = cls(key)
        ch._leases += 1
        return ch

    async def release(self) -> None:
        """Give back a lease; the last one closes the channel."""
        self._leases -= 1
        if self._leases > 0:
            return
        loop = asyncio.get_running_loop()
        by_servers = _LEASED.get(loop, {})
        if by_servers.get(self.servers) is self:
            del by_servers[self.servers]
        await self.aclose()

    def _client(self) -> GrpcClient:
        native = self._native
        if native is not None:
            return native
        if self._closed:
            raise SeqClosed("channel is closed")
        loop = asyncio.get_running_loop()
        native = GrpcClient(list(self.servers), connect_timeout=self._connect_timeout)
        self._native, self._loop = native, loop
        self._fd = native.fileno()
        loop.add_reader(self._fd, self._on_done)
        return native

    def _future(self, token: int) -> asyncio.Future[Range]:
        assert self._loop is not None
        fut: asyncio.Future[Range] = self._loop.create_future()
        self._futs[token] = fut
        return fut

    def next_id(self, server: int, name: str, n: int, timeout: float) -> asyncio.Future[Range]:
        """A future of (from_id, to_id); it fails with RpcFailed (the call's gRPC status)."""
        return self._future(self._client().next_id(server, name, n, timeout))

    def cur_id(self, server: int, name: str, timeout: float) -> asyncio.Future[Range]:
        """A future of (cur_id, 0)."""
        return self._future(self._client().cur_id(server, name, timeout))

    def set_id(self, server: int, name: str, new_id: int, timeout: float) -> asyncio.Future[Range]:
        """A future of (success, 0)."""
        return self._future(self._client().set_id(server, name, new_id, timeout))

    def _on_done(self) -> None:
        native = self._native
        if native is None:
            return
        futs = self._futs
        for token, code, a, b, msg in native.take():
            fut = futs.pop(token, None)
            if fut is None or fut.done():  # the caller gave up (cancelled)
                continue
            if code == 0:
                fut.set_result((a, b))
            else:
                fut.set_exception(RpcFailed(code, msg or ""))

    async def aclose(self) -> None:
        """Stop the native client (its thread joined); calls in flight fail with SeqClosed. Idempotent."""
        self._closed = True
        native, self._native = self._native, None
        if native is None:
            return
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._fd = -1
        await asyncio.get_running_loop().run_in_executor(None, native.close)
        futs, self._futs = self._futs, {}
        for fut in futs.values():
            if not fut.done():
                fut.set_exception(SeqClosed("channel is closed"))
