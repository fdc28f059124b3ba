"""``juggler rpc …``: the RPC framework's commands.

Each sub-subcommand lives in its own module listed in ``SUBCOMMANDS`` (name →
module); a module defines ``register(subparsers)`` (adding its parser with
``set_defaults(func=run)``) and ``run(args) -> int``. To add one, add a line
here and a ``cli/rpc_<name>.py`` module (a missing one is an error, not a
command quietly gone from ``--help``).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

SUBCOMMANDS: dict[str, str] = {
    "serve": "cli.rpc_serve",
    "call": "cli.rpc_call",
    "bench": "cli.rpc_bench",
    "transport-bench": "cli.rpc_transport_bench",
}

EPILOG = """examples:
  juggler rpc transport-bench --payload 4096 --inflight 16 --duration 5
  juggler rpc transport-bench --payload 262144 --inflight 4 --channel unix --raw
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rpc",
        help="rpcx-compatible RPC: serve / call / bench, and the transport's benchmark",
        description="The RPC framework and its multiplexed transport.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="rpc_command", metavar="SUBCOMMAND")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).register(sub)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
