"""The Redis broker: the exact key layout and scripts of upstream juggler.

Keys (protocols/juggler.md; hash tags keep a list and its TTL keys in one
cluster slot):

- ``juggler:calls:{URI}``                           LIST of call payloads
- ``juggler:calls:timeout:{URI}:<msg_uuid>``        TTL key of one call
- ``juggler:results:{CONN_UUID}``                   LIST of result payloads
- ``juggler:results:timeout:{CONN_UUID}:<msg_uuid>`` TTL key of one result

The push and pop-check Lua scripts are byte-identical to upstream's, so their
EVALSHA hashes (``b0cdecc8…``, ``f17b6ff7…``) are the same and a Go server,
Go callee or Go client of the original works through the same Redis.

Resources, per process (upstream used two Redis connections per websocket):

- a small pool of command connections (``pool_size``, default 2) with
  implicit pipelining: every push, pop check and PUBLISH issued during one
  event-loop turn goes out in one write;
- ONE results listener for the process-wide routing key ``conn_uuid``:
  ``BLMPOP`` (Redis >= 7; ``BRPOP`` + ``RPOP count`` before) takes up to
  ``result_batch`` results at once, their pop checks are pipelined, and each
  unexpired result goes to the ``on_result`` sink, which routes it by
  ``msg_uuid``;
- ONE pub-sub connection fanning events out to every local subscriber, with
  reference-counted ``SUBSCRIBE``/``PSUBSCRIBE`` (a channel is subscribed in
  Redis while at least one local subscriber wants it); it reconnects and
  re-subscribes by itself;
- one blocking connection per ``calls()`` stream of a callee, popping up to
  ``call_batch`` calls at once.

TTL semantics: a call's TTL key lives ``timeout_ms``; a popped call or result
whose TTL key is gone (PTTL <= 0) has expired and is dropped (counted in
``stats``). A callee stores its result with the call's remaining time.

Call lists nobody serves: upstream lets them grow forever (the TTL keys
expire, the entries stay). Here each URI's list holds at most ``call_cap``
calls (default 10,000): past that, CALLs to that URI are refused with
"list capacity exceeded" (the server's NACK 500), so a caller learns nobody
consumes them instead of filling Redis. Stale entries cost nothing more: a
callee that comes later pops them, finds their TTL keys gone and drops them
without running them. ``call_cap=0`` restores upstream's unbounded lists.
Results lists are bounded the same way by ``result_cap``.

Redis Cluster (``cluster`` seeds): every key of one call shares the URI's
slot and every key of one result the routing key's slot, so each script runs
on one node; :func:`group_by_slot` / :meth:`RedisBroker.call_groups` split a
callee's URIs into one blocking pop per slot. Routing, redirections and
retries are the router's (``juggler.broker.cluster``).

Layout (one concern a module):

- keys.py     the key layout and the Lua scripts (upstream's, byte for byte)
- config.py   ``RedisBrokerConfig`` (options, validated) and ``RedisBrokerStats``
- pushes.py   connection and pipelining: the pushes of a loop turn in one write
- pops.py     blocking pops (``BLMPOP``/``BRPOP``), pop checks, requeues, reconnects
- results.py  the one results listener of a server process
- pubsub.py   the one pub-sub connection and its reference-counted fan-out
- sharded.py  sharded pub-sub (SSUBSCRIBE/SPUBLISH, Redis >= 7), one connection per node:
              what presence's join/leave notices travel on
- broker.py   ``RedisBroker``: the caller, callee and pub-sub interfaces over them
"""

from juggler.broker.cluster import key_slot
from juggler.broker.redis.broker import RedisBroker
from juggler.broker.redis.config import RedisBrokerConfig, RedisBrokerStats
from juggler.broker.redis.keys import (
    CAPACITY_MESSAGE,
    POP_CHECK_SCRIPT,
    PUSH_SCRIPT,
    call_key,
    call_ttl_key,
    group_by_slot,
    result_key,
    result_ttl_key,
)

__all__ = [
    "CAPACITY_MESSAGE",
    "POP_CHECK_SCRIPT",
    "PUSH_SCRIPT",
    "RedisBroker",
    "RedisBrokerConfig",
    "RedisBrokerStats",
    "call_key",
    "call_ttl_key",
    "group_by_slot",
    "key_slot",
    "result_key",
    "result_ttl_key",
]
