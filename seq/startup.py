"""What a member starts from: its flags (:class:`ServerConfig`) and its data
directory, checked against them (:func:`prepare_data_dir`) and locked
(:func:`lock_data_dir`) before :class:`seq.server.RRServer` touches it.

Apart from the member's lifecycle so that the rules for a safe start read in
one place.

The configuration persisted in the data dir wins over ``--peers``, which
only seeds a brand-new cluster (``--bootstrap``) and names whom a
``--rejoin`` member asks; a different ``--peers`` is logged and ignored.

Refused starts (:class:`UnsafeStart`): an empty data dir without
``--bootstrap``/``--rejoin``/``--join``; ``--bootstrap`` or ``--join`` on an
initialized dir; a joining member's dir without ``--join``; a removed
member's dir; a log missing under a ready meta; a dir written before
membership changes (no configuration in it) started with another member
list than its own; a data dir locked by another process.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from typing import Literal

from rustext.net import check_hostport
from rustext.tls import ClientTls, ServerTls

from seq.errors import UnsafeStart
from seq.log import MAX_VALUE
from seq.membership import fingerprint, majority
from seq.store import Meta, ensure_dir, log_generations, read_meta, write_meta

# the member's logger: a start's warnings are the server's, whichever module logs them
log = logging.getLogger("seq.server")

Mode = Literal["normal", "bootstrap", "rejoin", "join"]


@dataclass(kw_only=True)
class ServerConfig:
    """Configuration of one member. Times in seconds."""

    listen: str  # HOST:PORT to bind
    data_dir: str  # data directory: meta.json + the log, locked while a server uses it
    peers: tuple[str, ...] = ()  # the OTHER members, HOST:PORT as they listen
    advertise: str | None = None  # this member's address as peers list it (default: listen)
    mode: Mode = "normal"  # "bootstrap" (brand-new cluster), "rejoin" (data lost), "join" (to be added) or "normal"
    default_timeout: float = 5.0  # NextID deadline when the client sends none
    peer_timeout: float = 1.0  # bound of one member-to-member RPC
    drain_timeout: float = 2.0  # at shutdown, seconds the calls received get to be answered
    backoff_base: float = 0.001  # first retry window of a lost round
    backoff_cap: float = 0.05  # largest retry window
    max_range: int = 1 << 32  # largest range_size accepted
    compact_bytes: int = 4 << 20  # compact the log past this size
    join_poll: float = 0.2  # how often a joining member polls the others
    forward: bool = True  # forward NextID batches to the name's preferred coordinator
    max_inflight: int = 1  # concurrent rounds per name (1: bigger batches, best when CPU-bound)
    #: NextID calls received and not answered yet, at most; beyond, a call is refused at once with
    #: RESOURCE_EXHAUSTED (the client tries another member after a backoff) instead of waiting for its deadline
    max_pending: int = 10000
    linger: float = 0.001  # back-to-back rounds of a name wait this long to batch more requests
    peer_port: int = 0  # rpc.transport port for member-to-member calls, on the --listen host (0: any)
    tls_cert: str | None = None  # PEM chain: RRAPI over TLS, and this member's identity to the others
    tls_key: str | None = None  # PEM private key of tls_cert
    tls_ca: str | None = None  # PEM CA the members' certificates chain to (each verifies the others)
    http: str | None = None  # HOST:PORT of the HTTP/JSON API and status page (None: no HTTP listener)
    metrics_max_names: int = 1000  # names with series of their own; later names are counted under name="_other"

    def __post_init__(self) -> None:
        check_hostport(self.listen)
        self.peers = tuple(check_hostport(p) for p in self.peers)
        if self.advertise is not None:
            check_hostport(self.advertise)
        if self.self_address in self.peers:
            raise ValueError("--peers lists the other members only, not this one")
        if len(set(self.peers)) != len(self.peers):
            raise ValueError("duplicate peer")
        if self.mode not in ("normal", "bootstrap", "rejoin", "join"):
            raise ValueError(f"bad mode {self.mode!r}")
        for name in ("default_timeout", "peer_timeout", "backoff_base", "backoff_cap", "join_poll"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        if self.max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if not 1 <= self.max_range <= MAX_VALUE:
            raise ValueError("max_range out of range")
        if not 0 <= self.linger <= 1.0:
            raise ValueError("linger must be in [0, 1] s")
        if not 0 <= self.peer_port < 65536:
            raise ValueError("peer_port out of range")
        if self.http is not None:
            check_hostport(self.http)
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
        """Fingerprint of the member list given (``--peers`` and this member): the id a
        cluster bootstrapped with this list gets. Members of another cluster refuse each other."""
        return fingerprint(self.members)

    @property
    def quorum(self) -> int:
        """R = W = N // 2 + 1, so R + W > N (for the member list given)."""
        return majority(len(self.members))


def prepare_data_dir(config: ServerConfig) -> tuple[Meta, bool]:
    """Check the data dir against the flags; write meta for a new member.

    Returns (the member's meta: state and configuration, whether the store
    may start from an empty log). The configuration persisted in the dir
    wins over ``--peers``, which only seeds a brand-new cluster (and names
    whom a ``--rejoin`` member asks for the configuration).
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
                "other members before it votes); a member to be added to a running cluster "
                "starts with --join (then: juggler seq member add)"
            )
        if mode == "join":
            new = Meta(state="joining", cluster="", epoch=0, members=())
        elif mode == "bootstrap":
            new = Meta(state="bootstrapping", cluster=cluster, epoch=1, members=config.members)
        else:
            if len(config.members) == 1:
                raise UnsafeStart("a single-member cluster has no one to catch up from")
            # epoch 0: the configuration (and the cluster id) is asked from --peers before catching up
            new = Meta(state="catching_up", cluster="", epoch=0, members=config.members)
        write_meta(d, new)
        return new, True
    if meta.state == "removed":
        raise UnsafeStart(
            f"{d} belongs to a member removed from its cluster (configuration epoch {meta.epoch}: "
            f"{','.join(meta.members)}). To add this host again, wipe the directory and start with --join"
        )
    if mode == "join" and meta.state != "joining":
        raise UnsafeStart(f"{d} is already initialized: --join is only for an empty data directory")
    if mode != "join" and meta.state == "joining":
        raise UnsafeStart(f"{d} belongs to a member waiting to be added: start it with --join")
    if meta.epoch == 0 and meta.state != "joining" and not meta.members:
        # written before membership changes: the configuration is the list it was made with
        if meta.cluster != cluster:
            raise UnsafeStart(
                f"{d} belongs to a cluster with another member list (fingerprint {meta.cluster}, "
                f"configured {cluster}): give the --peers it was started with"
            )
        meta = Meta(state=meta.state, cluster=meta.cluster, epoch=1, members=config.members)
        write_meta(d, meta)
    if mode == "bootstrap" and meta.state == "ready":
        raise UnsafeStart(f"{d} is already initialized: --bootstrap is only for a brand-new cluster")
    if mode == "rejoin" and meta.state != "catching_up":
        meta = Meta(state="catching_up", cluster=meta.cluster, epoch=meta.epoch, members=meta.members,
                    pending=meta.pending)
        write_meta(d, meta)
    if meta.state == "ready" and not gens:
        raise UnsafeStart(f"{d}: meta.json says ready but the log is gone (data lost): start with --rejoin")
    if meta.members and config.peers and meta.members != config.members:
        log.warning(
            "%s holds configuration epoch %d (members %s): it is used, --peers (%s) is ignored",
            d, meta.epoch, ",".join(meta.members), ",".join(config.peers),
        )
    return meta, meta.state != "ready"


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
