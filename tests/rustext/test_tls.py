"""rustext.tls: ssl contexts from PEM files, reload in place, the
development CA; real handshakes on loopback."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
from pathlib import Path

import pytest

from rustext.tls import ClientTls, ServerTls, TlsConfigError, describe_ssl_error, write_dev_cert
from tests.tlsutil import TestPKI


async def serve(ctx: ssl.SSLContext) -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


async def roundtrip(port: int, ctx: ssl.SSLContext, host: str = "localhost") -> bytes:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=host), 5
    )
    try:
        writer.write(b"ping\n")
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


def peer_cert(writer: asyncio.StreamWriter) -> bytes:
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    assert der is not None
    return der


@pytest.mark.parametrize("rsa", [False, True], ids=["ecdsa", "rsa"])
async def test_a_chain_verified_against_the_root(tmp_path: Path, rsa: bool) -> None:
    pki = TestPKI(tmp_path, rsa=rsa)
    leaf = pki.leaf()
    server, port = await serve(ServerTls(cert=str(leaf.cert), key=str(leaf.key)).context())
    async with server:
        assert await roundtrip(port, ClientTls(ca=str(pki.ca)).context()) == b"ping\n"


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("wrong CA", "--tls-ca"),
        ("expired", "expired"),
        ("wrong host", "Hostname mismatch"),
        ("system store", "--tls-ca"),
    ],
)
async def test_bad_certificates_are_refused_with_a_clear_reason(pki: TestPKI, tmp_path: Path, case: str, expect: str) -> None:
    leaf = pki.leaf(expired=case == "expired")
    server, port = await serve(ServerTls(cert=str(leaf.cert), key=str(leaf.key)).context())
    client = ClientTls(ca=str(pki.ca))
    host = "localhost"
    if case == "wrong CA":
        client = ClientTls(ca=str(TestPKI(tmp_path / "other").ca))
    elif case == "wrong host":
        host = "example.org"
    elif case == "system store":
        client = ClientTls()
    async with server:
        with pytest.raises(ssl.SSLCertVerificationError) as info:
            await roundtrip(port, client.context(), host)
    assert expect in describe_ssl_error(info.value)


async def test_insecure_skips_verification_only_when_asked(pki: TestPKI) -> None:
    leaf = pki.leaf("elsewhere.test", expired=True)
    server, port = await serve(ServerTls(cert=str(leaf.cert), key=str(leaf.key)).context())
    async with server:
        assert await roundtrip(port, ClientTls(insecure=True).context(), "x") == b"ping\n"


async def test_client_certificates_when_the_server_requires_them(pki: TestPKI, tmp_path: Path) -> None:
    leaf = pki.leaf()
    client_leaf = pki.leaf("client.test")
    tls = ServerTls(cert=str(leaf.cert), key=str(leaf.key), client_ca=str(pki.ca))
    server, port = await serve(tls.context())
    async with server:
        ok = ClientTls(ca=str(pki.ca), cert=str(client_leaf.cert), key=str(client_leaf.key))
        assert await roundtrip(port, ok.context()) == b"ping\n"
        # without a certificate, or with one from another CA: refused (TLS 1.3
        # reports it after the client's side of the handshake, on the first read)
        stranger = TestPKI(tmp_path / "stranger").leaf("client.test")
        for refused in (
            ClientTls(ca=str(pki.ca)),
            ClientTls(ca=str(pki.ca), cert=str(stranger.cert), key=str(stranger.key)),
        ):
            assert await answer(port, refused.context()) is None


async def answer(port: int, ctx: ssl.SSLContext) -> bytes | None:
    """The echo, or None when the server refused the connection."""
    try:
        got = await roundtrip(port, ctx)
    except (ssl.SSLError, ConnectionError):
        return None
    return got or None


async def test_reload_serves_the_new_certificate_while_an_old_connection_goes_on(pki: TestPKI) -> None:
    first, second = pki.leaf(name="first"), pki.leaf(name="second")
    live = pki.dir / "live.pem", pki.dir / "live-key.pem"
    live[0].write_bytes(first.cert.read_bytes())
    live[1].write_bytes(first.key.read_bytes())
    tls = ServerTls(cert=str(live[0]), key=str(live[1]))
    ctx = tls.context()

    async def chat(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(chat, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    client = ClientTls(ca=str(pki.ca)).context()
    async with server:
        r1, w1 = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost")
        old = peer_cert(w1)
        # renewed in place, then reloaded (what SIGHUP does)
        live[0].write_bytes(second.cert.read_bytes())
        live[1].write_bytes(second.key.read_bytes())
        tls.reload(ctx)
        r2, w2 = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost")
        assert peer_cert(w2) != old
        w1.write(b"still here\n")
        assert await asyncio.wait_for(r1.readline(), 5) == b"still here\n"
        # a broken renewal is refused and the current certificate stays in service
        live[1].write_bytes(first.key.read_bytes())
        with pytest.raises(TlsConfigError, match="does not go with"):
            tls.reload(ctx)
        r3, w3 = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost")
        assert peer_cert(w3) == peer_cert(w2)
        for w in (w1, w2, w3):
            w.close()


def test_bad_files_are_named(pki: TestPKI, tmp_path: Path) -> None:
    a, b = pki.leaf(name="a"), pki.leaf(name="b")
    with pytest.raises(TlsConfigError, match="no such file"):
        ServerTls(cert=str(tmp_path / "nope.pem"), key=str(a.key)).context()
    with pytest.raises(TlsConfigError, match=r"b-key\.pem does not go with certificate .*a\.pem"):
        ServerTls(cert=str(a.cert), key=str(b.key)).context()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello\n")
    with pytest.raises(TlsConfigError, match="garbage.pem"):
        ServerTls(cert=str(garbage), key=str(a.key)).context()
    with pytest.raises(TlsConfigError, match="garbage.pem"):
        ClientTls(ca=str(garbage)).context()
    with pytest.raises(TlsConfigError, match="both"):
        ClientTls(cert=str(a.cert))


@pytest.mark.parametrize("key_type", ["ec", "rsa"])
async def test_dev_cert_is_trusted_through_its_ca_and_reuses_it(tmp_path: Path, key_type: str) -> None:
    made = write_dev_cert(tmp_path / "dev", key_type=key_type)
    assert not made.ca_reused
    assert stat.S_IMODE(os.stat(made.key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(made.ca_key).st_mode) == 0o600
    server, port = await serve(ServerTls(cert=str(made.cert), key=str(made.key)).context())
    async with server:
        for host in ("localhost", "127.0.0.1"):
            assert await roundtrip(port, ClientTls(ca=str(made.ca)).context(), host) == b"ping\n"
    again = write_dev_cert(tmp_path / "dev", names=["localhost", "app.test"], key_type=key_type)
    assert again.ca_reused and again.ca.read_bytes() == made.ca.read_bytes()
    server, port = await serve(ServerTls(cert=str(again.cert), key=str(again.key)).context())
    async with server:
        assert await roundtrip(port, ClientTls(ca=str(made.ca)).context(), "app.test") == b"ping\n"


def test_dev_cert_refuses_bad_options(tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="key type"):
        write_dev_cert(tmp_path, key_type="dsa")
    with pytest.raises(TlsConfigError, match="at least one"):
        write_dev_cert(tmp_path, names=[])
