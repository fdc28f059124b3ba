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

Membership and data states (``meta.json``, with the configuration: the
cluster id, the epoch and the member list, see :mod:`seq.membership`):

- ``ready``: votes in read and write quorums of its epoch (unless fenced
  for a membership change in progress).
- ``bootstrapping``: a brand-new member (``--bootstrap``, empty data dir).
  It waits until every other member answers; if none holds data it becomes
  ready with an empty store, otherwise it catches up like a rejoining one.
- ``catching_up``: a member whose data was lost (``--rejoin``), or one that
  learned a newer configuration than its own. It does not vote until it has
  merged the state of *all* other members of its configuration (every
  acknowledged range is on at least one of them) with at least one of them
  ready, made that durable, and only then marks itself ready. A
  ``--rejoin`` member with an empty dir first asks ``--peers`` for the
  configuration (the newest one that lists it).
- ``joining``: started with ``--join`` on an empty dir: no configuration, no
  vote, no IDs (UNAVAILABLE) until a membership change installs it.
- ``removed``: a change left it out: it answers every request with
  FAILED_PRECONDITION (:class:`seq.errors.MemberRemoved`).

Which flags a data dir accepts, and why the configuration persisted in it
wins over ``--peers``: :mod:`seq.startup`.

Lifecycle: ``await start()``, ``await wait_ready()``, ``await serve_forever()``
(returns on ``aclose()``, raises if the store failed), ``await aclose()``
(stops accepting, drains in-flight RPCs within the grace period, flushes the
store). All idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

import grpc

from rustext.net import ListenError, check_hostport, listen_error
from rustext.service import ServiceBase
from rustext.tls import ClientTls, ServerTls

from rpc.transport import ServerConfig as TransportServerConfig
from rpc.transport import TransportServer
from seq import peerlink
from seq._proto import rrpeer_pb2 as peer_pb
from seq.api import ApiServer
from seq.coordinator import Coordinator, CoordinatorStats
from seq.errors import MemberRemoved, SeqExhausted, SeqUnavailable, StoreError, UnsafeStart
from seq.http import HttpApi
from seq.log import MAX_NAME, MAX_VALUE
from seq.namestats import NameStats
from seq.peerlink import (
    BUSY,
    EXHAUSTED,
    NOT_READY,
    OK,
    OP_ACQUIRE,
    OP_CAS,
    OP_FENCE,
    OP_INFO,
    OP_INSTALL,
    OP_READ,
    REMOVED,
    STALE,
    WRONG_CLUSTER,
    WRONG_EPOCH,
    PeerLink,
)
from seq.membership import majority
from seq.startup import Mode as Mode  # noqa: PLC0414  (re-exported: importers of seq.server keep it)
from seq.startup import ServerConfig, lock_data_dir, prepare_data_dir
from seq.store import Meta, Pending, State, Store, write_meta
from seq.wire import CHANNEL_OPTIONS, grpc_credentials

log = logging.getLogger("seq.server")

_PEER_STATE = {"bootstrapping": peer_pb.BOOTSTRAPPING, "catching_up": peer_pb.CATCHING_UP, "ready": peer_pb.READY,
               "joining": peer_pb.JOINING, "removed": peer_pb.REMOVED_MEMBER}


