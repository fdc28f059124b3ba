"""Upstream juggler's Redis key layout and Lua scripts, byte for byte.

The push and pop-check scripts are upstream's exactly, so their EVALSHA
hashes (``b0cdecc8…``, ``f17b6ff7…``) are the same and a Go server, Go callee
or Go client of the original works through the same Redis. The batch scripts
run the same commands for several items of one list in one script run.
"""

from __future__ import annotations

from collections.abc import Iterable

from juggler.broker.cluster import key_slot
from juggler.broker.resp import Script

__all__ = [
    "CAPACITY_MESSAGE", "POP_CHECK_MANY_SCRIPT", "POP_CHECK_SCRIPT", "PUSH_MANY_SCRIPT", "PUSH_SCRIPT",
    "REQUEUE_SCRIPT", "call_key", "call_ttl_key", "group_by_slot", "result_key", "result_ttl_key",
]

# Upstream's scripts, byte for byte (same SHA1, so EVALSHA is shared with Go peers).
PUSH_SCRIPT = Script(
    "\n\tredis.call(\"SET\", KEYS[1], ARGV[1], \"PX\", tonumber(ARGV[1]))\n"
    "\tlocal res = redis.call(\"LPUSH\", KEYS[2], ARGV[2])\n"
    "\tlocal limit = tonumber(ARGV[3])\n"
    "\tif res > limit and limit > 0 then\n"
    "\t\tlocal diff = res - limit\n"
    "\t\tredis.call(\"LTRIM\", KEYS[2], diff, limit + diff)\n"
    "\t\treturn redis.error_reply(\"list capacity exceeded\")\n"
    "\tend\n"
    "\treturn res\n"
)
POP_CHECK_SCRIPT = Script(
    "\n\tlocal res = redis.call(\"PTTL\", KEYS[1])\n"
    "\tredis.call(\"DEL\", KEYS[1])\n"
    "\treturn res\n"
)
# The pop check of a whole popped batch in one script run: upstream's
# PTTL + DEL for each key (all keys of one list share its hash slot).
POP_CHECK_MANY_SCRIPT = Script(
    "local res = {}\n"
    "for i, k in ipairs(KEYS) do\n"
    "\tres[i] = redis.call(\"PTTL\", k)\n"
    "end\n"
    "redis.call(\"DEL\", unpack(KEYS))\n"
    "return res\n"
)
# Upstream's push (SET PX + LPUSH + capacity check) for several items of one
# list in one script run: KEYS = list, ttl keys; ARGV = cap, then ms and
# payload per item. Per item: the list length, or 0 when the list was full
# (that item is trimmed away again, as upstream does).
PUSH_MANY_SCRIPT = Script(
    "local limit = tonumber(ARGV[1])\n"
    "local res = {}\n"
    "for i = 2, #KEYS do\n"
    "\tlocal ms = ARGV[2 * i - 2]\n"
    "\tredis.call(\"SET\", KEYS[i], ms, \"PX\", tonumber(ms))\n"
    "\tlocal n = redis.call(\"LPUSH\", KEYS[1], ARGV[2 * i - 1])\n"
    "\tif n > limit and limit > 0 then\n"
    "\t\tredis.call(\"LTRIM\", KEYS[1], 1, limit)\n"
    "\t\tres[i - 1] = 0\n"
    "\telse\n"
    "\t\tres[i - 1] = n\n"
    "\tend\n"
    "end\n"
    "return res\n"
)
# Puts calls a stopping callee had popped but not started back at the head of
# their list, with their TTL keys restored to the time they have left.
REQUEUE_SCRIPT = Script(
    "redis.call(\"SET\", KEYS[1], ARGV[1], \"PX\", tonumber(ARGV[1]))\n"
    "return redis.call(\"RPUSH\", KEYS[2], ARGV[2])\n"
)

CAPACITY_MESSAGE = "list capacity exceeded"


def call_key(uri: str) -> str:
    return "juggler:calls:{" + uri + "}"


def call_ttl_key(uri: str, msg_uuid: str) -> str:
    return "juggler:calls:timeout:{" + uri + "}:" + msg_uuid


def result_key(conn_uuid: str) -> str:
    return "juggler:results:{" + conn_uuid + "}"


def result_ttl_key(conn_uuid: str, msg_uuid: str) -> str:
    return "juggler:results:timeout:{" + conn_uuid + "}:" + msg_uuid


def group_by_slot(uris: Iterable[str]) -> dict[int, list[str]]:
    """URIs grouped by the slot of their call list: one blocking pop per group
    in a cluster (all keys of one BRPOP/BLMPOP must share a slot)."""
    groups: dict[int, list[str]] = {}
    for uri in uris:
        groups.setdefault(key_slot(call_key(uri)), []).append(uri)
    return groups
