"""Built-in auth plugin: checks each request's ``__AUTH`` token.

A failed check answers "auth failed" and closes the connection (rpcx's
behaviour). Heartbeats are not checked.
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpc.service import Context

Checker = Callable[["Context", str], "bool | Awaitable[bool]"]


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
