"""Access logging: one line per request on logger ``rpc.access``."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpc.service import Context


class AccessLogPlugin:
    """Logs ``peer service.method seq status duration_ms`` at INFO (errors too)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("rpc.access")

    def post_call(self, ctx: Context, args: Any, reply: Any, error: BaseException | None) -> None:
        if not self.log.isEnabledFor(logging.INFO):
            return
        ms = (time.perf_counter() - ctx.started) * 1000.0
        peer = ctx.peer.address if ctx.peer is not None else "-"
        if error is None:
            self.log.info("%s %s.%s seq=%d ok %.3fms", peer, ctx.service, ctx.method, ctx.seq, ms)
        else:
            self.log.info(
                "%s %s.%s seq=%d error=%r %.3fms", peer, ctx.service, ctx.method, ctx.seq, str(error), ms
            )
