"""The public ``pb.RRAPI`` endpoint of a member, on the native gRPC server.

:class:`rustext.GrpcServer` (Rust: hyper HTTP/2, the protobuf codec of the
six RRAPI messages, gRPC framing and statuses, ``grpc-timeout``) runs on its
own thread and queues decoded calls. When its queue goes non-empty it makes
one fd readable; the event loop's reader callback takes every queued call in
one native call, hands the NextID requests to the coordinator (requests for
one name arriving together start one round), and the answers of a loop turn
go back in one native call (:class:`_Outbox`). No task, future or coroutine
is made per NextID call.

Besides RRAPI, the rare member-to-member ``rrseq.peer.v1.RRPeer/Snapshot``
is served here as a raw method (the request and reply stay protobuf bytes,
built by the generated module), so the process runs no grpc.aio server.

Status codes, as the grpc.aio server had them: INVALID_ARGUMENT (name over
256 bytes of UTF-8, NextID or SetID of a name reserved for snowflake leases, range_size above ``max_range``), OUT_OF_RANGE (the
sequence would pass 2**63-1), INTERNAL (the store failed; malformed request),
UNAVAILABLE (draining or closed; a member started with ``--join`` and not
added yet; a snowflake worker without a lease or whose clock moved
backwards), FAILED_PRECONDITION (the member was removed from the cluster),
DEADLINE_EXCEEDED (the caller's ``grpc-timeout`` passed), RESOURCE_EXHAUSTED
(``max_pending`` NextID calls already wait: refused at once, so an overloaded
member answers the excess instead of letting it time out), UNIMPLEMENTED
(unknown method).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from rustext import GrpcServer
from rustext.tls import TlsConfigError
from seq._proto import rrpeer_pb2 as peer_pb
from seq.errors import MemberRemoved, SeqExhausted, SeqUnavailable, StoreError
from seq.lease import RESERVED_MESSAGE, RESERVED_PREFIX
from seq.log import MAX_NAME
from seq.namestats import NameStats
from seq.store import Store
from seq.wire import PEER_SERVICE

log = logging.getLogger("seq.api")

SNAPSHOT_PATH = f"/{PEER_SERVICE}/Snapshot"

# kinds of GrpcServer.take() tuples
NEXT_ID, CUR_ID, SET_ID, RAW_SNAPSHOT = 0, 1, 2, 3

# grpc status codes
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, OUT_OF_RANGE, INTERNAL, UNAVAILABLE = 3, 8, 9, 11, 13, 14


class Acquirer(Protocol):
    """The coordinator (or a snowflake worker). One with a ``refusal`` attribute that is set (a
    removed member, one not yet a member) has CurID and SetID fail with it too."""

    def submit(self, name: str, n: int, deadline: float, sink: _Call) -> None: ...


def _code(exc: BaseException) -> int:
    if isinstance(exc, SeqExhausted):
        return OUT_OF_RANGE
    if isinstance(exc, MemberRemoved):
        return FAILED_PRECONDITION
    if isinstance(exc, SeqUnavailable):
        return UNAVAILABLE
    return INTERNAL


class _Outbox:
    """Answers gathered during one loop turn, sent in one native call."""

    __slots__ = ("api", "items", "loop", "names", "scheduled")

    def __init__(self, api: GrpcServer, loop: asyncio.AbstractEventLoop, names: NameStats | None = None) -> None:
        self.api = api
        self.loop = loop
        self.names = names
        self.items: list[tuple[int, int, int]] = []
        self.scheduled = False

    def put(self, token: int, a: int, b: int) -> None:
        self.items.append((token, a, b))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        items, self.items = self.items, []
        if items:
            self.api.complete(items)


class _Call:
    """One NextID call, as the coordinator sees a request's future (done / set_result / set_exception)."""

    __slots__ = ("token", "out", "name", "_done")

    def __init__(self, token: int, out: _Outbox, name: str) -> None:
        self.token = token
        self.out = out
        self.name = name
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, r: tuple[int, int] | None) -> None:
        if self._done:
            return
        self._done = True
        if r is None:
            self.out.put(self.token, 0, 0)  # [0, 0): no quorum before the deadline
        else:
            self.out.put(self.token, r[0], r[1])
            if self.out.names is not None:
                self.out.names.served(self.name, r[1] - r[0])

    def set_exception(self, exc: BaseException) -> None:
        if self._done:
            return
        self._done = True
        # a snowflake worker's clock or lease: UNAVAILABLE, the message says which (try another worker)
        self.out.api.fail(self.token, _code(exc), str(exc))


