"""The juggler server over TLS (wss://, and its HTTP pages over https) with
the Python client: real handshakes on loopback, certificates from the
test CA (tests/tlsutil.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from juggler.broker.memory import MemoryBroker
from juggler.callee import Callee, make_test_app
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.errors import ConnectionClosed
from juggler.server import Server
from juggler.static_files import StaticSite
from rustext.tls import ClientTls, TlsConfigError
from tests.tlsutil import Leaf, TestPKI

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def tls_stack(leaf: Leaf, **server_kw: object) -> AsyncIterator[Server]:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, tls_cert=str(leaf.cert), tls_key=str(leaf.key), **server_kw),
                    http=StaticSite(demo=True))
    callee = Callee(broker, make_test_app())
    await server.start()
    await callee.start()
    try:
        yield server
    finally:
        await server.aclose()
        await callee.aclose()
        await broker.aclose()


def local(url: str) -> str:
    return url.replace("127.0.0.1", "localhost")


async def test_wss_calls_and_https_pages(pki: TestPKI) -> None:
    async with tls_stack(pki.leaf()) as server:
        assert server.url.startswith("wss://")
        async with connect(local(server.url), tls=ClientTls(ca=str(pki.ca))) as c:
            assert await c.call("test.echo", "secure", timeout=5) == "secure"
        page = local(server.url).replace("wss://", "https://").removesuffix("/ws") + "/juggler.js"
        ctx = ClientTls(ca=str(pki.ca)).context()
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(page, context=ctx, timeout=5).read())
        assert b"juggler" in body


async def test_the_http_fallback_over_https(pki: TestPKI) -> None:
    """The fallback takes its connections over from the TLS transport as from a plain one."""
    import aiohttp

    async with tls_stack(pki.leaf()) as server:
        base = local(server.url).replace("wss://", "https://")
        ctx = ClientTls(ca=str(pki.ca)).context()
        async with aiohttp.ClientSession() as http, http.get(f"{base}/sse", ssl=ctx) as stream:
            assert stream.status == 200
            assert (await stream.content.readline()) == b"event: session\n"
            sid = (await stream.content.readline()).decode().split('"session":"')[1].split('"')[0]
            body = '{"meta":{"type":1,"uuid":"9a1c1e9e-8a52-4f0e-9d64-8a3d7e1b2c4f"},"payload":{"uri":"test.echo","args":"tls"}}'
            async with http.post(f"{base}/send?session={sid}", data=body, ssl=ctx) as r:
                assert r.status == 204
            seen = b""
            while b'"args":"tls"' not in seen:
                seen += await asyncio.wait_for(stream.content.readline(), 5)


@pytest.mark.parametrize("case", ["system store", "wrong host", "plain ws://"])
async def test_clients_that_cannot_verify_are_refused_clearly(pki: TestPKI, case: str) -> None:
    leaf = pki.leaf("other.test") if case == "wrong host" else pki.leaf()
    async with tls_stack(leaf) as server:
        url, tls, reason = local(server.url), None, "--tls-ca"
        if case == "wrong host":
            tls, reason = ClientTls(ca=str(pki.ca)), "Hostname mismatch"
        elif case == "plain ws://":
            url, reason = url.replace("wss://", "ws://"), "cannot connect"
        with pytest.raises(ConnectionClosed, match=reason):
            async with connect(url, tls=tls, open_timeout=3):
                pass


async def test_insecure_only_when_asked(pki: TestPKI) -> None:
    async with tls_stack(pki.leaf("elsewhere.test")) as server:
        async with connect(server.url, tls=ClientTls(insecure=True)) as c:
            assert await c.call("test.echo", "x", timeout=5) == "x"
    with pytest.raises(ValueError, match="wss://"):
        async with connect("ws://127.0.0.1:1/ws", tls=ClientTls(insecure=True)):
            pass


async def test_client_certificates(pki: TestPKI, tmp_path: Path) -> None:
    async with tls_stack(pki.leaf(), tls_client_ca=str(pki.ca)) as server:
        me = pki.leaf("client.test")
        async with connect(local(server.url), tls=ClientTls(ca=str(pki.ca), cert=str(me.cert), key=str(me.key))) as c:
            assert await c.call("test.echo", "mtls", timeout=5) == "mtls"
        with pytest.raises(ConnectionClosed):
            async with connect(local(server.url), tls=ClientTls(ca=str(pki.ca)), open_timeout=3) as c:
                await c.call("test.echo", "no cert", timeout=3)


async def test_reload_serves_the_new_certificate_and_keeps_open_connections(pki: TestPKI) -> None:
    first, second = pki.leaf(name="first"), pki.leaf(name="second")
    live = Leaf(cert=pki.dir / "live.pem", key=pki.dir / "live-key.pem")
    live.cert.write_bytes(first.cert.read_bytes())
    live.key.write_bytes(first.key.read_bytes())
    seen: list[bytes] = []

    def peer(c: object) -> bytes:
        ssl_object: ssl.SSLObject = c.ws.transport.get_extra_info("ssl_object")  # type: ignore[attr-defined]
        der = ssl_object.getpeercert(binary_form=True)
        assert der is not None
        return der

    async with tls_stack(live) as server:
        tls = ClientTls(ca=str(pki.ca))
        async with connect(local(server.url), tls=tls) as old:
            seen.append(peer(old))
            live.cert.write_bytes(second.cert.read_bytes())
            live.key.write_bytes(second.key.read_bytes())
            assert server.reload_tls()
            async with connect(local(server.url), tls=tls) as new:
                seen.append(peer(new))
                assert await new.call("test.echo", "new", timeout=5) == "new"
            assert await old.call("test.echo", "old", timeout=5) == "old"
            # a broken renewal leaves the current certificate in service
            live.key.write_bytes(first.key.read_bytes())
            with pytest.raises(TlsConfigError):
                server.reload_tls()
            async with connect(local(server.url), tls=tls) as third:
                seen.append(peer(third))
    assert seen[0] != seen[1] == seen[2]


def test_config_needs_both_files() -> None:
    with pytest.raises(ValueError, match="both"):
        ServerConfig(tls_cert="cert.pem")
    with pytest.raises(ValueError, match="tls_client_ca"):
        ServerConfig(tls_client_ca="ca.pem")
