"""Entry point of the ``juggler`` console script."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

# Subcommand modules, in the order `juggler --help` lists them.
SUBCOMMANDS = ("up", "server", "callee", "client", "load", "balancer", "rpc", "seq", "tls")

EPILOG = """examples:
  juggler up                         # server + in-memory broker + test callees on :9000
  juggler client                     # interactive REPL (connect / help / exit)
  juggler server --redis redis://127.0.0.1:6379
  juggler callee --redis redis://127.0.0.1:6379 --workers 50
"""


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose subcommands report a typo themselves.

    Plain argparse lets a subcommand's parser hand unknown options back to
    the top-level parser, which then prints *its* usage (``juggler [-h]
    [--version] COMMAND ...``) for ``juggler up --listn X``; here the
    subcommand the option was given to prints its own usage and exits 2.
    Subparsers made by ``add_subparsers`` are of the parent's class, so every
    level behaves alike. Abbreviated options (``--dat`` for ``--data``) are
    not taken: a prefix that works today would change meaning the day an
    option starting the same way is added.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != _TOP_PROG:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggestion(extras)}")
        return parsed, extras

    def _suggestion(self, extras: list[str]) -> str:
        """`` (did you mean --listen?)`` for the first unknown option close to a known one."""
        import difflib

        known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        for word in extras:
            if word.startswith("--"):
                close = difflib.get_close_matches(word.partition("=")[0], known, n=1)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


_TOP_PROG = "juggler"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=_TOP_PROG,
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
