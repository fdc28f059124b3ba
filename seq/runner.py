"""seq's composition root: a member process (:class:`MemberProcess`: the
member and its metrics endpoint) and a snowflake worker, started as the
command line runs them (``juggler seq server``, ``juggler seq snowflake``);
each a :class:`rustext.service.Service`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rustext.net import ListenError, listen_error
from rustext.service import ServiceBase

from seq.errors import SeqError
from seq.server import RRServer
from seq.startup import ServerConfig
from seq.worker import SnowflakeWorker, WorkerConfig

__all__ = ["MemberProcess", "start_member", "start_worker"]

log = logging.getLogger("seq.server")


class MemberProcess(ServiceBase):
    """A started member and, when asked for, its Prometheus endpoint."""

    def __init__(self, server: RRServer, metrics: Any) -> None:
        self.server, self.metrics = server, metrics

    def draining(self) -> str:
        """What a drain waits for, in words (empty: nothing in flight)."""
        n = self.server.pending()
        grace = self.server.config.drain_timeout
        return f"answering {n} call{'s' if n != 1 else ''} for up to {grace:g} s" if n else ""

    async def start(self) -> None:
        """Started by :func:`start_member` already."""

    async def drain(self, timeout: float | None = None) -> None:
        """Close the metrics endpoint, drain the member (`timeout` s, None:
        its ``drain_timeout``), log its round statistics."""
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.shutdown)
            self.metrics = None
        await self.server.drain(timeout)
        s, store = self.server.stats, self.server.store
        log.info(
            "stopped: requests=%d rounds_won=%d conflicts=%d no_quorum=%d expired=%d ids=%d "
            "max_attempts=%d fsync_batches=%d writes=%d",
            s.requests, s.rounds_won, s.rounds_conflict, s.rounds_no_quorum, s.requests_expired,
            s.ids_issued, s.max_attempts, store.fsyncs, store.writes,
        )

    def abort(self) -> None:
        self.server.abort()

    def reload_tls(self) -> None:
        """SIGHUP: the certificate files again (logged; the current
        certificate stays when the new files are unusable)."""
        from rustext.tls import TlsConfigError

        try:
            self.server.reload_tls()
            log.info("TLS certificate reloaded from %s", self.server.config.tls_cert)
        except (TlsConfigError, ValueError) as exc:
            log.error("TLS certificate not reloaded: %s", exc)


async def start_member(config: ServerConfig, metrics_port: int | None = None) -> MemberProcess:
    """Start a member (and its metrics endpoint on 127.0.0.1:`metrics_port`).
    Raises UnsafeStart (its data directory does not fit the flags),
    ListenError (a busy port), SeqError or OSError."""
    server = RRServer(config)
    await server.start()
    metrics = None
    if metrics_port is not None:
        from seq.metrics import serve_metrics

        try:
            metrics = serve_metrics(server, metrics_port)
        except OSError as exc:
            await server.drain(0)
            raise listen_error("127.0.0.1", metrics_port, exc) from exc
    return MemberProcess(server, metrics)


async def start_worker(config: WorkerConfig) -> SnowflakeWorker:
    """Start a snowflake worker. Raises ListenError, or SeqError/OSError/ValueError."""
    worker = SnowflakeWorker(config)
    try:
        await worker.start()
    except (ListenError, SeqError, OSError, ValueError):
        await worker.drain(0)
        raise
    return worker
