"""RRServer: one member of an RRSeq cluster (rrseq.md).

It serves the public ``pb.RRAPI`` (``GRPCNextID``/``GRPCCurID``/
``GRPCSetID``) and the rare member-to-member calls (``rrseq.peer.v1.RRPeer``:
snapshot, peer-port discovery) on its gRPC port (the native server of
:mod:`seq.api`, batched into the coordinator), and the per-round
member-to-member calls (read, compare-and-set, acquire) on an rpc.transport
listener (``peer_port``, see :mod:`seq.peerlink`); with ``http`` set, the
HTTP/JSON API, status page and metrics too (:mod:`seq.http`, same
coordinator). NextID is coordinated by
:class:`seq.coordinator.Coordinator`; the member's own values live in
:class:`seq.store.Store`.

Membership and data states (``meta.json``):

- ``ready``: votes in read and write quorums.
- ``bootstrapping``: a brand-new member (``--bootstrap``, empty data dir).
  It waits until every other member answers; if none holds data it becomes
  ready with an empty store, otherwise it catches up like a rejoining one.
- ``catching_up``: a member whose data was lost (``--rejoin``). It does not
  vote until it has merged the state of *all* other members (every
  acknowledged range is on at least one of them) with at least one of them
  ready, made that durable, and only then marks itself ready.

Refused starts (:class:`UnsafeStart`): an empty data dir without
``--bootstrap``/``--rejoin``; ``--bootstrap`` on an initialized dir; a log
missing under a ready meta; a member list different from the one the dir
was initialized with; a data dir locked by another process.

Lifecycle: ``await start()``, ``await wait_ready()``, ``await serve_forever()``
(returns on ``aclose()``, raises if the store failed), ``await aclose()``
(stops accepting, drains in-flight RPCs within the grace period, flushes the
store). All idempotent.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import grpc

from rustext.net import ListenError, listen_error
from rustext.tls import ClientTls, ServerTls

from rpc.transport import ServerConfig as TransportServerConfig
from rpc.transport import TransportServer
from seq import peerlink
from seq._proto import rrpeer_pb2 as peer_pb
from seq._proto import rrseq_pb2 as pb
from seq.api import ApiServer
from seq.coordinator import Coordinator, CoordinatorStats
from seq.errors import SeqExhausted, StoreError, UnsafeStart
from seq.http import HttpApi
from seq.log import MAX_NAME, MAX_VALUE
from seq.namestats import NameStats
from seq.peerlink import EXHAUSTED, NOT_READY, OK, OP_ACQUIRE, OP_CAS, OP_READ, WRONG_CLUSTER, PeerLink
from seq.store import Meta, State, Store, ensure_dir, log_generations, read_meta, write_meta
from seq.wire import CHANNEL_OPTIONS, grpc_credentials

log = logging.getLogger("seq.server")

Mode = Literal["normal", "bootstrap", "rejoin"]


def _check_addr(addr: str) -> str:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    return addr


@dataclass(kw_only=True)
class ServerConfig:
    """Configuration of one member. Times in seconds."""

    listen: str  # HOST:PORT to bind
    data_dir: str  # data directory: meta.json + the log, locked while a server uses it
    peers: tuple[str, ...] = ()  # the OTHER members, HOST:PORT as they listen
    advertise: str | None = None  # this member's address as peers list it (default: listen)
    mode: Mode = "normal"  # "bootstrap" (brand-new cluster), "rejoin" (data lost) or "normal"
    default_timeout: float = 5.0  # NextID deadline when the client sends none
    peer_timeout: float = 1.0  # bound of one member-to-member RPC
    backoff_base: float = 0.001  # first retry window of a lost round
    backoff_cap: float = 0.05  # largest retry window
    max_range: int = 1 << 32  # largest range_size accepted
    compact_bytes: int = 4 << 20  # compact the log past this size
    join_poll: float = 0.2  # how often a joining member polls the others
    forward: bool = True  # forward NextID batches to the name's preferred coordinator
    max_inflight: int = 1  # concurrent rounds per name (1: bigger batches, best when CPU-bound)
    linger: float = 0.001  # back-to-back rounds of a name wait this long to batch more requests
    peer_port: int = 0  # rpc.transport port for member-to-member calls, on the --listen host (0: any)
    tls_cert: str | None = None  # PEM chain: RRAPI over TLS, and this member's identity to the others
    tls_key: str | None = None  # PEM private key of tls_cert
    tls_ca: str | None = None  # PEM CA the members' certificates chain to (each verifies the others)
    http: str | None = None  # HOST:PORT of the HTTP/JSON API and status page (None: no HTTP listener)
    metrics_max_names: int = 1000  # names with series of their own; later names are counted under name="_other"

    def __post_init__(self) -> None:
        _check_addr(self.listen)
        self.peers = tuple(_check_addr(p) for p in self.peers)
        if self.advertise is not None:
            _check_addr(self.advertise)
        if self.self_address in self.peers:
            raise ValueError("--peers lists the other members only, not this one")
        if len(set(self.peers)) != len(self.peers):
            raise ValueError("duplicate peer")
        if self.mode not in ("normal", "bootstrap", "rejoin"):
            raise ValueError(f"bad mode {self.mode!r}")
        for name in ("default_timeout", "peer_timeout", "backoff_base", "backoff_cap", "join_poll"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        if not 1 <= self.max_range <= MAX_VALUE:
            raise ValueError("max_range out of range")
        if not 0 <= self.linger <= 1.0:
            raise ValueError("linger must be in [0, 1] s")
        if not 0 <= self.peer_port < 65536:
            raise ValueError("peer_port out of range")
        if self.http is not None:
            _check_addr(self.http)
        if self.metrics_max_names < 0:
            raise ValueError("metrics_max_names must be >= 0")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("TLS needs --tls-ca too: members verify each other against it")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def peer_server_tls(self) -> ServerTls | None:
        """The peer listener's TLS: this member's certificate; the others
        must present one signed by the CA (mutual TLS)."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return ServerTls(cert=self.tls_cert, key=self.tls_key, client_ca=self.tls_ca)

    def peer_client_tls(self) -> ClientTls | None:
        """How this member reaches the others: verified against the CA,
        showing its own certificate."""
        if self.tls_cert is None:
            return None
        return ClientTls(ca=self.tls_ca, cert=self.tls_cert, key=self.tls_key)

    @property
    def self_address(self) -> str:
        return self.advertise or self.listen

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted((self.self_address, *self.peers)))

    @property
    def cluster(self) -> str:
        """Fingerprint of the member list: members configured differently refuse each other."""
        return hashlib.sha256(",".join(self.members).encode()).hexdigest()[:16]

    @property
    def quorum(self) -> int:
        """R = W = N // 2 + 1, so R + W > N."""
        return len(self.members) // 2 + 1


