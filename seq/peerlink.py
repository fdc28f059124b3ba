"""The member-to-member hot path over :mod:`rpc.transport` (frame wire, msgpack payloads).

A round costs the coordinator one call per other member (read or
compare-and-set) and a forwarded batch one ``acquire`` call. Over grpc.aio
each such call cost ~250 µs of CPU (both ends: the C core's poller thread,
the loop wake-up, per-call objects); over one multiplexed rpc.transport
connection per peer it costs a small fraction of that. The rare calls (a
joining member's snapshot, and the discovery of the transport port) stay on
gRPC (``RRPeer``).

Messages (msgpack arrays; every request starts with the op and the cluster
id, a member of another cluster answers WRONG_CLUSTER)::

    ["r", cluster, name, epoch]                 -> [status, value]           (WRONG_EPOCH: [s, its epoch])
    ["c", cluster, name, expected, new, epoch]  -> [status, ok, current]     (after fsync when ok;
                                                                              WRONG_EPOCH: [s, False, its epoch])
    ["a", cluster, name, count, timeout_s]      -> [status, from, to]        ([0, 0): no quorum)

and the membership calls (:mod:`seq.membership`; rare, may be large)::

    ["i", cluster or "", ""]                                  -> [OK, info map]
    ["f", cluster, "", token, epoch, members]                 -> [OK, {name: value}] | [status, info map]
    ["n", cluster, "", token, epoch, members, {name: value}]  -> [OK] | [status, info map]

``epoch`` is the configuration epoch the sender votes in: a member in
another epoch (or fenced for a change) does not vote in its round. Statuses
are the ``rrseq.peer.v1.Status`` numbers (OK, NOT_READY, WRONG_CLUSTER,
EXHAUSTED, WRONG_EPOCH, REMOVED, BUSY, STALE).

Discovery: each member listens for the transport on ``--peer-port`` (0: any
free port) on the host of ``--listen``; a peer learns the port from the
member's gRPC ``Snapshot(endpoint_only=True)`` and connects to it on the host
of the member's gRPC address. After a failure the link re-discovers (the
member may have restarted on another port), with a doubling, jittered
backoff so a dead member costs nothing per round.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from typing import Any

import grpc
import msgpack

from rustext.backoff import BackoffPolicy

from rpc.transport import ConnectionConfig, TransportLayerError, TransportProtocol
from rpc.transport.connection import Connection, connect, expire
from rpc.transport.codec import RawCodec
from rpc.transport.registry import ProtocolRegistry
from rpc.transport.timer import DeadlineScheduler
from rpc.transport.wire import FrameWire
from seq._proto import rrpeer_pb2 as peer_pb
from seq.wire import PeerStub

OK = peer_pb.OK
NOT_READY = peer_pb.NOT_READY
WRONG_CLUSTER = peer_pb.WRONG_CLUSTER
EXHAUSTED = peer_pb.EXHAUSTED
WRONG_EPOCH = peer_pb.WRONG_EPOCH
REMOVED = peer_pb.REMOVED
BUSY = peer_pb.BUSY
STALE = peer_pb.STALE

OP_READ = "r"
OP_CAS = "c"
OP_ACQUIRE = "a"
OP_INFO = "i"
OP_FENCE = "f"
OP_INSTALL = "n"

PROTOCOL = TransportProtocol("seq-peer", FrameWire(), RawCodec())

# Small messages, a few in flight, plenty of handler slots; frames bounded like the
# gRPC snapshot (64 MiB): a membership change carries the whole state once.
CONNECTION_CONFIG = ConnectionConfig(max_frame=64 << 20, max_decompressed=64 << 20, max_handlers=4096,
                                     drain_timeout=1.0)

pack = msgpack.Packer(use_bin_type=True).pack


def unpack(data: Any) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)


def registry() -> ProtocolRegistry:
    reg = ProtocolRegistry()
    reg.register(PROTOCOL)
    return reg


class PeerUnavailable(ConnectionError):
    """The peer could not be reached (no discovery, no connection, no answer in time)."""


class PeerLink:
    """Calls to one other member. ``call(obj, timeout)`` returns a future of the reply array.

    One transport connection, (re)made on demand after asking the member's
    gRPC ``Snapshot(endpoint_only)`` for its port. Not thread-safe; one event loop.
    """

    def __init__(
        self,
        addr: str,
        channel: grpc.aio.Channel,
        cluster: str,
        *,
        backoff_min: float = 0.05,
        backoff_max: float = 1.0,
        rng: random.Random | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.addr = addr
        self._tls = tls  # client context of the peer connection (mutual TLS between members)
        self._host = addr.rpartition(":")[0]
        self._stub = PeerStub(channel)
        self._cluster = cluster
        self._conn: Connection | None = None
        self._connecting: asyncio.Future[Connection] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._backoff = BackoffPolicy(initial=min(backoff_min, backoff_max), maximum=backoff_max)
        self._rng = rng or random.Random()
        self._scheduler: DeadlineScheduler | None = None
        self._closed = False
        self.connects = 0

    def set_tls(self, tls: ssl.SSLContext | None) -> None:
        """The context of the next connection (a reloaded certificate)."""
        self._tls = tls

    @property
    def stub(self) -> PeerStub:
        return self._stub

    def call(self, obj: list[Any], timeout: float) -> asyncio.Future[Any]:
        """A future of the decoded reply; it fails with PeerUnavailable (or the transport's error)."""
        conn = self._conn
        payload = pack(obj)
        if conn is not None and conn.is_open:
            try:
                fut = conn.submit(payload, timeout=timeout)
            except TransportLayerError as exc:
                return _failed(PeerUnavailable(f"{self.addr}: {exc}"))
            assert fut is not None
            return _decoded(fut)
        return asyncio.ensure_future(self._call_slow(payload, timeout))

    async def _call_slow(self, payload: bytes, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._connection(timeout)
        left = deadline - loop.time()
        if left <= 0:
            raise PeerUnavailable(f"{self.addr}: no time left after connecting")
        try:
            msg = await conn.request(payload, timeout=left)
        except TransportLayerError as exc:
            raise PeerUnavailable(f"{self.addr}: {exc}") from exc
        return unpack(msg.payload)

    async def _connection(self, timeout: float) -> Connection:
        if self._closed:
            raise PeerUnavailable(f"{self.addr}: link closed")
        conn = self._conn
        if conn is not None and conn.is_open:
            return conn
        loop = asyncio.get_running_loop()
        if self._connecting is None:
            if loop.time() < self._retry_at:
                raise PeerUnavailable(f"{self.addr}: backing off after {self._failures} failed connects")
            self._connecting = asyncio.ensure_future(self._connect(max(timeout, 0.2)))
            self._connecting.add_done_callback(_consume)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self._connecting)
        except (TimeoutError, OSError, TransportLayerError, grpc.aio.AioRpcError) as exc:
            raise PeerUnavailable(f"{self.addr}: {type(exc).__name__}: {exc}") from exc

    async def _connect(self, timeout: float) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            rep = await self._stub.Snapshot(
                peer_pb.SnapshotRequest(cluster=self._cluster, endpoint_only=True), timeout=timeout
            )
            if rep.status == WRONG_CLUSTER:
                raise PeerUnavailable(f"{self.addr} is configured with another member list")
            if not rep.peer_port:
                raise PeerUnavailable(f"{self.addr} announced no peer port")
            if self._scheduler is None:
                self._scheduler = DeadlineScheduler(loop, expire)
            self.connects += 1
            async with asyncio.timeout(timeout):
                conn = await connect(f"tcp://{self._host}:{rep.peer_port}", PROTOCOL, CONNECTION_CONFIG,
                                     self._scheduler, tls=self._tls)
        except BaseException:
            self._failures += 1
            self._retry_at = loop.time() + self._backoff.delay(self._failures, self._rng)
            raise
        finally:
            self._connecting = None
        if self._closed:
            conn.close()
            raise PeerUnavailable(f"{self.addr}: link closed")
        self._failures = 0
        self._conn = conn
        return conn

    async def aclose(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose(timeout=0.5)


def _consume(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


def _failed(exc: BaseException) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut


def _decoded(src: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """A future of ``unpack(msg.payload)`` chained on the transport's future (no task)."""
    out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[Any]) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
            return
        exc = f.exception()
        if exc is not None:
            out.set_exception(PeerUnavailable(str(exc)) if isinstance(exc, TransportLayerError) else exc)
            return
        try:
            out.set_result(unpack(f.result().payload))
        except Exception as e:  # a garbled reply counts as no answer
            out.set_exception(PeerUnavailable(f"bad reply: {e}"))

    def cancelled(o: asyncio.Future[Any]) -> None:
        if o.cancelled() and not src.done():
            src.cancel()

    src.add_done_callback(done)
    out.add_done_callback(cancelled)
    return out
