"""A real HTTP/1.1 backend for the balancer's tests (run as a subprocess).

    python backend.py [HOST:]PORT NAME [CERT KEY]   prints "ready" once listening on HOST
                                                    (default 127.0.0.1; TLS with CERT KEY)

GET  /size/N[?chunked=1|close=1]  N bytes of a fixed pattern (Content-Length,
                                   chunked, or HTTP/1.0-style close-delimited)
POST /echo                         the request body back (chunked in → chunked out)
GET  /headers                      JSON: request line and headers as received
GET  /whoami                       this backend's NAME
GET  /r/...                        JSON: NAME, path, target (with its query) and headers, with X-Backend: NAME
                                   and X-Internal headers
GET  /slow?ms=N                    NAME after N ms
GET  /slow-begun                   how many /slow requests have arrived (as text)
GET  /health                       200 (503 after POST /sick)
GET  /ws (Upgrade)                 101, then echoes raw bytes
POST /fail                         every later request but /fail, /recover and /health: 500 (NAME as body)
POST /recover                      back to normal after /fail
"""

from __future__ import annotations

import asyncio
import json
import sys
from urllib.parse import parse_qs, urlsplit

PATTERN = bytes(range(251)) * 4096  # ~1 MiB


def pattern(n: int) -> bytes:
    """The first n bytes of the repeating 0..250 pattern (tests rebuild it)."""
    reps, rest = divmod(n, len(PATTERN))
    return PATTERN * reps + PATTERN[:rest]


class Backend:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sick = False
        self.failing = False
        self.slow_begun = 0

    async def read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b""):
                        pass
                    return bytes(out)
                out += await reader.readexactly(size)
                await reader.readexactly(2)
        n = int(headers.get("content-length", "0"))
        return await reader.readexactly(n) if n else b""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, version = line.decode("latin-1").split()
                headers: dict[str, str] = {}
                raw: list[list[str]] = []
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                    raw.append([k.strip(), v.strip()])
                body = await self.read_body(reader, headers)
                url = urlsplit(target)
                q = parse_qs(url.query)
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                if not await self.respond(method, url.path, q, version, headers, raw, body, writer, reader, target):
                    return
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()

    def head(self, status: str, extra: list[tuple[str, str]], version: str = "HTTP/1.1") -> bytes:
        lines = [f"{version} {status}", f"X-Backend: {self.name}", *(f"{k}: {v}" for k, v in extra)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def respond(self, method, path, q, version, headers, raw, body, writer, reader, target="") -> bool:
        def simple(data: bytes, status: str = "200 OK", ctype: str = "text/plain") -> None:
            writer.write(self.head(status, [("Content-Type", ctype), ("Content-Length", str(len(data)))]) + data)

        if self.failing and path not in ("/fail", "/recover", "/health"):
            simple(self.name.encode(), "500 Internal Server Error")
        elif path in ("/fail", "/recover"):
            self.failing = path == "/fail"
            simple(b"ok")
        elif path.startswith("/size/"):
            n = int(path[6:])
            data = pattern(n) if method != "HEAD" else b""
            if "chunked" in q:
                writer.write(self.head("200 OK", [("Transfer-Encoding", "chunked")]))
                for i in range(0, n, 65536):
                    part = data[i : i + 65536]
                    writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            elif "close" in q:
                writer.write(self.head("200 OK", [("Connection", "close")], "HTTP/1.0"))
                for i in range(0, n, 65536):
                    writer.write(data[i : i + 65536])
                    await writer.drain()
                await writer.drain()
                return False
            elif n <= 65536:
                # One write: a backend killed mid-test never leaves a head without its body.
                writer.write(self.head("200 OK", [("Content-Length", str(n))]) + data)
            else:
                writer.write(self.head("200 OK", [("Content-Length", str(n))]))
                for i in range(0, len(data), 1 << 20):
                    writer.write(data[i : i + (1 << 20)])
                    await writer.drain()
        elif path == "/echo":
            if headers.get("transfer-encoding", "").lower() == "chunked":
                writer.write(self.head("200 OK", [("Transfer-Encoding", "chunked"), ("X-Received-Length", str(len(body)))]))
                for i in range(0, len(body), 65536):
                    part = body[i : i + 65536]
                    writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(self.head("200 OK", [("Content-Length", str(len(body))), ("X-Received-Length", str(len(body)))]) + body)
        elif path == "/headers":
            simple(json.dumps({"method": method, "version": version, "headers": raw}).encode(), ctype="application/json")
        elif path == "/whoami":
            simple(self.name.encode())
        elif path.startswith("/r/"):
            data = json.dumps({"name": self.name, "path": path, "target": target, "headers": raw}).encode()
            writer.write(self.head("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                                              ("X-Backend", self.name), ("X-Internal", "secret")]) + data)
        elif path == "/slow-begun":
            simple(str(self.slow_begun).encode())
        elif path == "/slow":
            self.slow_begun += 1
            await asyncio.sleep(int(q.get("ms", ["100"])[0]) / 1000)
            simple(self.name.encode())
        elif path == "/health":
            simple(b"sick" if self.sick else b"ok", "503 Service Unavailable" if self.sick else "200 OK")
        elif path == "/sick":
            self.sick = True
            simple(b"ok")
        elif path == "/ws" and headers.get("upgrade"):
            writer.write(self.head("101 Switching Protocols", [("Connection", "Upgrade"), ("Upgrade", headers["upgrade"])]))
            await writer.drain()
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            return False
        else:
            simple(b"not found", "404 Not Found")
        await writer.drain()
        return True


async def main(where: str, name: str, cert: str | None = None, key: str | None = None) -> None:
    backend = Backend(name)
    if where.startswith("unix:"):  # a backend on a Unix socket
        server = await asyncio.start_unix_server(backend.handle, where[5:], limit=1 << 20)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()
        return
    host, _, port = where.rpartition(":")
    ctx = None
    if cert is not None and key is not None:  # a backend over TLS
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
    server = await asyncio.start_server(backend.handle, host or "127.0.0.1", int(port), limit=1 << 20, ssl=ctx)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], *sys.argv[3:5]))