class RRServer(ServiceBase):
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
        # links to the other members (and, briefly, to members of a configuration being learned)
        self._links: dict[str, tuple[grpc.aio.Channel, PeerLink]] = {}
        self._link_tls: ClientTls | None = config.peer_client_tls()
        # the configuration (seq.membership): cluster id, epoch, members, a change this member is fenced for
        self._cluster = ""
        self._epoch = 0
        self._members: tuple[str, ...] = ()
        self._pending: Pending | None = None
        self._admin_lock = asyncio.Lock()
        self._learn_task: asyncio.Task[None] | None = None
        self._fenced_task: asyncio.Task[None] | None = None
        self._closing_links: set[asyncio.Task[None]] = set()
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
            await self.drain(0)
            raise

    async def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        cfg = self.config
        self._loop_time = loop.time
        meta, create = await loop.run_in_executor(None, prepare_data_dir, cfg)
        self._state = meta.state
        self._cluster, self._epoch, self._members, self._pending = meta.cluster, meta.epoch, meta.members, meta.pending
        self._store = await loop.run_in_executor(
            None, lambda: Store.open(cfg.data_dir, create=create, compact_bytes=cfg.compact_bytes)
        )
        self._store.start()
        self._coordinator = Coordinator(
            store=self._store,
            votes=self._votes,
            peers=(),
            cluster=self._cluster,
            read_quorum=1,
            write_quorum=1,
            peer_timeout=cfg.peer_timeout,
            backoff_base=cfg.backoff_base,
            backoff_cap=cfg.backoff_cap,
            on_store_failure=self._store_failed,
            max_inflight=cfg.max_inflight,
            linger=cfg.linger,
            on_newer_epoch=self._newer_epoch,
        )
        self._configure()
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
            max_pending=cfg.max_pending,
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
            "seq server listening on %s, peer port %d%s (configuration epoch %d, members %s, state %s, data %s)",
            cfg.listen, self.peer_port, f", HTTP on {cfg.http.rpartition(':')[0]}:{self.http_port}" if self._http else "",
            self._epoch, ",".join(self._members) or "none yet", self._state, cfg.data_dir,
        )
        if self._pending is not None:
            self._watch_fenced()
            log.warning("a membership change is pending here (to epoch %d, members %s): not voting until it is "
                        "finished (run the same juggler seq member command again)",
                        self._pending.epoch, ",".join(self._pending.members))
        if self._state == "ready":
            self._ready.set()
        elif self._state in ("bootstrapping", "catching_up"):
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
            max_pending=cfg.max_pending,
        )
        self.http_port = await self._http.start()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until this member votes (bootstrap or catch-up done)."""
        async with asyncio.timeout(timeout):
            await self._ready.wait()

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

    @property
    def refused(self) -> int:
        """NextID calls refused with RESOURCE_EXHAUSTED (more than max_pending waiting)."""
        return self._api.refused if self._api is not None else 0

    def abort(self) -> None:
        """Make a drain in progress skip what is left of its grace period."""
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
        self._link_tls = cfg.peer_client_tls()
        for _, link in self._links.values():
            link.set_tls(self._link_tls.context())  # type: ignore[union-attr]

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, answer the calls received within `timeout` seconds
        (None: ``drain_timeout``), stop the coordinator, the links and the
        store. Idempotent."""
        grace = self.config.drain_timeout if timeout is None else timeout
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
        for t in (self._learn_task, self._fenced_task):
            if t is not None:
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)
        for _, link in self._links.values():
            await link.aclose()
        if self._transport is not None:
            await self._transport.aclose(timeout=grace)
        for ch, _ in self._links.values():
            await ch.close()
        await asyncio.gather(*self._closing_links, return_exceptions=True)
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
            asyncio.get_running_loop().create_task(self.drain(0.5))

    # -- configuration (seq.membership) -------------------------------------------

    def _votes(self) -> bool:
        """Whether this member votes in its epoch's rounds now: ready, and not fenced for a change."""
        return self._state == "ready" and self._pending is None

    @property
    def configuration(self) -> tuple[int, tuple[str, ...]]:
        """(epoch, members) this member is in."""
        return self._epoch, self._members

    def _link(self, addr: str) -> PeerLink:
        """The link to `addr`, made on first use."""
        got = self._links.get(addr)
        if got is not None:
            return got[1]
        tls = self._link_tls
        if tls is None:
            ch = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
        else:
            ch = grpc.aio.secure_channel(addr, grpc_credentials(tls), options=CHANNEL_OPTIONS)
        link = PeerLink(addr, ch, self._cluster, tls=None if tls is None else tls.context())
        self._links[addr] = (ch, link)
        return link

    def _configure(self) -> None:
        """Links and the coordinator for the current configuration; links to others are closed."""
        assert self._coordinator is not None
        me = self.config.self_address
        others = [a for a in self._members if a != me]
        for addr in [a for a in self._links if a not in others]:
            ch, link = self._links.pop(addr)

            async def close(ch: grpc.aio.Channel = ch, link: PeerLink = link) -> None:
                await link.aclose()
                await ch.close()

            t = asyncio.get_running_loop().create_task(close())
            self._closing_links.add(t)
            t.add_done_callback(self._closing_links.discard)
        peers = [self._link(a) for a in others]
        q = majority(len(self._members)) if self._members else 1
        self._coordinator.reconfigure(
            peers=peers, peer_addrs=others if self.config.forward else (), self_addr=me, cluster=self._cluster,
            epoch=self._epoch, read_quorum=q, write_quorum=q,
        )
        if self._state == "removed":
            self._coordinator.refuse(MemberRemoved(
                f"this member ({me}) was removed from the cluster (configuration epoch {self._epoch}: "
                f"{','.join(self._members)}): ask those members"
            ))
        elif self._state == "joining":
            self._coordinator.refuse(SeqUnavailable(
                f"this member ({me}) is not a member yet: it was started with --join and waits for "
                "juggler seq member add"
            ))
        else:
            self._coordinator.refuse(None)

    def _meta(self) -> Meta:
        return Meta(state=self._state, cluster=self._cluster, epoch=self._epoch, members=self._members,
                    pending=self._pending)

    async def _persist(self) -> None:
        """meta.json := this member's state and configuration, durably."""
        await asyncio.get_running_loop().run_in_executor(None, write_meta, self.config.data_dir, self._meta())

    def _info(self) -> dict[str, object]:
        p = self._pending
        return {
            "member": self.config.self_address, "cluster": self._cluster, "epoch": self._epoch,
            "members": list(self._members), "state": self._state,
            "pending": None if p is None else {"epoch": p.epoch, "members": list(p.members), "token": p.token},
        }

    def _newer_epoch(self, epoch: int) -> None:
        """A member answered (or asked) in a newer epoch: learn that configuration (one task at a time)."""
        if epoch <= self._epoch or self._closing or self._state in ("removed", "joining"):
            return  # (a joining member knows no one to ask: re-running juggler seq member add finishes it)
        if self._learn_task is None or self._learn_task.done():
            self._learn_task = asyncio.get_running_loop().create_task(self._learn(), name="seq-learn")

    async def _learn(self) -> None:
        """Ask every member known (this configuration's and a pending one's) for its configuration;
        adopt the newest if it is newer than ours: catch up in it (like --rejoin), or, if this member
        is not in it, stop serving as removed.

        Safe: a configuration exists on a member only once installed by a change that fenced a majority
        of the configuration before it (seq.membership); catching up from all its other members covers
        every acknowledged range, as for --rejoin."""
        me = self.config.self_address
        addrs = set(self._members) | set(self._pending.members if self._pending else ())
        addrs.discard(me)
        infos = await self._ask_info(sorted(addrs))
        best = max((i for i in infos if i.get("cluster") == self._cluster or not self._cluster),
                   key=lambda i: i["epoch"], default=None)  # type: ignore[arg-type, return-value]
        if best is None or best["epoch"] <= self._epoch or best.get("state") in ("joining",):
            return
        async with self._admin_lock:
            if best["epoch"] <= self._epoch:  # type: ignore[operator]
                return
            members = tuple(best["members"])  # type: ignore[arg-type]
            self._cluster = str(best["cluster"])
            self._epoch = int(best["epoch"])  # type: ignore[call-overload]
            self._members = members
            self._pending = None
            if me in members:
                self._state = "catching_up"
                log.warning("configuration epoch %d learned from the other members (members %s): this member "
                            "catches up from all of them before it votes", self._epoch, ",".join(members))
            else:
                self._state = "removed"
                log.warning("this member was removed from the cluster (configuration epoch %d: %s): refusing "
                            "every request from now on", self._epoch, ",".join(members))
            await self._persist()
            self._configure()
            if self._state == "catching_up" and (self._join_task is None or self._join_task.done()):
                self._ready.clear()
                self._join_task = asyncio.get_running_loop().create_task(self._join(), name="seq-join")

    def _watch_fenced(self) -> None:
        """While fenced, look for the change's outcome now and then: a member fenced for a change
        that was installed elsewhere learns it even when no round reaches it."""
        if self._fenced_task is None or self._fenced_task.done():
            self._fenced_task = asyncio.get_running_loop().create_task(self._fenced_poll(), name="seq-fenced")

    async def _fenced_poll(self) -> None:
        interval = max(1.0, 5 * self.config.join_poll)
        while self._pending is not None and not self._closing:
            await asyncio.sleep(interval)
            if self._pending is None or self._closing:
                return
            if self._learn_task is None or self._learn_task.done():
                self._learn_task = asyncio.get_running_loop().create_task(self._learn(), name="seq-learn")
                await asyncio.gather(self._learn_task, return_exceptions=True)

    async def _ask_info(self, addrs: list[str]) -> list[dict[str, object]]:
        timeout = max(self.config.peer_timeout, 2.0)
        req = [OP_INFO, "", ""]
        replies = await asyncio.gather(*(self._link(a).call(req, timeout) for a in addrs), return_exceptions=True)
        return [r[1] for r in replies if not isinstance(r, BaseException) and r[0] == OK and isinstance(r[1], dict)]

    # -- joining ----------------------------------------------------------------

    async def _discover(self) -> None:
        """A --rejoin member with no configuration: take it (and the cluster id) from the members
        --peers names, the newest one that lists this member."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        last_log = 0.0
        me = cfg.self_address
        while True:
            infos = await self._ask_info(list(cfg.peers))
            known = [i for i in infos if int(i.get("epoch", 0)) > 0]  # type: ignore[call-overload]
            best = max(known, key=lambda i: i["epoch"], default=None)  # type: ignore[arg-type, return-value]
            if best is not None and me in best["members"]:  # type: ignore[operator]
                async with self._admin_lock:
                    self._cluster = str(best["cluster"])
                    self._epoch = int(best["epoch"])  # type: ignore[call-overload]
                    self._members = tuple(best["members"])  # type: ignore[arg-type]
                    await self._persist()
                    self._configure()
                log.info("configuration epoch %d learned from the other members: %s", self._epoch,
                         ",".join(self._members))
                return
            if loop.time() - last_log > 5.0:
                why = ("no member named by --peers answered" if not known else
                       f"the configuration they hold (epoch {best['epoch']}: {','.join(best['members'])}) "  # type: ignore[index, arg-type]
                       f"does not list this member ({me})")
                log.warning("not voting yet (catching_up): %s", why)
                last_log = loop.time()
            await asyncio.sleep(cfg.join_poll)

    async def _join(self) -> None:
        cfg = self.config
        assert self._store is not None
        loop = asyncio.get_running_loop()
        if self._epoch == 0:
            await self._discover()
        last_log = 0.0
        while True:
            epoch, me = self._epoch, cfg.self_address
            others = [a for a in self._members if a != me]
            req = peer_pb.SnapshotRequest(cluster=self._cluster)
            replies = await asyncio.gather(
                *(self._link(a).stub.Snapshot(req, timeout=max(cfg.peer_timeout, 5.0)) for a in others),
                return_exceptions=True,
            )
            if epoch != self._epoch or self._state not in ("bootstrapping", "catching_up"):
                if self._state == "ready":
                    return  # a membership change installed this member meanwhile
                continue  # a newer configuration was learned meanwhile: ask its members
            waiting_for = [a for a, r in zip(others, replies) if isinstance(r, BaseException)]
            wrong = [a for a, r in zip(others, replies) if not isinstance(r, BaseException) and r.status == peer_pb.WRONG_CLUSTER]
            if wrong:
                self._fatal = UnsafeStart(f"members {wrong} belong to another cluster")
                log.critical("%s", self._fatal)
                loop.create_task(self.drain(0.5))
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
        async with self._admin_lock:
            if epoch != self._epoch or self._state not in ("bootstrapping", "catching_up"):
                if self._state in ("bootstrapping", "catching_up"):
                    self._join_task = loop.create_task(self._join(), name="seq-join")
                return
            was = self._state
            self._state = "ready"
            await self._persist()
            self._configure()
        log.info("%s done: merged %d names from %d members; now voting", was, len(merged), len(ok))
        self._ready.set()

    # -- RRAPI: see seq.api (native gRPC server, batched into the coordinator) ---------

    # -- RRPeer (gRPC: snapshot, discovery) ---------------------------------------

    def _peer_snapshot(self, request: peer_pb.SnapshotRequest) -> peer_pb.SnapshotReply:
        state = _PEER_STATE[self._state]
        if request.endpoint_only:
            # only where the peer port is: asked before a caller knows the cluster id (--rejoin, juggler seq member)
            return peer_pb.SnapshotReply(state=state, peer_port=self.peer_port)
        if not self._cluster:
            # started with --join and not installed: it holds nothing and never voted
            return peer_pb.SnapshotReply(status=peer_pb.NOT_READY, state=state)
        if request.cluster != self._cluster:
            return peer_pb.SnapshotReply(status=peer_pb.WRONG_CLUSTER)
        assert self._store is not None
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
        if op == OP_INFO:
            if cluster and cluster != self._cluster:
                return peerlink.pack([WRONG_CLUSTER, self._info()])
            return peerlink.pack([OK, self._info()])
        if op == OP_FENCE:
            return self._fence(cluster, req)
        if op == OP_INSTALL:
            return self._install(cluster, req)
        if not self._cluster:
            # a --rejoin member still learning the configuration from the others: it does not
            # vote yet; WRONG_CLUSTER would send the caller to re-learn its own configuration
            if op not in _NOT_VOTING:
                raise ValueError(f"unknown op {op!r}")
            return peerlink.pack(_NOT_VOTING[op])
        if cluster != self._cluster:
            return peerlink.pack([WRONG_CLUSTER, 0, 0])
        if op == OP_CAS:
            expected, new = _u63(req[3]), _u63(req[4])
            epoch = req[5] if len(req) > 5 else 1
            if epoch != self._epoch:
                if type(epoch) is int and epoch > self._epoch:
                    self._newer_epoch(epoch)
                return peerlink.pack([WRONG_EPOCH, False, self._epoch])
            if not self._votes():
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
            epoch = req[3] if len(req) > 3 else 1
            if epoch != self._epoch:
                if type(epoch) is int and epoch > self._epoch:
                    self._newer_epoch(epoch)
                return peerlink.pack([WRONG_EPOCH, self._epoch])
            if not self._votes():
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
        except (MemberRemoved, SeqUnavailable):
            return peerlink.pack([NOT_READY, 0, 0])
        if r is None:
            return peerlink.pack([OK, 0, 0])
        return peerlink.pack([OK, r[0], r[1]])

    # -- membership changes (seq.membership drives them; these are one member's part) ---

    @staticmethod
    def _change(req: list[object]) -> tuple[str, int, tuple[str, ...]]:
        token, epoch, members = req[3], req[4], req[5]
        if type(token) is not str or not token or type(epoch) is not int or epoch < 1 or not isinstance(members, list):
            raise ValueError("bad membership change")
        ms = tuple(sorted(str(check_hostport(m)) for m in members))  # type: ignore[arg-type]
        if not ms or len(set(ms)) != len(ms):
            raise ValueError("bad member list")
        return token, epoch, ms

    async def _fence(self, cluster: object, req: list[object]) -> bytes:
        """Stop voting in this epoch for the change `token` (durably), and give this member's values.

        Refused when this member is not in the configuration the change starts from (STALE), or
        is fenced for another change (BUSY): at most one change per epoch gets a fenced majority."""
        token, epoch, members = self._change(req)
        async with self._admin_lock:
            if self._state == "removed":
                return peerlink.pack([REMOVED, self._info()])
            if cluster != self._cluster or not self._cluster:
                return peerlink.pack([WRONG_CLUSTER, self._info()])
            if self._state == "joining" or epoch != self._epoch + 1:
                return peerlink.pack([STALE, self._info()])
            if self._pending is not None and self._pending.token != token:
                return peerlink.pack([BUSY, self._info()])
            assert self._store is not None
            first = self._pending is None
            # From this loop turn on, this member accepts no compare-and-set of its epoch: every one
            # it accepted is in `values`.
            self._pending = Pending(epoch=epoch, members=members, token=token)
            values = self._store.snapshot()
            await self._persist()
            self._watch_fenced()
        if first:
            log.warning("fenced for a membership change to epoch %d (members %s): not voting until it is "
                        "installed", epoch, ",".join(members))
        return peerlink.pack([OK, values])

    async def _install(self, cluster: object, req: list[object]) -> bytes:
        """Move to the change's configuration with the values of the fenced majority merged in
        (durably, before voting in it); a member not in it is removed.

        Without values (None): a member of that configuration that missed its install (a new member
        the change did not reach) adopts it and catches up from all the other members before voting."""
        token, epoch, members = self._change(req)
        values = req[6]
        if values is None:
            return await self._adopt(cluster, epoch, members)
        if not isinstance(values, dict) or not all(type(k) is str and type(v) is int for k, v in values.items()):
            raise ValueError("bad values")
        me = self.config.self_address
        async with self._admin_lock:
            if self._state == "removed":
                return peerlink.pack([REMOVED, self._info()])
            if self._cluster and cluster != self._cluster:
                return peerlink.pack([WRONG_CLUSTER, self._info()])
            if epoch == self._epoch and members == self._members:
                return peerlink.pack([OK])  # done already
            if epoch <= self._epoch:
                return peerlink.pack([STALE, self._info()])
            assert self._store is not None and type(cluster) is str
            # no vote in the old epoch from here on (as if fenced), whatever happens next
            self._pending = Pending(epoch=epoch, members=members, token=token)
            await self._store.merge({k: v for k, v in values.items() if 1 <= v <= MAX_VALUE})
            was = self._state
            self._cluster, self._epoch, self._members, self._pending = cluster, epoch, members, None
            self._state = "ready" if me in members else "removed"
            await self._persist()
            self._configure()
            if self._join_task is not None and not self._join_task.done():
                self._join_task.cancel()
        if self._state == "removed":
            log.warning("removed from the cluster by a membership change (epoch %d, members now %s): refusing "
                        "every request from now on", epoch, ",".join(members))
        else:
            log.info("configuration epoch %d installed (members %s, was %s); voting", epoch, ",".join(members), was)
            self._ready.set()
        return peerlink.pack([OK])

    async def _adopt(self, cluster: object, epoch: int, members: tuple[str, ...]) -> bytes:
        me = self.config.self_address
        async with self._admin_lock:
            if self._state == "removed":
                return peerlink.pack([REMOVED, self._info()])
            if type(cluster) is not str or not cluster or (self._cluster and cluster != self._cluster):
                return peerlink.pack([WRONG_CLUSTER, self._info()])
            if epoch <= self._epoch or me not in members:
                return peerlink.pack([STALE, self._info()])
            self._cluster, self._epoch, self._members, self._pending = cluster, epoch, members, None
            self._state = "catching_up"
            await self._persist()
            self._configure()
            if self._join_task is None or self._join_task.done():
                self._ready.clear()
                self._join_task = asyncio.get_running_loop().create_task(self._join(), name="seq-join")
        log.warning("configuration epoch %d (members %s) adopted: catching up from all other members before "
                    "voting", epoch, ",".join(members))
        return peerlink.pack([OK])


#: the replies of a member that does not vote yet, by operation (each in the operation's shape)
_NOT_VOTING: dict[object, list[object]] = {OP_READ: [NOT_READY, 0], OP_CAS: [NOT_READY, False, 0],
                                           OP_ACQUIRE: [NOT_READY, 0, 0]}


def _u63(v: object) -> int:
    if type(v) is not int or not 0 <= v <= MAX_VALUE:
        raise ValueError("bad value")
    return v
