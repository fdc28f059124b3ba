"""``juggler up``: the main job on embedded defaults.

One process: the juggler server on 127.0.0.1:9000 (path /ws, the demo page
and browser client at http://127.0.0.1:9000/), the in-memory broker, and the test callees (test.echo, test.reverse, test.delay), ready for
``juggler client`` in another terminal. ``--redis URL`` uses Redis instead.
"""

from __future__ import annotations

import argparse
from typing import Any

EXAMPLES = """examples:
  juggler up                                  # then, in another terminal: juggler client
                                              # or in a browser: http://127.0.0.1:9000/ (demo page)
  juggler up --listen 0.0.0.0:9000
  juggler up --redis redis://127.0.0.1:6379/0 # same, through Redis (Go peers can join)
  juggler up --api 127.0.0.1:9001 --api-key "$KEY"   # and the server HTTP API for backends
"""

BANNER = """juggler is up: server {url} with the test callees (test.echo, test.reverse, test.delay).
Demo page (browser client): {page}
Connect from another terminal:
  juggler client{client_options}
  then:  connect {url}
         call 1 test.echo 5s "hello"
Ctrl-C stops it."""


def register(subparsers: Any) -> None:
    from cli.server import add_common

    p = subparsers.add_parser(
        "up",
        help="server + in-memory broker + test callees on 127.0.0.1:9000 (ready for `juggler client`)",
        description="Run everything in one process on embedded defaults: the juggler.0 server on "
        "127.0.0.1:9000/ws, the in-memory broker and the test callees.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.add_argument("--workers", type=int, default=200, metavar="N", help="test callee workers [%(default)s]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from cli.server import run as run_server

    if args.workers < 1:
        print("juggler up: --workers must be >= 1", file=sys.stderr)
        return 2
    return run_server(args, test_callees=True, banner=BANNER, demo=True)
