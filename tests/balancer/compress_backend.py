"""A backend for the compression tests (run as a subprocess): it answers
with the status, type, length framing and headers the query asks for.

    python compress_backend.py PORT       prints "ready" once listening

GET /text?n=N&type=T&status=S&chunked=1&h=Name:Value...   N bytes of text
GET /big?mb=M                     M MiB of text, chunked, 64 KiB at a time
GET /events                       text/event-stream: one event, then another
                                  once GET /release has arrived, then the end
GET /release                      lets /events send its second event
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import parse_qs, urlsplit

LINE = b"the quick brown fox jumps over the lazy dog, again and again\n"


def text(n: int) -> bytes:
    """The first n bytes of the repeated line (tests rebuild it)."""
    return (LINE * (n // len(LINE) + 1))[:n]


class Backend:
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode("latin-1").split()
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                url = urlsplit(target)
                await self.respond(method, url.path, parse_qs(url.query), writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def respond(self, method: str, path: str, q: dict[str, list[str]], w: asyncio.StreamWriter) -> None:
        if path == "/text":
            status = q.get("status", ["200"])[0]
            body = b"" if status in ("204", "304") else text(int(q.get("n", ["4000"])[0]))
            head = [f"HTTP/1.1 {status} X", f"Content-Type: {q.get('type', ['text/plain; charset=utf-8'])[0]}"]
            head += q.get("h", [])
            chunked = q.get("chunked") == ["1"]
            if status not in ("204", "304"):
                head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
            w.write(("\r\n".join(head) + "\r\n\r\n").encode())
            if method != "HEAD" and body:
                w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunked else body)
            await w.drain()
        elif path == "/big":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = text(64 * 1024)
            for _ in range(int(q["mb"][0]) * 16):
                w.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()
        elif path == "/events":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in (b"data: one\n\n", b"data: two\n\n"):
                w.write(b"%x\r\n%s\r\n" % (len(event), event))
                await w.drain()
                await self.release.wait()
            w.write(b"0\r\n\r\n")
            await w.drain()
        elif path == "/release":
            self.release.set()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
        else:
            w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await w.drain()


async def main(port: int) -> None:
    backend = Backend()
    server = await asyncio.start_server(backend.handle, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
