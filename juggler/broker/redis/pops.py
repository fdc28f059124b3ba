"""Blocking pops: the broker's listeners of Redis lists.

Each stream of pops owns one dedicated connection (blocking commands hold
it). With Redis >= 7 a popped batch's pop check (one script run: PTTL + DEL
of every TTL key) and the next ``BLMPOP`` go out in one write, so a batch
costs one round trip; before 7, ``BRPOP`` + ``RPOP count``. A failure
reconnects with the suite's backoff (``rustext.backoff``). Calls are never
lost to a cancellation: popped-but-unchecked calls go back to their lists as
they were, checked-but-unserved ones with their remaining TTL.

Nothing popped is dropped because a pop check failed: when the check's reply
is lost with its connection (the check may or may not have run, deleting the
TTL keys), the items are yielded with ``None`` for their PTTL, "unknown",
and the consumer decides from what it knows (the server knows each call's
deadline; a callee asks Redis again, see ``RedisBroker.calls``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import rustext
from juggler.broker.base import BrokerError
from juggler.broker.cluster import ClusterRouter, SingleRouter, cluster_error_kind
from juggler.broker.redis.config import RedisBrokerConfig, RedisBrokerStats
from juggler.broker.redis.keys import (
    POP_CHECK_MANY_SCRIPT,
    POP_CHECK_SCRIPT,
    REQUEUE_SCRIPT,
    call_key,
    call_ttl_key,
)
from juggler.broker.resp import RedisOutcomeUnknown, RedisReplyError, RespConnection
from rustext.backoff import Backoff, BackoffPolicy
from rustext.throttledlog import ThrottledLog

__all__ = ["RECONNECT_BACKOFF", "BlockingPops", "parse_payloads"]

log = logging.getLogger("juggler.broker.redis")

#: how the broker's listeners retry a lost Redis connection
RECONNECT_BACKOFF = BackoffPolicy(initial=0.05, maximum=2.0)


class BlockingPops:
    """The blocking-pop streams of one broker and what they leave behind (see module doc)."""

    def __init__(self, router: SingleRouter | ClusterRouter, config: RedisBrokerConfig,
                 stats: RedisBrokerStats) -> None:
        self.router = router
        self.config = config
        self.stats = stats
        #: the dedicated connections of the streams running now
        self.connections: set[RespConnection] = set()
        #: False on Redis < 7 (BRPOP + RPOP count instead of BLMPOP)
        self.has_blmpop = True
        self.closed = False
        self._orphans: set[asyncio.Future[Any]] = set()
        self._requeues: set[asyncio.Task[None]] = set()
        self._warn = ThrottledLog(log)
        #: when (loop time) a stream last lost its connection or failed to open one (None: never)
        self.lost_at: float | None = None

    async def aclose(self) -> None:
        """Let the pops and requeues in flight finish (calls they hold go back), then close."""
        self.closed = True
        if self._orphans:
            # blocking pops still in flight may hold calls: let them answer
            await asyncio.wait(set(self._orphans), timeout=self.config.block_timeout + 1.0)
        if self._requeues:
            await asyncio.wait(set(self._requeues), timeout=self.config.command_timeout)
        for conn in list(self.connections):
            conn.close()

    async def pops(
        self, keys: list[str], batch: int, what: str, ttl_key: Any, leftovers: list[tuple[bytes, bytes]] | None = None
    ) -> AsyncIterator[tuple[list[Any], list[Any]]]:
        """Yield (parsed payloads, their pop-check PTTLs) popped from `keys`, forever.

        One dedicated connection. With Redis >= 7 each batch's pop check and
        the next ``BLMPOP`` go out in one write on that connection (Redis
        runs the check, then blocks), so a batch costs one round trip. On
        failure it reconnects with a backoff. A pop whose reply is still in
        flight when the stream is cancelled or closed is not lost: with
        `leftovers` given, the pop is cut short with ``CLIENT UNBLOCK`` and
        whatever it popped (unchecked, TTL keys intact) is appended there;
        otherwise the reply goes to :meth:`_orphaned` when it comes.
        """
        backoff = Backoff(RECONNECT_BACKOFF)
        loop = asyncio.get_running_loop()
        opened_at = 0.0
        conn: RespConnection | None = None
        block = self.config.block_timeout
        timeout = block + self.config.command_timeout
        fut: asyncio.Future[Any] | None = None

        keys = list(keys)

        def blocking_pop(c: RespConnection) -> asyncio.Future[Any]:
            # BLMPOP/BRPOP serve the first non-empty key: rotating the order
            # keeps one busy URI from starving the others
            if len(keys) > 1:
                keys.append(keys.pop(0))
            if self.has_blmpop:
                return c.execute("BLMPOP", block, len(keys), *keys, "RIGHT", "COUNT", batch, timeout=timeout)
            return c.execute("BRPOP", *keys, block, timeout=timeout)

        try:
            while not self.closed:
                if conn is None or conn.closed:
                    fut = None
                    if conn is not None:
                        self.connections.discard(conn)
                        conn = None
                    try:
                        # a cluster: the node serving these keys' slot (they share one)
                        conn = await RespConnection.open(
                            self.router.address_for(keys[0]), connect_timeout=self.config.connect_timeout,
                            command_timeout=self.config.command_timeout,
                        )
                        self.connections.add(conn)
                        client_id = await conn.execute("CLIENT", "ID")
                        opened_at = loop.time()
                    except BrokerError as exc:
                        if conn is not None:
                            self.connections.discard(conn)
                            conn.close()
                            conn = None
                        self.lost_at = loop.time()
                        self.router.request_refresh()
                        delay = backoff.next_delay()
                        self._warn.warning("%s listener: %s; retrying in %.2fs", what, exc, delay,
                                           key=f"connect {what}")
                        await asyncio.sleep(delay)
                        continue
                if fut is None:
                    fut = blocking_pop(conn)
                try:
                    reply = await asyncio.shield(fut)
                    fut = None
                except RedisReplyError as exc:
                    fut = None
                    if self.has_blmpop and "unknown command" in str(exc).lower():
                        self.has_blmpop = False
                        continue
                    if cluster_error_kind(exc) is not None:
                        # MOVED (failover, resharding), CLUSTERDOWN, …: reconnect
                        # where the slot map says (MOVED names the node)
                        self.router.note_error(exc)
                        conn.close()
                    self._warn.warning("%s listener: %s", what, exc, key=f"reply {what}")
                    await asyncio.sleep(backoff.after_loss(loop.time() - opened_at))
                    continue
                except BrokerError as exc:
                    fut = None
                    self.lost_at = loop.time()
                    self.router.request_refresh()
                    # afresh only after a connection that stayed up a while (see Backoff.after_loss)
                    delay = backoff.after_loss(loop.time() - opened_at)
                    self._warn.warning("%s listener lost its connection: %s; reconnecting in %.2fs", what, exc,
                                       delay, key=f"lost {what}")
                    await asyncio.sleep(delay)
                    continue
                if reply is None:
                    continue
                key, items = reply
                if self.has_blmpop:
                    payloads = list(items)
                else:
                    payloads = [items]
                    if batch > 1:
                        try:
                            more = await conn.execute("RPOP", key, batch - 1)
                        except BrokerError:
                            more = None
                        if more:
                            payloads.extend(more)
                parsed = parse_payloads(payloads, what)
                if not parsed:
                    continue
                ttl_keys = [ttl_key(p) for p in parsed]
                script = POP_CHECK_MANY_SCRIPT if len(ttl_keys) > 1 else POP_CHECK_SCRIPT
                (check,) = conn.execute_packed(script.pack(ttl_keys, ()))
                if self.has_blmpop:
                    fut = blocking_pop(conn)  # same write as the check
                try:
                    pttls = await asyncio.shield(check)
                except asyncio.CancelledError:
                    if what == "calls":
                        # popped and being checked: put them back once the check answers
                        check.add_done_callback(lambda f, ps=parsed: self._requeue_checked(ps, f))
                    raise
                except RedisReplyError as exc:
                    pttls = None
                    if str(exc).startswith("NOSCRIPT"):
                        try:
                            pttls = await self.router.pool_for(ttl_keys[0]).evalsha(script, ttl_keys, ())
                        except BrokerError as exc2:
                            exc = exc2
                    if pttls is None:
                        self.stats.checks_unknown += len(parsed)
                        self._warn.warning("pop check of %d %s failed (%s): handing them on with their deadline "
                                           "unknown", len(parsed), what, exc, key=f"check {what}")
                        pttls = [None] * len(parsed)
                except BrokerError as exc:
                    # the reply is lost with the connection: the check may have run (TTL keys gone)
                    self.stats.checks_unknown += len(parsed)
                    self._warn.warning("pop check of %d %s failed (%s): handing them on with their deadline unknown",
                                       len(parsed), what, exc, key=f"check {what}")
                    pttls = [None] * len(parsed)
                if not isinstance(pttls, list):
                    pttls = [pttls]
                yield parsed, pttls
        finally:
            if conn is not None and fut is not None and leftovers is not None and not self.router.closed:
                # a pop is in flight: cut it short, keep what it popped
                try:
                    if not fut.done():
                        unblock = self.router.pool_for(keys[0]).execute("CLIENT", "UNBLOCK", client_id)
                        async with asyncio.timeout(2.0):  # not wait_for (3.11)
                            await unblock
                    async with asyncio.timeout(2.0):  # not wait_for (3.11)
                        reply = await asyncio.shield(fut)
                    if reply:
                        k, items = reply
                        leftovers.extend((k, item) for item in (items if isinstance(items, list) else [items]))
                    fut = None
                except (BrokerError, TimeoutError):
                    pass  # the orphan path below
            if conn is not None:
                if fut is not None and what == "calls":
                    # a pop is in flight: the calls it may bring must not be lost
                    if fut.done():
                        self._orphaned(fut, conn)
                    else:
                        self._orphans.add(fut)
                        fut.add_done_callback(lambda f, c=conn: self._orphaned(f, c))
                else:
                    self.connections.discard(conn)
                    conn.close()

    def _requeue_checked(self, parsed: list[Any], check: asyncio.Future[Any]) -> None:
        """Calls popped by a stream closed while their pop check was in flight: back to their lists."""
        if self.router.closed or check.cancelled():
            return
        loop = asyncio.get_running_loop()
        if check.exception() is not None:
            # the check's reply was lost: it may have run (TTL keys gone); ask again, then requeue
            task = loop.create_task(self._recheck_requeue(parsed))
        else:
            pttls = check.result()
            pttls = pttls if isinstance(pttls, list) else [pttls]
            now = time.monotonic()
            items = [(p, t, now) for p, t in zip(parsed, pttls, strict=True) if isinstance(t, int) and t > 0]
            if not items:
                return
            task = loop.create_task(self.requeue(items))
        self._requeues.add(task)
        task.add_done_callback(self._requeues.discard)

    async def _recheck_requeue(self, parsed: list[Any]) -> None:
        now = time.monotonic()
        pttls = await self.recheck(parsed, [None] * len(parsed))
        await self.requeue([(p, t, now) for p, t in zip(parsed, pttls, strict=True)])

    async def recheck(self, parsed: list[Any], pttls: list[Any]) -> list[Any]:
        """Calls popped whose pop check's reply was lost (None): asked again.
        A TTL key still there means the check never ran: its PTTL is right
        (and the key is deleted now). A key gone is ambiguous: expired, or
        deleted by the check whose reply was lost. Such a call gets the
        longest deadline a call gets by default (``unknown_deadline_ms``):
        dropping a live call is worse than running one that expired, whose
        result the server drops (it knows the call's deadline)."""
        unknown = [i for i, t in enumerate(pttls) if t is None]
        if not unknown:
            return pttls
        keys = [call_ttl_key(parsed[i].uri, parsed[i].msg_uuid) for i in unknown]
        again: list[Any] = [-2] * len(keys)
        try:
            async with asyncio.timeout(self.config.command_timeout):
                script = POP_CHECK_MANY_SCRIPT if len(keys) > 1 else POP_CHECK_SCRIPT
                reply = await self.router.pool_for(keys[0]).evalsha(script, keys, ())
                again = reply if isinstance(reply, list) else [reply]
        except (BrokerError, TimeoutError) as exc:
            self._warn.warning("asking again for %d calls whose pop check was lost failed (%s): keeping them with "
                               "an unknown deadline", len(keys), exc, key="recheck")
        out = list(pttls)
        for i, t in zip(unknown, again, strict=True):
            out[i] = t if isinstance(t, int) and t > 0 else self.config.unknown_deadline_ms
        return out

    def _orphaned(self, fut: asyncio.Future[Any], conn: RespConnection) -> None:
        """The reply of a cancelled blocking pop: put calls back, drop results."""
        self._orphans.discard(fut)
        self.connections.discard(conn)
        conn.close()
        if fut.cancelled() or fut.exception() is not None:
            return
        reply = fut.result()
        if not reply:
            return
        key, items = reply
        payloads = list(items) if isinstance(items, list) else [items]
        key_s = key.decode() if isinstance(key, bytes) else key
        if key_s.startswith("juggler:calls:") and not self.router.closed:
            task = asyncio.get_running_loop().create_task(self._requeue_raw(key_s, payloads))
            self._requeues.add(task)
            task.add_done_callback(self._requeues.discard)
        else:
            log.info("dropping %d popped payloads of %s after cancellation", len(payloads), key_s)

    async def requeue_raw_list(self, popped: list[tuple[bytes, bytes]]) -> None:
        """Calls popped but never pop-checked (TTL keys intact), back to their lists as they were."""
        by_key: dict[str, list[bytes]] = {}
        for key, payload in popped:
            by_key.setdefault(key.decode(), []).append(payload)
        for key, items in by_key.items():
            await asyncio.shield(self._requeue_raw(key, items))

    async def _requeue_raw(self, list_key: str, payloads: list[bytes]) -> None:
        """Calls popped without a pop check yet: their TTL keys are intact, so
        they go back as they were (one RPUSH: next to be popped)."""
        async def push(conn: RespConnection) -> None:
            await conn.execute("RPUSH", list_key, *reversed(payloads))

        await self._until_sent(len(payloads), lambda: self.router.run(list_key, push))

    # CalleeBroker --------------------------------------------------------------

    async def requeue(self, items: list[tuple[Any, int, float]]) -> None:
        """Calls taken out of Redis and not run, back at the head of their
        lists with the time they have left (items: call, PTTL in ms, when it was read)."""
        by_key: dict[str, list[tuple[Any, int, float]]] = {}
        for item in reversed(items):  # RPUSH one by one: the first item ends up next to be popped
            by_key.setdefault(call_key(item[0].uri), []).append(item)
        if not self.router.cluster:
            flat = [c for cs in by_key.values() for c in cs]
            await self._until_sent(len(flat), lambda: self._requeue_now(None, flat))
            return
        for list_key, group in by_key.items():  # one node per list: each goes back (or not) on its own
            await self._until_sent(len(group), lambda k=list_key, g=group: self._requeue_now(k, g))

    async def _requeue_now(self, list_key: str | None, items: list[tuple[Any, int, float]]) -> None:
        calls = []
        live = []
        now = time.monotonic()
        for p, pttl, at in items:
            left = pttl - int((now - at) * 1000)
            if left <= 0:  # not put back (a callee would drop it), and counted once
                self.stats.expired_calls += 1
                continue
            live.append((p, pttl, at))
            payload = rustext.build_call_payload(p.conn_uuid, p.msg_uuid, p.uri, p.args, p.trace)
            calls.append(((call_ttl_key(p.uri, p.msg_uuid), call_key(p.uri)), (left, payload)))
        items[:] = live  # a second attempt takes only these
        if not calls:
            return
        pool = self.router.pool if list_key is None else self.router.pool_for(list_key)
        await asyncio.shield(pool.evalsha_many(REQUEUE_SCRIPT, calls))  # type: ignore[union-attr]

    async def _until_sent(self, count: int, attempt: Callable[[], Awaitable[Any]]) -> None:
        """Put `count` calls back with `attempt`, tried again with a backoff while
        Redis cannot be reached (for up to ``command_timeout`` s): a call taken out
        of Redis is not dropped on a first failure. Not tried again when it may
        have run (outcome unknown): the calls would be queued twice."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.command_timeout
        backoff = Backoff(RECONNECT_BACKOFF)
        while True:
            try:
                await attempt()
                return
            except BrokerError as exc:
                delay = backoff.next_delay()
                if (isinstance(exc, RedisOutcomeUnknown | RedisReplyError) or self.router.closed
                        or loop.time() + delay > deadline):
                    self._warn.warning("could not put back %d calls: %s", count, exc, key="requeue")
                    return
            await asyncio.sleep(delay)


def parse_payloads(payloads: list[bytes], what: str) -> list[Any]:
    """Parse call/result payloads in one crossing into Rust; invalid ones are logged and dropped."""
    parsed = rustext.parse_call_payloads(payloads)
    good = [p for p in parsed if p is not None]
    if len(good) != len(parsed):
        log.warning("dropping %d invalid %s payloads", len(parsed) - len(good), what)
    return good
