"""Fixed ids, upstream's script hashes and helpers shared by the Redis broker tests."""

from __future__ import annotations

import redis.asyncio as aredis

from juggler.broker.redis import PUSH_SCRIPT

UPSTREAM_PUSH_SHA = "b0cdecc8e595fb86f90aa79d69ba149d92d94b0b"
UPSTREAM_POP_SHA = "f17b6ff7e39434a85d2df60188240da5d1e4d65b"
U1 = "d11bff91-58fb-4e20-87ca-8c221fccbb49"
U2 = "982ea198-679c-4ab2-a0a5-6f9626821755"
CONN = "46d0ff32-efe4-409c-a7eb-2e94fde9ae32"


async def upstream_push(r: aredis.Redis, ttl_key: str, list_key: str, ttl_ms: int, payload: str) -> None:
    """What the Go server/callee does (MONITOR capture): the push script via EVAL."""
    await r.eval(PUSH_SCRIPT.body.decode(), 2, ttl_key, list_key, ttl_ms, payload, 0)


async def numsub_is(r: aredis.Redis, ch: str, n: int) -> bool:
    """Redis has exactly `n` subscribers on channel `ch`."""
    return await r.pubsub_numsub(ch) == [(ch.encode(), n)]