_PEER_STATE = {"bootstrapping": peer_pb.BOOTSTRAPPING, "catching_up": peer_pb.CATCHING_UP, "ready": peer_pb.READY}


def prepare_data_dir(config: ServerConfig) -> tuple[State, bool]:
    """Check the data dir against the flags; write meta for a new member.

    Returns (state, whether the store may start from an empty log).
    Raises :class:`UnsafeStart` when starting would be unsafe.
    """
    d, mode, cluster = config.data_dir, config.mode, config.cluster
    meta = read_meta(d)
    gens = log_generations(d)
    if meta is None:
        if gens and mode != "rejoin":
            raise UnsafeStart(f"{d} holds a log but no meta.json (damaged): start with --rejoin")
        if not gens and mode == "normal":
            raise UnsafeStart(
                f"{d} holds no data. A member of a brand-new cluster starts with --bootstrap; "
                "a member whose data was lost starts with --rejoin (it catches up from all "
                "other members before it votes)"
            )
        if len(config.members) == 1 and mode == "rejoin":
            raise UnsafeStart("a single-member cluster has no one to catch up from")
        state: State = "bootstrapping" if mode == "bootstrap" else "catching_up"
        write_meta(d, Meta(state=state, cluster=cluster))
        return state, True
    if meta.cluster != cluster:
        raise UnsafeStart(
            f"{d} belongs to a cluster with another member list (fingerprint {meta.cluster}, "
            f"configured {cluster}): membership changes are not supported"
        )
    if mode == "bootstrap" and meta.state == "ready":
        raise UnsafeStart(f"{d} is already initialized: --bootstrap is only for a brand-new cluster")
    state = meta.state
    if mode == "rejoin" and state != "catching_up":
        state = "catching_up"
        write_meta(d, Meta(state=state, cluster=cluster))
    if state == "ready" and not gens:
        raise UnsafeStart(f"{d}: meta.json says ready but the log is gone (data lost): start with --rejoin")
    return state, state != "ready"


