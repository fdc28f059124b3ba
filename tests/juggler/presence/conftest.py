"""Fixtures of the presence tests: a started broker of each kind (in memory,
the session's redis-server, the session's Redis Cluster)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from presence_helpers import BACKENDS, make_broker


@pytest.fixture(params=BACKENDS)
async def backend_broker(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A started broker of each kind (memory, redis, cluster)."""
    broker = await make_broker(request.param, request)
    yield broker
    await broker.aclose()
