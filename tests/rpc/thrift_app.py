"""Arith.Mul on Thrift structs, served by `juggler rpc serve --app
tests.rpc.thrift_app:setup` in the Thrift interop tests (a Go rpcx client
calls it with serialize type 4)."""

from __future__ import annotations

from typing import Any

from rpc.service import Context
from tests.rpc.arith_thrift.ttypes import MulArgs, MulReply


class ThriftArith:
    async def Mul(self, ctx: Context, args: MulArgs) -> MulReply:
        return MulReply(c=args.a * args.b, note=f"py:{args.note}", tags=list(reversed(args.tags or [])))

    async def Echo(self, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        """Typed for JSON: a Thrift payload is refused with a clear error."""
        return args


def setup(server: Any) -> None:
    server.register(ThriftArith(), "Arith")
