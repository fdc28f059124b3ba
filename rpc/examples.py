"""Example services: rpcx's benchmark ``Hello.Say`` and a JSON ``Arith``.

``Hello.Say`` is exactly rpcx-benchmark's server: it takes a protobuf
``BenchmarkMessage`` (``rpc/proto/benchmark.proto``), sets ``field1 = "OK"``
and ``field2 = 100`` and returns it. ``Arith.Mul`` / ``Arith.Add`` take
``{"A": int, "B": int}`` and return ``{"C": int}`` (rpcx's example shape).
"""

from __future__ import annotations

from typing import Any

from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.service import Context, ServiceRegistry, fast

__all__ = ["Arith", "BenchmarkMessage", "Hello", "benchmark_request", "register_example"]


class Hello:
    @fast
    def Say(self, ctx: Context, args: BenchmarkMessage) -> BenchmarkMessage:
        args.field1 = "OK"
        args.field2 = 100
        return args


class Arith:
    # Plain ints take the short way (this is the benchmark's handler, and
    # Go's does no more); anything else is checked by _int.
    @fast
    def Mul(self, ctx: Context, args: dict[str, Any]) -> dict[str, int]:
        a, b = args.get("A", 0), args.get("B", 0)
        if type(a) is int and type(b) is int:
            return {"C": a * b}
        return {"C": _int(args, "A") * _int(args, "B")}

    @fast
    def Add(self, ctx: Context, args: dict[str, Any]) -> dict[str, int]:
        a, b = args.get("A", 0), args.get("B", 0)
        if type(a) is int and type(b) is int:
            return {"C": a + b}
        return {"C": _int(args, "A") + _int(args, "B")}


def _int(args: dict[str, Any], key: str) -> int:
    value = args.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer")
    return value


def benchmark_request() -> BenchmarkMessage:
    """The 581-byte message rpcx-benchmark's client sends (its ``prepareArgs``):
    every string field set to the same sentence, every integer to 100000,
    every bool to true (the repeated ``field5`` stays empty)."""
    from google.protobuf.descriptor import FieldDescriptor

    text = "许多往事在眼前一幕一幕，变的那麼模糊"
    msg = BenchmarkMessage()
    for fd in BenchmarkMessage.DESCRIPTOR.fields:
        if fd.is_repeated:
            continue
        if fd.type == FieldDescriptor.TYPE_STRING:
            setattr(msg, fd.name, text)
        elif fd.type == FieldDescriptor.TYPE_BOOL:
            setattr(msg, fd.name, True)
        else:
            setattr(msg, fd.name, 100000)
    return msg


EXAMPLES = {"bench": (Hello, "Hello"), "arith": (Arith, "Arith")}


def register_example(registry: ServiceRegistry, name: str) -> None:
    """Register example ``bench`` (Hello) or ``arith`` (Arith) on ``registry``."""
    try:
        cls, service = EXAMPLES[name]
    except KeyError:
        raise ValueError(f"unknown example {name!r} (bench, arith)") from None
    registry.register(cls(), service)
