"""Regenerate the committed protobuf modules of seq.

    python -m seq._proto.generate      (needs grpcio-tools, from the test extra)

Only the message modules (``*_pb2.py`` and ``.pyi``) are generated: the
service glue is written by hand in :mod:`seq.wire`, so the generated code
imposes no grpcio version. The generated modules check the protobuf runtime
at import time (``ValidateProtobufRuntimeVersion``); pyproject.toml's
``protobuf`` lower bound must be at least the version printed in their
header, which ``tests/seq/test_wire.py`` checks.
"""

from __future__ import annotations

import pathlib
import sys


def main() -> int:
    from grpc_tools import protoc  # only needed to regenerate

    root = pathlib.Path(__file__).resolve().parents[2]
    protos = sorted(str(p.relative_to(root)) for p in (root / "seq" / "_proto").glob("*.proto"))
    args = ["protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}", *protos]
    return protoc.main(args)


if __name__ == "__main__":
    sys.exit(main())
