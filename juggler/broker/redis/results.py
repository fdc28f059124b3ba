"""Results: the ONE listener of a server process's results list.

Results for every call this process made come back on one list keyed by
its routing key ``conn_uuid``; the listener pops up to ``result_batch`` at
once (their pop checks pipelined with the next pop, see
:mod:`juggler.broker.redis.pops`), drops expired ones and hands each live
one to the ``on_result`` sink, which routes it by ``msg_uuid``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from juggler.broker.base import Result, ResultHandler
from juggler.broker.redis.config import RedisBrokerConfig, RedisBrokerStats
from juggler.broker.redis.keys import result_key, result_ttl_key
from juggler.broker.redis.pops import BlockingPops

__all__ = ["ResultsListener"]

log = logging.getLogger("juggler.broker.redis")


class ResultsListener:
    """Pops the results of `conn_uuid` and hands them to ``handler`` (see module doc)."""

    def __init__(self, pops: BlockingPops, conn_uuid: str, config: RedisBrokerConfig,
                 stats: RedisBrokerStats) -> None:
        self._pops = pops
        self._conn_uuid = conn_uuid
        self.config = config
        self.stats = stats
        self.handler: ResultHandler | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._results_loop(), name="juggler-redis-results")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5.0)

    async def _results_loop(self) -> None:
        key = result_key(self._conn_uuid)
        pops = self._pops.pops(
            [key], self.config.result_batch, "results", lambda p: result_ttl_key(p.conn_uuid, p.msg_uuid)
        )
        try:
            async for parsed, pttls in pops:
                self._route_results(parsed, pttls)
        finally:
            await pops.aclose()

    def _route_results(self, parsed: list[Any], pttls: list[Any]) -> None:
        handler = self.handler
        for p, pttl in zip(parsed, pttls, strict=True):
            # None: the pop check's reply was lost; the server's table of pending calls
            # knows whether the call still waits, so the result goes on to it
            if pttl is not None and (isinstance(pttl, Exception) or pttl <= 0):
                self.stats.expired_results += 1
                continue
            self.stats.results_received += 1
            if handler is not None:
                try:
                    handler(Result(conn_uuid=p.conn_uuid, msg_uuid=p.msg_uuid, uri=p.uri, args=p.args))
                except Exception:
                    log.exception("result handler failed")
