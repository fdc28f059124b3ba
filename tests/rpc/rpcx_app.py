"""Services served by `juggler rpc serve --app tests.rpc.rpcx_app:setup` in
the rpcx end-to-end tests (real server processes)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from rpc.examples import register_example
from rpc.service import Context, fast


class Probe:
    def __init__(self) -> None:
        self.notes: list[Any] = []
        self.active = 0
        self.cancelled = 0
        self.finished = 0

    @fast
    def Who(self, ctx: Context, args: Any) -> dict[str, Any]:
        return {"pid": os.getpid()}

    @fast
    def Note(self, ctx: Context, args: Any) -> None:
        self.notes.append(args)

    @fast
    def Notes(self, ctx: Context, args: Any) -> list[Any]:
        return self.notes

    @fast
    def Stats(self, ctx: Context, args: Any) -> dict[str, int]:
        return {"active": self.active, "cancelled": self.cancelled, "finished": self.finished}

    async def Remaining(self, ctx: Context, args: Any) -> dict[str, Any]:
        """The deadline the server derived from __ServerTimeout (seconds left)."""
        return {"remaining": ctx.remaining()}

    async def Sleep(self, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        self.active += 1
        try:
            await asyncio.sleep(args["ms"] / 1000)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        self.finished += 1
        return {"slept": args["ms"], "pid": os.getpid()}

    async def Push(self, ctx: Context, args: dict[str, Any]) -> dict[str, int]:
        """Server push: ``n`` oneway requests ``Client.Event`` to the caller."""
        for i in range(args["n"]):
            await ctx.push("Client", "Event", {"i": i})
        return {"pushed": args["n"]}

    async def Meta(self, ctx: Context, args: Any) -> dict[str, str]:
        ctx.reply_metadata["echo"] = ctx.metadata.get("k", "")
        return {"k": ctx.metadata.get("k", "")}


def setup(server: Any) -> None:
    register_example(server.registry, "arith")
    server.register(Probe(), "Probe")


def setup_add_only(server: Any) -> None:
    """Arith with ``Add`` only (a method allow-list): ``Mul`` is not exported."""
    from rpc.examples import Arith

    server.register(Arith(), "Arith", methods=["Add"])
