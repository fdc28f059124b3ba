"""Plain HTTP on the websocket port: juggler/static_files.py and its hook in the server.

The site is tested sans-I/O (a Request in, a Response out), then through a
real server with raw sockets (HEAD, split requests, traversal attempts) next
to real websocket clients. The JavaScript client itself is tested by
``tests/js`` (node --test and headless Chromium).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request

from juggler.broker.memory import MemoryBroker
from juggler.callee import Callee, make_test_app
from juggler.config import ServerConfig
from juggler.server import Server
from juggler.static_files import STATIC_DIR, StaticSite, content_type, stats_snapshot

pytestmark = pytest.mark.timeout(60)


def req(path: str, **headers: str) -> Request:
    h = Headers()
    for k, v in headers.items():
        h[k.replace("_", "-")] = v
    return Request(path, h)


# --- the site, sans-I/O ---------------------------------------------------------


def test_content_types() -> None:
    assert content_type("juggler.js") == "text/javascript; charset=utf-8"
    assert content_type("juggler.d.ts") == "application/typescript; charset=utf-8"
    assert content_type("index.html") == "text/html; charset=utf-8"
    assert content_type("demo.css") == "text/css; charset=utf-8"
    assert content_type("favicon.svg") == "image/svg+xml"
    assert content_type("secret.py") is None
    assert content_type("x.ts") is None


def test_library_only_without_demo() -> None:
    site = StaticSite()
    # the client and the two modules it imports by relative URL
    assert set(site.files) == {"/juggler.js", "/protocol.js", "/fallback.js", "/juggler.d.ts"}
    assert site.respond(req("/")).status_code == 404
    assert site.respond(req("/stats.json")).status_code == 404
    r = site.respond(req("/juggler.js"))
    assert r.status_code == 200
    assert r.body == (STATIC_DIR / "juggler.js").read_bytes()
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert r.headers["Content-Length"] == str(len(r.body))
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Cache-Control"] == "no-cache"
    assert r.headers["Connection"] == "close"


def test_demo_page_and_its_assets() -> None:
    site = StaticSite(demo=True, stats=lambda: {"calls": 3})
    index = site.respond(req("/"))
    assert index.status_code == 200
    assert index.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in index.headers["Content-Security-Policy"]
    # every local asset the page references is served
    refs = re.findall(rb'(?:src|href)="(/[^"]*)"', index.body)
    assert b"/demo.js" in refs and b"/juggler.js" in refs
    for ref in refs:
        assert site.respond(req(ref.decode())).status_code == 200, ref
    assert b'from "/juggler.js"' in site.respond(req("/demo.js")).body
    stats = site.respond(req("/stats.json"))
    assert stats.status_code == 200
    assert stats.headers["Content-Type"] == "application/json"
    assert stats.headers["Cache-Control"] == "no-store"
    assert json.loads(stats.body) == {"calls": 3}


@pytest.mark.parametrize("path", [
    "/../pyproject.toml", "/..%2fpyproject.toml", "/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd",
    "/static/juggler.js", "/juggler.js/", "/JUGGLER.JS", "/test", "/test/client.test.mjs", "/.", "",
])
def test_nothing_outside_the_file_table(path: str) -> None:
    r = StaticSite(demo=True).respond(req(path))
    assert r.status_code == 404
    assert r.body == b"Not Found\n"


def test_only_plain_top_level_files_of_known_types(tmp_path: Path) -> None:
    (tmp_path / "ok.js").write_text("1")
    (tmp_path / ".hidden.js").write_text("2")
    (tmp_path / "notes.py").write_text("3")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.js").write_text("4")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.js"
    outside.write_text("secret")
    os.symlink(outside, tmp_path / "link.js")
    site = StaticSite(demo=True, directory=tmp_path)
    assert set(site.files) == {"/ok.js"}
    assert StaticSite(demo=True, directory=tmp_path / "missing").files == {}


def test_etag_revalidation_and_head() -> None:
    site = StaticSite()
    full = site.respond(req("/juggler.js"))
    etag = full.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
    for inm in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        r = site.respond(req("/juggler.js", If_None_Match=inm))
        assert r.status_code == 304, inm
        assert r.body == b""
        assert r.headers["ETag"] == etag
    assert site.respond(req("/juggler.js", If_None_Match='"other"')).status_code == 200
    head = site.respond(req("/juggler.js"), head=True)
    assert head.status_code == 200
    assert head.body == b""
    assert head.headers["Content-Length"] == str(len(full.body))
    assert site.respond(req("/juggler.js?v=2")).body == full.body
    post = Request("/juggler.js", Headers(), "POST") if "method" in Request.__dataclass_fields__ else None
    if post is not None:
        r = site.respond(post)
        assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"


# --- through a real server -----------------------------------------------------------


@asynccontextmanager
async def running(site: bool = True, demo: bool = True) -> AsyncIterator[Server]:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, close_timeout=1))
    if site:
        server.http = StaticSite(demo=demo, stats=lambda: stats_snapshot(server))
    callee = Callee(broker, make_test_app(), workers=4)
    try:
        await server.start()
        await callee.start()
        yield server
    finally:
        await server.aclose()
        await callee.aclose()
        await broker.aclose()


async def http(server: Server, *chunks: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send the raw request `chunks` (one write each), read the whole response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0)  # pacing, so chunks tend to arrive apart (the server must cope either way)
        raw = await asyncio.wait_for(reader.read(), 10)  # the server closes after one response
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def get(path: str, method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


async def test_server_serves_the_site_next_to_websockets() -> None:
    async with running() as server:
        async with connect(server.url, subprotocols=["juggler.0"], open_timeout=10) as ws:
            status, headers, body = await http(server, get("/"))
            assert status == 200
            assert headers["content-type"] == "text/html; charset=utf-8"
            assert b"juggler" in body and len(body) == int(headers["content-length"])
            status, headers, body = await http(server, get("/stats.json"))
            stats = json.loads(body)
            assert stats["connections_active"] == 1
            assert stats["ws_path"] == "/ws"
            await ws.send(json.dumps({"meta": {"type": 1, "uuid": "6d9a4b52-1c8e-4d3b-9b2e-0c4a2f6b8e11"},
                                      "payload": {"uri": "test.echo", "timeout": 5_000_000_000, "args": "x"}}))
            assert json.loads(await ws.recv())["meta"]["type"] == 8
            assert json.loads(await ws.recv())["payload"]["args"] == "x"
        status, _, body = await http(server, get("/stats.json"))
        assert json.loads(body)["calls"] == 1


async def test_head_split_requests_and_refusals() -> None:
    async with running() as server:
        status, headers, body = await http(server, get("/juggler.js", "HEAD"))
        assert status == 200 and body == b""
        assert int(headers["content-length"]) == (STATIC_DIR / "juggler.js").stat().st_size
        # the method arrives in pieces
        raw = get("/juggler.d.ts", "HEAD")
        status, headers, body = await http(server, raw[:1], raw[1:3], raw[3:7], raw[7:])
        assert status == 200 and body == b""
        assert headers["content-type"] == "application/typescript; charset=utf-8"
        raw = get("/juggler.js")
        status, _, body = await http(server, raw[:2], raw[2:])
        assert status == 200 and body == (STATIC_DIR / "juggler.js").read_bytes()
        status, _, _ = await http(server, get("/../../pyproject.toml"))
        assert status == 404
        status, _, _ = await http(server, get("/juggler.js", "POST"))
        assert status in (400, 405)  # refused by websockets (before 15), or by the site
        etag = (await http(server, get("/juggler.js")))[1]["etag"]
        status, _, body = await http(server, get("/juggler.js", extra=f"If-None-Match: {etag}\r\n"))
        assert status == 304 and body == b""
        assert server.stats.connections_total == 0  # plain HTTP never counts as a websocket connection


async def test_without_a_site_other_paths_are_404() -> None:
    async with running(site=False) as server:
        status, _, _ = await http(server, get("/juggler.js"))
        assert status == 404
        status, _, _ = await http(server, get("/juggler.js", "HEAD"))
        assert status == 404


async def test_allowed_messages_as_a_query_parameter() -> None:
    async with running() as server:
        url = server.url + "?juggler-allowed-messages=pub"
        async with connect(url, subprotocols=["juggler.0"], open_timeout=10) as ws:
            await ws.send(json.dumps({"meta": {"type": 2, "uuid": "6d9a4b52-1c8e-4d3b-9b2e-0c4a2f6b8e12"},
                                      "payload": {"channel": "c", "args": 1}}))
            assert json.loads(await ws.recv())["meta"]["type"] == 8
            await ws.send(json.dumps({"meta": {"type": 3, "uuid": "6d9a4b52-1c8e-4d3b-9b2e-0c4a2f6b8e13"},
                                      "payload": {"channel": "c", "pattern": False}}))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
        # an explicit header wins over the query parameter
        async with connect(url, subprotocols=["juggler.0"], open_timeout=10,
                           additional_headers={"Juggler-Allowed-Messages": "sub"}) as ws:
            await ws.send(json.dumps({"meta": {"type": 3, "uuid": "6d9a4b52-1c8e-4d3b-9b2e-0c4a2f6b8e14"},
                                      "payload": {"channel": "c", "pattern": False}}))
            assert json.loads(await ws.recv())["meta"]["type"] == 8


def test_the_wheel_ships_the_static_files() -> None:
    import tomllib

    pyproject = tomllib.loads((STATIC_DIR.parents[1] / "pyproject.toml").read_text())
    includes = [i["path"] for i in pyproject["tool"]["maturin"]["include"]]
    assert "juggler/static/*" in includes
    # and nothing the server needs lives below it (the include is not recursive)
    assert not [p for p in STATIC_DIR.iterdir() if p.is_dir()]
