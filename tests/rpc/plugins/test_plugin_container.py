"""PluginContainer: hook resolution, order, sync/async hooks, error policies."""

from __future__ import annotations

import logging

import pytest

from rpc.plugins import PluginContainer


class A:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def pre_call(self, ctx, args):
        self.log.append("A.pre_call")

    def on_conn_close(self, peer):
        raise RuntimeError("A failed")


class B:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def pre_call(self, ctx, args):
        self.log.append("B.pre_call")

    async def on_conn_close(self, peer):
        self.log.append("B.close")

    def on_conn_accept(self, peer):
        return False


async def test_order_sync_async_and_policies(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    a, b = A(log), B(log)
    pc = PluginContainer([a, b])
    assert pc.has("pre_call") and not pc.has("post_write")
    await pc.run("pre_call", None, None)
    assert log == ["A.pre_call", "B.pre_call"]
    with caplog.at_level(logging.ERROR, logger="rpc.plugins"):
        await pc.run_logged("on_conn_close", None)  # A raises, B still runs
    assert log[-1] == "B.close" and "A failed" in caplog.text
    assert not await pc.all_true("on_conn_accept", None)
    pc.remove(b)
    assert await pc.all_true("on_conn_accept", None)
    assert pc.plugins == (a,)


def test_plugin_without_hook_is_refused() -> None:
    with pytest.raises(TypeError, match="implements no plugin hook"):
        PluginContainer([object()])