def lock_data_dir(directory: str) -> int:
    """Hold an exclusive lock on `directory` for this process (released on exit, even kill -9)."""
    ensure_dir(directory)
    fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise UnsafeStart(f"{directory} is in use by another process") from exc
    return fd


class RRServer:
    """One member. See the module docstring for states and lifecycle."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._state: State = "bootstrapping"
        self._store: Store | None = None
        self._api: ApiServer | None = None
        self._http: HttpApi | None = None
        self.http_port = 0
        #: ranges served to clients, per name (gRPC and HTTP): /v1/names, the status page, seq_name_* metrics
        self.names = NameStats(max_tracked=config.metrics_max_names)
        self._channels: list[grpc.aio.Channel] = []
        self._peers: list[PeerLink] = []
        self._transport: TransportServer | None = None
        self.peer_port = 0
        self._coordinator: Coordinator | None = None
        self._join_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._fatal: BaseException | None = None
        self._closing = False
        self._lock_fd: int | None = None
        self.port = 0
        self._max_range = config.max_range
        self._default_timeout = config.default_timeout
        self._loop_time: Callable[[], float] = time.monotonic  # the running loop's clock, set in start()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._lock_fd = lock_data_dir(cfg.data_dir)
        try:
            await self._start(loop)
        except BaseException:
            await self.aclose(grace=0)
            raise

    async def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        cfg = self.config
        self._loop_time = loop.time
        self._state, create = await loop.run_in_executor(None, prepare_data_dir, cfg)
        self._store = await loop.run_in_executor(
            None, lambda: Store.open(cfg.data_dir, create=create, compact_bytes=cfg.compact_bytes)
        )
        self._store.start()
        peer_tls = cfg.peer_client_tls()
        if peer_tls is None:
            self._channels = [grpc.aio.insecure_channel(p, options=CHANNEL_OPTIONS) for p in cfg.peers]
            link_tls = None
        else:
            self._channels = [grpc.aio.secure_channel(p, grpc_credentials(peer_tls), options=CHANNEL_OPTIONS)
                              for p in cfg.peers]
            link_tls = peer_tls.context()
        self._peers = [PeerLink(a, c, cfg.cluster, tls=link_tls) for a, c in zip(cfg.peers, self._channels)]
        self._coordinator = Coordinator(
            store=self._store,
            votes=lambda: self._state == "ready",
            peers=self._peers,
            peer_addrs=cfg.peers if cfg.forward else (),
            self_addr=cfg.self_address,
            cluster=cfg.cluster,
            read_quorum=cfg.quorum,
            write_quorum=cfg.quorum,
            peer_timeout=cfg.peer_timeout,
            backoff_base=cfg.backoff_base,
            backoff_cap=cfg.backoff_cap,
            on_store_failure=self._store_failed,
            max_inflight=cfg.max_inflight,
            linger=cfg.linger,
        )
        host = cfg.listen.rpartition(":")[0]
        self._api = ApiServer(
            host,
            int(cfg.listen.rpartition(":")[2]),
            coordinator=self._coordinator,
            store=self._store,
            snapshot=self._peer_snapshot,
            on_store_failure=self._store_failed,
            max_range=cfg.max_range,
            default_timeout=cfg.default_timeout,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
            names=self.names,
        )
        # The fixed --listen port is claimed before the peer port is chosen:
        # an any-port (0) peer listener bound first could be given the very
        # port --listen names when that one lies in the ephemeral range.
        try:
            self.port = self._api.bind()
        except OSError as exc:
            raise listen_error(host, cfg.listen.rpartition(":")[2], exc) from exc
        self._transport = TransportServer(
            f"tcp://{host}:{cfg.peer_port}",
            self._peer_call,
            protocol=peerlink.PROTOCOL,
            registry=peerlink.registry(),
            config=TransportServerConfig(connection=peerlink.CONNECTION_CONFIG),
            tls=cfg.peer_server_tls(),
        )
        try:
            ep = await self._transport.start()
        except OSError as exc:
            err = listen_error(host, cfg.peer_port, exc)
            raise ListenError(host, cfg.peer_port, f"{err.reason} (the peer port)", err.errno) from exc
        self.peer_port = ep.port
        # Calls queued since bind() (a peer asking for the peer port) are
        # served from here on, when the peer port is known.
        self._api.start()
        if cfg.http is not None:
            await self._start_http(cfg.http)
        log.info(
            "seq server listening on %s, peer port %d%s (members %s, state %s, data %s)",
            cfg.listen, self.peer_port, f", HTTP on {cfg.http.rpartition(':')[0]}:{self.http_port}" if self._http else "",
            ",".join(cfg.members), self._state, cfg.data_dir,
        )
        if self._state == "ready":
            self._ready.set()
        else:
            self._join_task = loop.create_task(self._join(), name="seq-join")

    async def _start_http(self, addr: str) -> None:
        import ssl

        from seq.metrics import member_registry, render

        cfg = self.config
        assert self._coordinator is not None and self._store is not None
        context = None
        if cfg.tls_cert is not None and cfg.tls_key is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        registry = member_registry(self, self.names)
        host, _, port = addr.rpartition(":")
        self._http = HttpApi(
            host,
            int(port),
            acquire=self._coordinator.acquire,
            store=self._store,
            state=lambda: self._state,
            names=self.names,
            on_store_failure=self._store_failed,
            max_count=cfg.max_range,
            timeout=cfg.default_timeout,
            member=cfg.self_address,
            metrics=lambda: render(registry),
            ssl_context=context,
        )
        self.http_port = await self._http.start()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until this member votes (bootstrap or catch-up done)."""
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def serve_forever(self) -> None:
        """Until aclose(); raises StoreError/UnsafeStart if the member had to stop."""
        await self._stopped.wait()
        if self._fatal is not None:
            raise self._fatal

    @property
    def state(self) -> State:
        return self._state

    @property
    def stats(self) -> CoordinatorStats:
        assert self._coordinator is not None
        return self._coordinator.stats

    @property
    def store(self) -> Store:
        assert self._store is not None
        return self._store

    def pending(self) -> int:
        """gRPC calls received and not answered yet."""
        return self._api.pending() if self._api is not None else 0

    def abort(self) -> None:
        """Make a close in progress skip what is left of its grace period."""
        if self._api is not None:
            self._api.abort_drain()

    def reload_tls(self) -> None:
        """Read the certificate files again (SIGHUP) for the API and the peer
        listener: new handshakes get the new certificate, established
        connections keep theirs. Raises TlsConfigError (the current
        certificate stays) on unusable files."""
        if not self.config.tls:
            raise ValueError("this member does not serve TLS")
        cfg = self.config
        ServerTls(cert=cfg.tls_cert or "", key=cfg.tls_key or "", client_ca=cfg.tls_ca).context()  # checked first
        if self._api is not None:
            self._api.reload_tls()
        if self._http is not None:
            self._http.reload_tls(cfg.tls_cert or "", cfg.tls_key or "")
        if self._transport is not None:
            self._transport.reload_tls()
        # links to the others present the new certificate from their next connection
        for p in self._peers:
            p.set_tls(cfg.peer_client_tls().context())  # type: ignore[union-attr]

    async def aclose(self, grace: float = 2.0) -> None:
        """Stop accepting, answer the calls received within ``grace`` seconds,
        stop the coordinator, the links and the store. Idempotent."""
        if self._closing:
            await self._stopped.wait()
            return
        self._closing = True
        if self._join_task is not None:
            self._join_task.cancel()
            await asyncio.gather(self._join_task, return_exceptions=True)
        http_closed = None
        if self._http is not None:
            # stops accepting now; requests in flight get their answer (the coordinator still runs)
            http_closed = asyncio.get_running_loop().create_task(self._http.aclose())
        if self._api is not None:
            # Stop accepting; calls already received get their answer within the grace period.
            self._api.drain()
            await self._api.wait_drained(grace)
        if http_closed is not None:
            await http_closed
        if self._coordinator is not None:
            await self._coordinator.aclose()
        if self._api is not None:
            await self._api.aclose()
        for p in self._peers:
            await p.aclose()
        if self._transport is not None:
            await self._transport.aclose(timeout=grace)
        for c in self._channels:
            await c.close()
        if self._store is not None:
            await self._store.aclose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._stopped.set()

    def _store_failed(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = StoreError(f"store failed: {exc}")
            log.critical("stopping: %s", self._fatal)
            asyncio.get_running_loop().create_task(self.aclose(grace=0.5))

    # -- joining ----------------------------------------------------------------

    async def _join(self) -> None:
        cfg = self.config
        assert self._store is not None
        loop = asyncio.get_running_loop()
        last_log = 0.0
        req = peer_pb.SnapshotRequest(cluster=cfg.cluster)
        while True:
            replies = await asyncio.gather(
                *(p.stub.Snapshot(req, timeout=max(cfg.peer_timeout, 5.0)) for p in self._peers),
                return_exceptions=True,
            )
            waiting_for = [a for a, r in zip(cfg.peers, replies) if isinstance(r, BaseException)]
            wrong = [a for a, r in zip(cfg.peers, replies) if not isinstance(r, BaseException) and r.status == peer_pb.WRONG_CLUSTER]
            if wrong:
                self._fatal = UnsafeStart(f"members {wrong} are configured with another member list")
                log.critical("%s", self._fatal)
                loop.create_task(self.aclose(grace=0.5))
                return
            ok = [r for r in replies if not isinstance(r, BaseException)]
            reason = ""
            if waiting_for:
                reason = f"waiting for all other members to answer (missing {','.join(waiting_for)})"
            elif self._state == "catching_up" and ok and not any(r.state == peer_pb.READY for r in ok):
                reason = (
                    "waiting for a ready member: no other member votes (if every member lost its "
                    "data this is a majority data loss: see 'Not guaranteed' on the manual's Seq page)"
                )
            if not reason:
                break
            if loop.time() - last_log > 5.0:
                log.warning("not voting yet (%s): %s", self._state, reason)
                last_log = loop.time()
            await asyncio.sleep(cfg.join_poll)
        merged: dict[str, int] = {}
        for r in ok:
            for name, value in r.values.items():
                if value > merged.get(name, 0):
                    merged[name] = value
        if self._state == "bootstrapping" and merged:
            log.warning("--bootstrap, but the cluster already holds data: catching up from all members instead")
        await self._store.merge(merged)
        await loop.run_in_executor(None, write_meta, cfg.data_dir, Meta(state="ready", cluster=cfg.cluster))
        log.info("%s done: merged %d names from %d members; now voting", self._state, len(merged), len(ok))
        self._state = "ready"
        self._ready.set()

    # -- RRAPI: see seq.api (native gRPC server, batched into the coordinator) ---------

    # -- RRPeer (gRPC: snapshot, discovery) ---------------------------------------

    def _peer_snapshot(self, request: peer_pb.SnapshotRequest) -> peer_pb.SnapshotReply:
        if request.cluster != self.config.cluster:
            return peer_pb.SnapshotReply(status=peer_pb.WRONG_CLUSTER)
        assert self._store is not None
        state = _PEER_STATE[self._state]
        if request.endpoint_only:
            return peer_pb.SnapshotReply(state=state, peer_port=self.peer_port)
        return peer_pb.SnapshotReply(state=state, values=self._store.snapshot(), peer_port=self.peer_port)

    # -- member-to-member hot path (rpc.transport, seq.peerlink) ------------------

    def _peer_call(self, conn: object, msg: object) -> object:
        """One transport request; returns the packed reply, or an awaitable of it.

        A malformed request raises (the caller gets an error reply, counted as no answer).
        """
        req = peerlink.unpack(msg.payload)  # type: ignore[attr-defined]
        op, cluster, name = req[0], req[1], req[2]
        if type(name) is not str or len(name.encode()) > MAX_NAME:
            raise ValueError("bad name")
        if cluster != self.config.cluster:
            return peerlink.pack([WRONG_CLUSTER, 0, 0])
        if op == OP_CAS:
            expected, new = _u63(req[3]), _u63(req[4])
            if self._state != "ready":
                return peerlink.pack([NOT_READY, False, 0])
            assert self._store is not None
            try:
                ok, cur, fut = self._store.cas(name, expected, new)
            except StoreError as exc:
                self._store_failed(exc)
                raise
            if fut is None:
                return peerlink.pack([OK, ok, cur])
            return self._cas_durable(fut, ok, cur)
        if op == OP_READ:
            if self._state != "ready":
                return peerlink.pack([NOT_READY, 0])
            assert self._store is not None
            return peerlink.pack([OK, self._store.get(name)])
        if op == OP_ACQUIRE:
            n, timeout = _u63(req[3]), req[4]
            if n < 1 or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
                raise ValueError("bad acquire")
            return self._acquire(name, n, float(timeout))
        raise ValueError(f"unknown op {op!r}")

    async def _cas_durable(self, fut: asyncio.Future[None], ok: bool, cur: int) -> bytes:
        try:
            await fut
        except StoreError as exc:
            self._store_failed(exc)
            raise
        return peerlink.pack([OK, ok, cur])

    async def _acquire(self, name: str, n: int, timeout: float) -> bytes:
        assert self._coordinator is not None
        try:
            r = await self._coordinator.acquire(name, n, asyncio.get_running_loop().time() + timeout, forward=False)
        except SeqExhausted:
            return peerlink.pack([EXHAUSTED, 0, 0])
        if r is None:
            return peerlink.pack([OK, 0, 0])
        return peerlink.pack([OK, r[0], r[1]])


def _u63(v: object) -> int:
    if type(v) is not int or not 0 <= v <= MAX_VALUE:
        raise ValueError("bad value")
    return v


async def run_server(config: ServerConfig, stop: asyncio.Event, *, metrics_port: int | None = None) -> None:
    """Run one member until `stop` is set (the CLI's SIGINT/SIGTERM) or it must stop."""
    server = RRServer(config)
    await server.start()
    httpd = None
    if metrics_port is not None:
        from seq.metrics import serve_metrics

        httpd = serve_metrics(server, metrics_port)
        log.info("metrics on http://127.0.0.1:%d/metrics", metrics_port)
    serve = asyncio.ensure_future(server.serve_forever())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({serve, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if httpd is not None:
            httpd.shutdown()
        await server.aclose()
        s = server.stats
        log.info(
            "stopped: requests=%d rounds_won=%d conflicts=%d no_quorum=%d expired=%d ids=%d "
            "max_attempts=%d fsync_batches=%d writes=%d",
            s.requests, s.rounds_won, s.rounds_conflict, s.rounds_no_quorum, s.requests_expired,
            s.ids_issued, s.max_attempts, server.store.fsyncs, server.store.writes,
        )
    await serve  # re-raises a fatal error
