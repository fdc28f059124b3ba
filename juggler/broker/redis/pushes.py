"""Pushing onto Redis lists, pipelined: the connection side of the broker.

Every push of one event-loop turn goes out in one write: :meth:`Pusher.push`
queues an item on its list, and at the end of the turn each list's items are
pushed by ONE script run (upstream's push script for one item, the batch
script for more), all runs on one pooled connection. On a cluster each
list goes to the node of its slot with the router's retries. A Redis error
reply fails the items of that run only: ``CapacityExceeded`` for a full list,
else ``BrokerError``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from juggler.broker.base import BrokerError, CapacityExceeded
from juggler.broker.cluster import ClusterRouter, SingleRouter
from juggler.broker.redis.keys import CAPACITY_MESSAGE, PUSH_MANY_SCRIPT, PUSH_SCRIPT
from juggler.broker.resp import RedisReplyError, Script, evalsha

__all__ = ["Item", "Pusher", "fail_pushes", "push_script_run", "settle_pushes"]

#: one item to push: its TTL key, milliseconds to live, payload, and the future settled with the outcome
Item = tuple[str, int, bytes, "asyncio.Future[Any]"]


class Pusher:
    """Batches pushes per event-loop turn (see module doc). Tasks it starts are
    awaited by :meth:`aclose`."""

    def __init__(self, router: SingleRouter | ClusterRouter, *, cap: int) -> None:
        self.router = router
        #: list capacity of :meth:`push` (0 = unbounded)
        self.cap = cap
        self._batch: dict[str, list[Item]] = {}
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def push(self, list_key: str, ttl_key: str, ttl_ms: int, payload: bytes) -> asyncio.Future[Any]:
        """Queue one item; the future gets the list's length, or fails."""
        loop = self._loop
        if loop is None:  # once: asking costs a getpid(2) per call
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._batch.setdefault(list_key, []).append((ttl_key, ttl_ms, payload, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        groups, self._batch = self._batch, {}
        if groups:
            task = self._loop.create_task(self.push_groups(groups, self.cap))  # type: ignore[union-attr]
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def aclose(self, timeout: float) -> None:
        """Let the pushes in flight answer their callers (they are short), up to `timeout` s."""
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=timeout)
            for t in late:
                t.cancel()

    async def push_groups(
        self, groups: dict[str, list[Item]], cap: int
    ) -> None:
        """Push each list's items with one script run; settle each item's future."""
        try:
            await self._push_now(groups, cap)
        finally:
            for items in groups.values():
                for *_, fut in items:
                    if not fut.done():
                        fut.set_exception(BrokerError("broker closed"))
                        fut.exception()

    async def _push_now(
        self, groups: dict[str, list[Item]], cap: int
    ) -> None:
        if self.router.cluster:
            await asyncio.gather(*(self._push_one_cluster(k, items, cap) for k, items in groups.items()))
            return
        try:
            conn = await self.router.pool.connection()  # type: ignore[union-attr]
        except BaseException as exc:
            err = exc if isinstance(exc, BrokerError) else BrokerError(str(exc))
            for items in groups.values():
                for *_, fut in items:
                    if not fut.done():
                        fut.set_exception(err)
            if not isinstance(exc, Exception):
                raise
            return
        sent: list[tuple[Script, tuple[Any, ...], tuple[Any, ...], list[Any], asyncio.Future[Any]]] = []
        for list_key, items in groups.items():
            script, keys, argv = push_script_run(list_key, items, cap)
            (f,) = conn.execute_packed(script.pack(keys, argv))
            sent.append((script, keys, argv, items, f))
        for script, keys, argv, items, f in sent:
            try:
                try:
                    reply = await f
                except RedisReplyError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        raise
                    (f2,) = conn.execute_packed(script.pack_eval(keys, argv))
                    reply = await f2
            except BrokerError as exc:  # RedisReplyError included
                fail_pushes(items, exc)
                continue
            settle_pushes(items, reply)

    async def _push_one_cluster(
        self, list_key: str, items: list[Item], cap: int
    ) -> None:
        """One list's items in one script run on the node of its slot, with
        the cluster's retries (MOVED/ASK/CLUSTERDOWN/connection errors).
        Scripts of one loop turn to one node still go out in one write."""
        script, keys, argv = push_script_run(list_key, items, cap)
        try:
            reply = await self.router.run(list_key, lambda c: evalsha(c, script, keys, argv))
        except BrokerError as exc:  # RedisReplyError included
            fail_pushes(items, exc)
            return
        settle_pushes(items, reply)


def push_script_run(
    list_key: str, items: list[Item], cap: int
) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
    """The script, keys and argv that push ``items`` (ttl key, ms, payload,
    future) onto one calls list: the upstream single-call script for one
    item, the batch script for more (one round trip either way)."""
    if len(items) == 1:
        ttl_key, ms, payload, _ = items[0]
        return PUSH_SCRIPT, (ttl_key, list_key), (ms, payload, cap)
    keys = [list_key]
    argv: list[Any] = [cap]
    for ttl_key, ms, payload, _ in items:  # a plain loop: no generator to resume per item
        keys.append(ttl_key)
        argv += (ms, payload)
    return PUSH_MANY_SCRIPT, tuple(keys), tuple(argv)


def fail_pushes(items: list[Any], exc: BrokerError) -> None:
    """Fail every call of one push script run: a Redis error reply becomes
    CapacityExceeded ("list capacity exceeded") or BrokerError (NACK 500)."""
    err: BrokerError
    if not isinstance(exc, RedisReplyError):
        err = exc  # already a BrokerError (e.g. the connection failed)
    elif CAPACITY_MESSAGE in str(exc):
        err = CapacityExceeded(CAPACITY_MESSAGE)
    else:
        err = BrokerError(str(exc))
    for *_, fut in items:
        if not fut.done():
            fut.set_exception(err)


def settle_pushes(items: list[Any], reply: Any) -> None:
    """Resolve each call of one push script run from its reply: the list
    length, or 0 when that entry was trimmed for capacity."""
    replies = reply if isinstance(reply, list) else [reply]
    for (*_, fut), n in zip(items, replies, strict=True):
        if fut.done():
            continue
        if n == 0:
            fut.set_exception(CapacityExceeded(CAPACITY_MESSAGE))
        else:
            fut.set_result(n)
