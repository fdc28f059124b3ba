"""Entry point of the ``juggler`` console script."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Subcommand modules, in the order `juggler --help` lists them.
SUBCOMMANDS = ("up", "server", "callee", "client", "load", "balancer", "rpc", "seq", "tls")

EPILOG = """examples:
  juggler up                         # server + in-memory broker + test callees on :9000
  juggler client                     # interactive REPL (connect / help / exit)
  juggler server --redis redis://127.0.0.1:6379
  juggler callee --redis redis://127.0.0.1:6379 --workers 50
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="juggler",
        description="Distributed-systems building blocks: websocket RPC/pub-sub, rpcx RPC, load balancer, sequences.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        # a missing module is a broken install: fail loudly rather than drop a command from --help
        importlib.import_module(f"cli.{name}").register(subparsers)
    return parser


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("juggler-suite")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `juggler … | head`: the reader left; not an error to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
