"""Regenerate the committed protobuf and gRPC modules of the proxy service.

    python -m juggler.proxy.generate      (needs grpcio-tools, from the test extra)

Writes ``proxy_pb2.py``, ``proxy_pb2.pyi`` and ``proxy_pb2_grpc.py`` next
to ``proxy.proto``. The generated modules check the protobuf runtime at
import time; pyproject.toml's ``protobuf`` lower bound must be at least the
version printed in their header.
"""

from __future__ import annotations

import pathlib
import sys


def main() -> int:
    from grpc_tools import protoc  # only needed to regenerate

    root = pathlib.Path(__file__).resolve().parents[2]
    proto = "juggler/proxy/proxy.proto"
    args = ["protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}", f"--grpc_python_out={root}", proto]
    return protoc.main(args)


if __name__ == "__main__":
    sys.exit(main())
