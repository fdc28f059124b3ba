"""Built-in auth plugins: check each request's ``__AUTH`` token.

- :class:`AuthPlugin`: fixed tokens, or a check function of your own;
- :class:`JwtAuthPlugin`: JWTs (secrets, PEM keys, JWKS), through
  ``rustext.tokens`` as juggler's handshakes are.

A failed check answers "auth failed" and closes the connection (rpcx's
behaviour). Heartbeats are not checked.
"""

from __future__ import annotations

import hmac
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from rustext.tokens import TokenConfig, TokenError, TokenVerifier

if TYPE_CHECKING:
    from rpc.service import Context

Checker = Callable[["Context", str], "bool | Awaitable[bool]"]

log = logging.getLogger("rpc.plugins.auth")


class AuthPlugin:
    """Accept a request when its token is one of ``tokens`` (constant-time
    compare) or when ``check(ctx, token)`` returns true. Exactly one of the two."""

    def __init__(self, tokens: Iterable[str] | None = None, *, check: Checker | None = None) -> None:
        if (tokens is None) == (check is None):
            raise ValueError("give either tokens or check")
        self._tokens = [t.encode() for t in tokens] if tokens is not None else None
        self._check = check

    async def authenticate(self, ctx: Context, token: str | None) -> bool:
        if token is None:
            return False
        if self._tokens is not None:
            raw = token.encode()
            ok = False
            for t in self._tokens:  # no early exit: timing does not reveal which token matched
                ok |= hmac.compare_digest(raw, t)
            return ok
        assert self._check is not None
        result = self._check(ctx, token)
        if inspect.isawaitable(result):
            result = await result
        return bool(result)


class JwtAuthPlugin:
    """Accept a request whose ``__AUTH`` token is a JWT that
    ``rustext.tokens.TokenVerifier`` verifies (``Bearer`` prefix optional, as
    Go rpcx clients send whatever ``XClient.Auth`` was given). The claims are
    left in ``ctx.values["claims"]`` for handlers.

    Verified tokens are remembered (at most ``cache_size`` of them, each
    until its ``exp``, and at most ``cache_ttl`` seconds), since rpcx clients
    send the same token with every request and signature checks cost tens
    of microseconds. Lifecycle: ``await start()`` (JWKS fetch), ``await
    aclose()``; the plugin does not own a verifier it was given.
    """

    def __init__(self, verifier: TokenVerifier, *, cache_size: int = 1024, cache_ttl: float = 60.0) -> None:
        if cache_size < 0 or cache_ttl < 0:
            raise ValueError("cache_size and cache_ttl must be >= 0")
        self.verifier = verifier
        self.cache_size = cache_size
        self.cache_ttl = cache_ttl
        self._cache: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    @classmethod
    def from_config(cls, config: TokenConfig, **kw: Any) -> JwtAuthPlugin:
        plugin = cls(TokenVerifier(config), **kw)
        plugin._owned = True
        return plugin

    _owned = False

    async def start(self) -> None:
        await self.verifier.start()

    async def aclose(self) -> None:
        if self._owned:
            await self.verifier.aclose()

    async def authenticate(self, ctx: Context, token: str | None) -> bool:
        if not token:
            return False
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        now = time.time()
        hit = self._cache.get(token)
        if hit is not None and hit[0] > now:
            claims = hit[1]
        else:
            try:
                claims = await self.verifier.verify_fresh(token)
            except TokenError as exc:
                log.info("request %s.%s refused: %s", ctx.service, ctx.method, exc)
                return False
            self._remember(token, claims, now)
        if ctx.values is None:
            ctx.values = {}
        ctx.values["claims"] = claims
        return True

    def _remember(self, token: str, claims: dict[str, Any], now: float) -> None:
        if not self.cache_size or not self.cache_ttl:
            return
        until = now + self.cache_ttl
        exp = claims.get("exp")
        if isinstance(exp, int | float):
            until = min(until, float(exp) + self.verifier.config.leeway)
        cache = self._cache
        cache[token] = (until, claims)
        cache.move_to_end(token)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)
