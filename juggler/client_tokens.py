"""A client's side of token refresh: new tokens asked for when the server
says the current ones expire (:mod:`juggler.refresh` has the server's rules).

A client given ``get_token`` (``async () -> token``) asks at the handshake
for EXPIRING messages (``Juggler-Refresh: 1``). When one names no channel,
the connection's token expires in ``expires_in_ms``: a new one from
``get_token`` goes out as REFRESH ``{"token": …}``. When one names a
channel, that private subscription's token expires: a new one from
``get_subscription_token(channel)`` goes out as SUB_REFRESH ``{"channel",
"token"}``. EXPIRING ``{"channel": C, "unsubscribed": true}`` says the
server ended the subscription (its token was not renewed in time).

A renewal that fails (the callable raises, the server refuses) is logged
and counted in ``failures``; the server then ends the connection (or the
subscription) at the expiry, as for a client that never renews.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from juggler.extensions import REFRESH, SUB_REFRESH
from juggler.refresh import HEADER as REFRESH_HEADER

__all__ = ["REFRESH_HEADER", "ClientTokens", "SubscriptionTokenSource", "TokenSource"]

log = logging.getLogger("juggler.client")

#: gives the connection's (new) token
TokenSource = Callable[[], Awaitable[str]]
#: gives the subscription token of a channel, or None when it needs none
SubscriptionTokenSource = Callable[[str], Awaitable[str | None]]


class ClientTokens:
    """One client's token renewals (see the module doc)."""

    __slots__ = ("_client", "_tasks", "ended", "failures", "get_subscription_token", "get_token", "renewals")

    def __init__(self, client: Any, get_token: TokenSource | None,
                 get_subscription_token: SubscriptionTokenSource | None) -> None:
        self._client = client
        self.get_token = get_token
        self.get_subscription_token = get_subscription_token
        #: REFRESH and SUB_REFRESH the server took
        self.renewals = 0
        #: renewals that failed
        self.failures = 0
        #: channels whose subscription the server ended (token not renewed in time), oldest first
        self.ended: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def for_subscription(self, channel: str) -> str | None:
        """The subscription token of a SUB to `channel` (None without ``get_subscription_token``)."""
        if self.get_subscription_token is None:
            return None
        return await self.get_subscription_token(channel)

    def expiring(self, payload: Any) -> None:
        """An EXPIRING message came with this (decoded) payload."""
        if not isinstance(payload, dict):
            return
        channel = payload.get("channel")
        if channel is not None and not isinstance(channel, str):
            return
        if payload.get("unsubscribed") is True and channel is not None:
            log.info("the server ended the subscription to %s: its token expired", channel)
            self.ended.append(channel)
            if len(self.ended) > 1000:
                del self.ended[0]
            self._client.positions.pop(channel, None)
            return
        if channel is None:
            if self.get_token is not None:
                self._spawn(self._renew())
        elif self.get_subscription_token is not None:
            self._spawn(self._renew_subscription(channel, payload.get("pattern") is True))

    def stop(self) -> None:
        """The connection is closed: renewals under way are dropped."""
        for task in self._tasks:
            task.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self) -> None:
        assert self.get_token is not None
        try:
            token = await self.get_token()
            await self._client.request(REFRESH, {"token": token})
        except Exception as exc:  # noqa: BLE001 - the application's callable: any failure is a failed renewal
            self.failures += 1
            log.warning("renewing the connection's token failed: %s", exc)
            return
        self.renewals += 1

    async def _renew_subscription(self, channel: str, pattern: bool) -> None:
        assert self.get_subscription_token is not None
        try:
            token = await self.get_subscription_token(channel)
            if token is None:
                return
            payload: dict[str, Any] = {"channel": channel, "token": token}
            if pattern:
                payload["pattern"] = True
            await self._client.request(SUB_REFRESH, payload)
        except Exception as exc:  # noqa: BLE001 - the application's callable: any failure is a failed renewal
            self.failures += 1
            log.warning("renewing the subscription token of %s failed: %s", channel, exc)
            return
        self.renewals += 1
