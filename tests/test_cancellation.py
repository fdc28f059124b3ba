"""Cancellation on Python 3.11: ``asyncio.wait_for`` returns the result of an
inner wait that ends in the same loop turn as a cancel of its caller, and the
cancel is lost (fixed in 3.12, where it is built on ``asyncio.timeout``). A
loop task that loses its cancel never ends, and whoever awaits it (an
``aclose``) hangs. So juggler, rpc, seq, the balancer's control plane and the command
line use ``asyncio.timeout`` or ``asyncio.wait`` instead; this file holds them to it.
"""

from __future__ import annotations

import ast
import asyncio
import logging
from pathlib import Path

from rpc.discovery.base import heartbeat_loop

ROOT = Path(__file__).resolve().parents[1]
AUDITED = ("juggler", "rpc", "seq", "balancer", "cli")


def test_no_wait_for_where_a_lost_cancel_can_hang_a_close() -> None:
    found = []
    for package in AUDITED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "wait_for" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "asyncio"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"asyncio.wait_for can lose a cancel on Python 3.11; use asyncio.timeout: {found}"


async def test_a_heartbeat_cancelled_as_it_is_woken_ends_without_beating_again() -> None:
    beats = 0

    async def beat() -> None:
        nonlocal beats
        beats += 1

    wake = asyncio.Event()
    task = asyncio.create_task(heartbeat_loop(60, beat, "heartbeat", logging.getLogger("test"), wake=wake))
    await asyncio.sleep(0)  # the loop is waiting on its wake event
    wake.set()
    task.cancel()  # in the same loop turn as the wake-up
    try:
        async with asyncio.timeout(5):
            await asyncio.gather(task, return_exceptions=True)
    finally:
        task.cancel()
    assert task.cancelled()
    assert beats == 0, "the cancelled heartbeat beat once more"
