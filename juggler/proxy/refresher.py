"""The refresh proxy as the server's refresher (:class:`juggler.refreshing.Refresher`).

When a connection's credentials near their expiry and a ``refresh`` proxy is
configured, the server asks the application's backend instead of warning the
client: a new ``expire_at`` keeps the connection, ``expired`` (or a refusal)
closes it as expired, and a backend that gives no usable answer makes the
server fall back to warning the client (who may then send a new token).
"""

from __future__ import annotations

from typing import Any

from juggler.proxy.registry import ProxySet
from juggler.refreshing import RefreshOutcome

__all__ = ["ProxyRefresher"]


class ProxyRefresher:
    """Asks `proxies`' refresh proxy to renew a connection's credentials."""

    def __init__(self, proxies: ProxySet) -> None:
        self.proxies = proxies

    async def refresh(self, conn: Any, identity: Any) -> RefreshOutcome:
        result = await self.proxies.refresh(identity, client=str(conn.id))
        if result.expired:
            return RefreshOutcome(refused=True)
        if identity is not None and result.data is not None:
            identity.data = result.data
        return RefreshOutcome(expire_at=result.expire_at, info=result.data)
