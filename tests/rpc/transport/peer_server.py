"""A transport server in its own process, for crash and reconnect tests.

usage: peer_server.py ENDPOINT MODE   (MODE: echo | hang)
Prints "listening <endpoint>" once it accepts connections, and in hang mode
"request" for every request its handler got (so a test knows they arrived).
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

from rpc.transport import TransportServer


async def main(endpoint: str, mode: str) -> None:
    async def hang(conn, msg):  # type: ignore[no-untyped-def]
        print("request", flush=True)
        await asyncio.Event().wait()  # never answers

    handler = (lambda conn, msg: msg.payload) if mode == "echo" else hang
    server = TransportServer(endpoint, handler)
    ep = await server.start()
    print(f"listening {ep}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], sys.argv[2]))
