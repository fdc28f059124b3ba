"""ApiChannel: ``pb.RRAPI`` calls over the native gRPC client (:class:`rustext.GrpcClient`).

One HTTP/2 connection per server (made on first use, remade after a
failure), calls multiplexed as streams, all on one Rust thread. A call
returns an asyncio future at once; finished calls come back in batches: the
client makes one fd readable when its completion queue goes non-empty, and
the loop's reader callback takes every finished call in one native call and
resolves their futures. Any gRPC server works on the other end (grpc.aio
included: tests/seq/test_seq_grpc.py).

One channel serves many :class:`seq.RRSeq` of one event loop: make one
(``async with ApiChannel(servers) as ch``) and pass it to each sequence
(``RRSeq(name, buf, channel=ch)``), the way a grpc channel is shared by its
stubs. 32 sequences with a channel (and a Rust thread) each cost 3x the CPU
per call of one shared channel, since every completion then wakes the loop
separately; a sequence made without a channel opens one of its own. There
is no process-wide registry: the channel is the object that is shared.

:meth:`ApiChannel.cancel` cancels a call in Rust too: one not sent yet never
is, one running has its HTTP/2 stream reset; either way it frees its place
at once (a cancelled fetch of :class:`seq.RRSeq` does it). Not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rustext import GrpcClient
from rustext.tls import ClientTls
from seq.errors import RpcFailed, SeqClosed

Range = tuple[int, int]

class ApiChannel:
    """Calls to the RRAPI servers `servers` (HOST:PORT each), addressed by index.

    `tls` (a :class:`rustext.tls.ClientTls`): gRPC over TLS, each server
    verified against its CA (or the system's trust store) and its host name."""

    def __init__(self, servers: Sequence[str], *, connect_timeout: float = 1.0, tls: ClientTls | None = None) -> None:
        if not servers:
            raise ValueError("at least one server")
        self.servers = tuple(servers)
        self.tls = tls
        self._connect_timeout = connect_timeout
        self._native: GrpcClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        self._futs: dict[int, asyncio.Future[Range]] = {}
        self._closed = False

    async def __aenter__(self) -> ApiChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _client(self) -> GrpcClient:
        native = self._native
        if native is not None:
            return native
        if self._closed:
            raise SeqClosed("channel is closed")
        loop = asyncio.get_running_loop()
        tls = self.tls
        native = GrpcClient(list(self.servers), connect_timeout=self._connect_timeout,
                            **({} if tls is None else {"tls": True, "tls_ca": tls.ca, "tls_cert": tls.cert,
                                                       "tls_key": tls.key, "tls_insecure": tls.insecure}))
        self._native, self._loop = native, loop
        self._fd = native.fileno()
        loop.add_reader(self._fd, self._on_done)
        return native

    def _future(self, token: int) -> asyncio.Future[Range]:
        assert self._loop is not None
        fut: asyncio.Future[Range] = self._loop.create_future()
        self._futs[token] = fut
        return fut

    def cancel(self, fut: asyncio.Future[Range]) -> bool:
        """Cancel the call behind `fut` (one of this channel's) in the native
        client too: not sent yet, it never is; running, its HTTP/2 stream is
        reset; `fut` is cancelled. False when it had finished. (Cancelling
        `fut` alone only drops the result when it comes; RRSeq calls this
        when its fetch is cancelled.) Looks through the calls in flight, so
        it is for giving up, not for every call."""
        for token, f in self._futs.items():
            if f is fut:
                del self._futs[token]
                native = self._native
                if native is not None:
                    native.cancel(token)
                fut.cancel()
                return True
        return False

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
