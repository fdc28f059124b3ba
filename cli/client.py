"""``juggler client``: the interactive REPL (see juggler/repl.py)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from cli.tls import add_client_tls_arguments, client_tls

EXAMPLES = """examples:
  juggler client                          # then: connect, call 1 test.echo 5s "hello", help, exit
  juggler client --connect                # open connection 1 to the default URL at start
  printf 'connect\\ncall 1 test.echo 5s "hi"\\nexit\\n' | juggler client    # scripted (stdin is a pipe)
  juggler client --url wss://localhost:9000/ws --tls-ca certs/ca.pem --connect
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "client",
        help="the interactive juggler REPL (connect / call / sub / pub / help / exit)",
        description="Interactive juggler.0 client. Commands: help, exit, connect, disconnect, close, "
        "send, rand, call, pub, sub, psub, unsb, punsb, wait, sleep, list. Reads commands "
        "from stdin when it is not a terminal (each command then waits for its outcome; errors go to "
        "stderr and the exit status is 1 when a command failed: an error, a NACK, an expired call).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", default="ws://127.0.0.1:9000/ws", help="default URL of `connect` [%(default)s]")
    p.add_argument("--connect", action="store_true", help="open a connection to --url at start")
    p.add_argument("--history", default="~/.juggler_history", metavar="FILE",
                   help="history file of the interactive prompt [%(default)s]; '' for none")
    add_client_tls_arguments(p, "wss:// servers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from juggler.repl import Repl
    from rustext.tls import TlsConfigError

    try:
        tls = client_tls(args)
    except TlsConfigError as exc:
        print(f"juggler client: {exc}", file=sys.stderr)
        return 2
    interactive = sys.stdin.isatty() and sys.stdout.isatty()

    async def main() -> int:
        if interactive:
            return await _interactive(args, tls)
        repl = Repl(lambda line: print(line, flush=True), wait_outcomes=True, default_url=args.url,
                    err=lambda line: print(line, file=sys.stderr, flush=True), tls=tls)
        loop = asyncio.get_running_loop()

        async def next_line() -> str | None:
            return await loop.run_in_executor(None, sys.stdin.readline) or None

        return await _drive(repl, next_line, args.connect)

    try:
        import uvloop

        return uvloop.run(main())
    except KeyboardInterrupt:
        return 130


async def _interactive(args: argparse.Namespace, tls: Any) -> int:
    import os

    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.patch_stdout import patch_stdout

    from juggler.repl import COMMANDS, Repl

    history: Any = InMemoryHistory()
    if args.history:
        try:
            history = FileHistory(os.path.expanduser(args.history))
        except OSError:
            pass
    session: PromptSession[str] = PromptSession(
        history=history, completer=WordCompleter(list(COMMANDS), sentence=True)
    )
    repl = Repl(print, wait_outcomes=False, default_url=args.url, tls=tls)
    print("Welcome to the juggler client. Enter ? or help for the available\ncommands. Press ^D (ctrl-D) to exit.")

    async def next_line() -> str | None:
        while True:
            try:
                return await session.prompt_async("juggler> ")
            except KeyboardInterrupt:  # ^C drops the line, ^D ends
                continue
            except EOFError:
                return None

    with patch_stdout(raw=True):
        return await _drive(repl, next_line, args.connect)


async def _drive(repl: Any, next_line: Callable[[], Awaitable[str | None]], connect: bool) -> int:
    """Run ``repl`` on the lines ``next_line()`` gives (None: end of input)
    until one says stop (``exit``); the REPL is closed in any case. The exit
    status is 1 when a command failed."""
    try:
        if connect:
            await repl.execute("connect")
        while (line := await next_line()) is not None:
            if not await repl.execute(line):
                break
    finally:
        await repl.aclose()
    return 1 if repl.failures else 0