class ApiServer:
    """Serves RRAPI and RRPeer/Snapshot on `host:port` for one member.

    Lifecycle: ``bind()`` (returns the bound port, raises OSError; calls
    that arrive wait in the native queue), ``start()`` (binds if not yet
    bound, then hands calls to the loop), ``drain()`` + ``await
    wait_drained(grace)``, ``close()``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        coordinator: Acquirer,
        store: Store,
        snapshot: Callable[[peer_pb.SnapshotRequest], peer_pb.SnapshotReply],
        on_store_failure: Callable[[BaseException], None],
        max_range: int,
        default_timeout: float,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        names: NameStats | None = None,
        max_pending: int = 10000,
    ) -> None:
        self._names = names
        self._max_pending = max_pending
        try:
            self._native = GrpcServer(host.strip("[]"), port, raw_methods=[SNAPSHOT_PATH],
                                      max_wait=max(60.0, 2 * default_timeout), tls_cert=tls_cert, tls_key=tls_key)
        except ValueError as exc:
            raise TlsConfigError(str(exc)) from exc
        self._coordinator = coordinator
        self._store = store
        self._snapshot = snapshot
        self._on_store_failure = on_store_failure
        self._max_range = max_range
        self._default_timeout = default_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out: _Outbox | None = None
        self._fd = -1
        self._tasks: set[asyncio.Task[None]] = set()
        self._port: int | None = None

    def reload_tls(self) -> None:
        """Read the certificate files again: new handshakes get the new
        certificate; on unusable files the current one stays
        (TlsConfigError)."""
        try:
            self._native.reload_tls()
        except ValueError as exc:
            raise TlsConfigError(str(exc)) from exc

    def bind(self) -> int:
        """Listen on the address; calls are queued until ``start()``."""
        if self._port is None:
            self._port = self._native.start()
        return self._port

    def start(self) -> int:
        loop = asyncio.get_running_loop()
        port = self.bind()
        self._loop = loop
        self._out = _Outbox(self._native, loop, self._names)
        self._fd = self._native.fileno()
        loop.add_reader(self._fd, self._on_calls)
        return port

    def drain(self) -> None:
        """Stop accepting connections and calls; calls already received are still served."""
        self._native.drain()

    def pending(self) -> int:
        """Calls received and not answered yet."""
        return int(self._native.pending())

    def abort_drain(self) -> None:
        """End a :meth:`wait_drained` in progress at once."""
        self._drain_aborted = True

    _drain_aborted = False
    #: NextID calls refused with RESOURCE_EXHAUSTED (max_pending)
    refused = 0

    async def wait_drained(self, grace: float) -> None:
        """Until every received call is answered, or `grace` seconds, or
        :meth:`abort_drain`. The answers leave from the native side, which
        does not signal the loop, so this looks every 5 ms (shutdown only)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        while self._native.pending() and loop.time() < end and not self._drain_aborted:
            await asyncio.sleep(0.005)

    async def aclose(self) -> None:
        """Answer what is left with UNAVAILABLE and stop the native server. Idempotent."""
        if self._out is not None:
            self._out.flush()
        if self._fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._fd = -1
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._native.close)

    # -- the batch bridge ---------------------------------------------------------

    def _on_calls(self) -> None:
        calls = self._native.take()
        if not calls:
            return
        loop = self._loop
        out = self._out
        assert loop is not None and out is not None
        now = loop.time()
        submit = self._coordinator.submit
        native = self._native
        # admission: the calls taken now are pending too; those beyond max_pending are refused at once
        room = self._max_pending - (int(native.pending()) - len(calls))
        for call in calls:
            try:
                if call[1] == NEXT_ID:
                    if room <= 0:
                        self.refused += 1
                        native.fail(call[0], RESOURCE_EXHAUSTED,
                                    f"overloaded: {self._max_pending} calls already wait here (max_pending); "
                                    "retry after a backoff or on another member")
                        continue
                    room -= 1
                self._one(call, now, submit, native, out)
            except Exception as exc:  # a bug must cost one call, not the endpoint
                log.exception("RRAPI call failed")
                native.fail(call[0], INTERNAL, f"{type(exc).__name__}: {exc}")

    def _one(
        self,
        call: tuple[int, int, str | bytes, int, float | None],
        now: float,
        submit: Callable[[str, int, float, _Call], None],
        native: GrpcServer,
        out: _Outbox,
    ) -> None:
        token, kind, name, arg, timeout = call
        if kind == NEXT_ID:
            assert isinstance(name, str)
            if len(name) > MAX_NAME // 4 and len(name.encode()) > MAX_NAME:
                native.fail(token, INVALID_ARGUMENT, f"name longer than {MAX_NAME} bytes")
                return
            if name.startswith(RESERVED_PREFIX):
                native.fail(token, INVALID_ARGUMENT, RESERVED_MESSAGE)
                return
            n = arg
            if n < 1:
                n = 1
            elif n > self._max_range:
                native.fail(token, INVALID_ARGUMENT, f"range_size above {self._max_range}")
                return
            t = self._default_timeout if timeout is None else timeout
            # Answer [0, 0) a little before the caller's deadline so it sees "no quorum", not a timeout.
            t -= min(0.05, t * 0.1)
            submit(name, n, now + t, _Call(token, out, name))
        elif kind == RAW_SNAPSHOT:
            assert isinstance(name, bytes)
            self._serve_snapshot(token, name)
        elif isinstance(name, bytes) or len(name.encode()) > MAX_NAME:
            native.fail(token, INVALID_ARGUMENT, f"name longer than {MAX_NAME} bytes")
        elif (refusal := getattr(self._coordinator, "refusal", None)) is not None:
            native.fail(token, _code(refusal), str(refusal))
        elif kind == CUR_ID:
            out.put(token, self._store.get(name), 0)
        elif kind == SET_ID:
            if name.startswith(RESERVED_PREFIX):
                native.fail(token, INVALID_ARGUMENT, RESERVED_MESSAGE)
                return
            self._set_id(token, name, arg)

    def _serve_snapshot(self, token: int, payload: bytes) -> None:
        try:
            req = peer_pb.SnapshotRequest.FromString(payload)
        except Exception as exc:  # a malformed message: the caller gets INTERNAL
            self._native.fail(token, INTERNAL, f"cannot parse the request message: {exc}")
            return
        self._native.complete_raw(token, self._snapshot(req).SerializeToString())

    def _set_id(self, token: int, name: str, new_id: int) -> None:
        """This member only, forward only (rrseq.md); durable before success."""
        try:
            ok, fut = self._store.advance(name, new_id)
        except StoreError as exc:
            self._on_store_failure(exc)
            self._native.fail(token, INTERNAL, str(exc))
            return
        except ValueError as exc:
            self._native.fail(token, INVALID_ARGUMENT, str(exc))
            return
        assert self._out is not None
        if fut is None:
            self._out.put(token, int(ok), 0)
            return
        t = asyncio.get_running_loop().create_task(self._set_durable(token, ok, fut))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _set_durable(self, token: int, ok: bool, fut: asyncio.Future[None]) -> None:
        try:
            await fut
        except StoreError as exc:
            self._on_store_failure(exc)
            self._native.fail(token, INTERNAL, str(exc))
            return
        assert self._out is not None
        self._out.put(token, int(ok), 0)
