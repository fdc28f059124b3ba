"""Response compression through a real balancer, in front of a real
backend process (``compress_backend.py``): the coding chosen by
``Accept-Encoding``, every case never compressed, the header edits,
streaming (a 50 MiB body in bounded memory, server-sent events flowing),
HTTP/1.1, HTTP/2 and TLS, and hostile ``Accept-Encoding`` values."""

from __future__ import annotations

import gzip
import http.client
import re
import shutil
import socket
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli
import pytest
import zstandard
from balancer_helpers import dechunk, raw_exchange, split_response

from balancer.errors import BalancerConfigError
from balancer.metrics import exposition, registry_for
from tests.netutil import free_port

sys.path.insert(0, str(Path(__file__).parent))
from compress_backend import text

CURL = shutil.which("curl")


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "compress_backend.py"), str(port)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


@pytest.fixture
def lb(origin: str, proxy: Any) -> Any:
    return proxy([origin], workers=1, compress=True)


def decode(coding: str | None, body: bytes) -> bytes:
    if coding == "gzip":
        return gzip.decompress(body)
    if coding == "br":
        return brotli.decompress(body)
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    assert coding is None, coding
    return body


def get(lb: Any, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    c = http.client.HTTPConnection("127.0.0.1", lb.address[1], timeout=30)
    try:
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


@pytest.mark.parametrize(("accept", "coding"), [
    ("gzip", "gzip"), ("br", "br"), ("zstd", "zstd"), ("x-gzip", "gzip"),
    ("gzip, deflate, br, zstd", "zstd"),       # equal weights: the server's order
    ("gzip, deflate, br", "br"),
    ("gzip;q=1, br;q=0.5, zstd;q=0.1", "gzip"),  # the client's weights first
    ("br;q=0, *", "zstd"),
    ("*;q=0.1, gzip;q=0.2", "gzip"),
    ("zstd;q=0, br;q=0, *", "gzip"),
    ("identity", None), ("identity;q=0", None), ("*;q=0", None), ("", None), ("deflate", None),
])
def test_the_coding_follows_accept_encoding(lb: Any, accept: str, coding: str | None) -> None:
    for chunked in ("0", "1"):
        status, h, body = get(lb, f"/text?n=5000&chunked={chunked}", {"Accept-Encoding": accept})
        assert status == 200
        assert h.get("content-encoding") == coding
        assert decode(coding, body) == text(5000)
        assert "accept-encoding" in h["vary"].lower()
        if coding:
            assert "content-length" not in h and h["transfer-encoding"] == "chunked"


def test_without_accept_encoding_the_body_goes_as_it_is(lb: Any) -> None:
    status, h, body = get(lb, "/text?n=5000")
    assert (status, h.get("content-encoding"), body) == (200, None, text(5000))
    assert h["content-length"] == "5000" and h["vary"] == "Accept-Encoding"


@pytest.mark.parametrize(("path", "req"), [
    ("/text?n=5000", {"Range": "bytes=0-10"}),                       # a Range request
    ("/text?n=5000&status=206&h=Content-Range:bytes%200-4999/9999", {}),
    ("/text?status=204", {}),
    ("/text?status=304", {}),
    ("/text?n=5000&h=Cache-Control:public,%20no-transform", {}),
    ("/text?n=5000&h=Content-Encoding:gzip", {}),                     # coded already
    ("/text?n=5000&type=image/png", {}),                              # a type not listed
    ("/text?n=5000&type=text/event-stream", {}),                      # event streams: only when listed
    ("/text?n=100", {}),                                              # below min_length (256)
])
def test_never_compressed(lb: Any, path: str, req: dict[str, str]) -> None:
    status, h, body = get(lb, path, {"Accept-Encoding": "gzip, br, zstd", **req})
    assert h.get("content-encoding") in (None, "gzip")
    if "Content-Encoding:gzip" not in path:
        assert "content-encoding" not in h, (path, h)
    if status in (200, 206) and "Content-Encoding" not in path:
        assert body == text(len(body))


def test_head_is_not_compressed(lb: Any) -> None:
    status, h, body = get(lb, "/text?n=5000", {"Accept-Encoding": "gzip"}, method="HEAD")
    assert (status, body, h.get("content-encoding"), h["content-length"]) == (200, b"", None, "5000")


def test_header_edits(lb: Any) -> None:
    path = "/text?n=5000&h=ETag:%22v1%22&h=Accept-Ranges:bytes&h=Vary:Origin"
    _, h, body = get(lb, path, {"Accept-Encoding": "br"})
    assert h["content-encoding"] == "br" and decode("br", body) == text(5000)
    assert h["etag"] == 'W/"v1"'
    assert "accept-ranges" not in h
    assert h["vary"] == "Origin, Accept-Encoding"
    _, plain, _ = get(lb, path)
    assert plain["etag"] == '"v1"' and plain["accept-ranges"] == "bytes"
    _, weak, _ = get(lb, "/text?n=5000&h=ETag:W/%22v2%22&h=Vary:accept-encoding", {"Accept-Encoding": "gzip"})
    assert weak["etag"] == 'W/"v2"' and weak["vary"] == "accept-encoding"


def test_http10_client_gets_a_close_delimited_coded_body(lb: Any) -> None:
    raw = raw_exchange(lb.address[1], b"GET /text?n=9000 HTTP/1.0\r\nAccept-Encoding: gzip\r\n\r\n")
    status, h, body = split_response(raw)
    assert status.startswith("HTTP/1.0 200") and h["content-encoding"] == "gzip"
    assert "transfer-encoding" not in h and "content-length" not in h
    assert gzip.decompress(body) == text(9000)


async def test_aiohttp_client(lb: Any) -> None:
    aiohttp = pytest.importorskip("aiohttp")
    url = f"http://127.0.0.1:{lb.address[1]}/text?n=50000&chunked=1"
    async with aiohttp.ClientSession() as s:
        for accept in ("gzip", "br"):
            async with s.get(url, headers={"Accept-Encoding": accept}) as r:
                assert r.headers["Content-Encoding"] == accept
                assert await r.read() == text(50000)  # decoded by aiohttp
        async with s.get(url, headers={"Accept-Encoding": "zstd"}, auto_decompress=False) as r:
            assert r.headers["Content-Encoding"] == "zstd"
            assert decode("zstd", await r.read()) == text(50000)


def test_curl_decodes_every_coding(lb: Any) -> None:
    assert CURL is not None, "curl is not installed"
    url = f"http://127.0.0.1:{lb.address[1]}/text?n=20000&type=application/json"
    for coding in ("gzip", "br", "zstd"):
        out = subprocess.run([CURL, "-s", "--compressed", "-H", f"Accept-Encoding: {coding}", "-D", "-", url],
                             capture_output=True, timeout=30, check=False)
        head, _, body = out.stdout.partition(b"\r\n\r\n")
        assert f"content-encoding: {coding}".encode() in head.lower(), head
        assert body == text(20000)


def test_http2_cleartext_and_tls(origin: str, proxy: Any, pki: Any) -> None:
    assert CURL is not None, "curl is not installed"
    leaf = pki.leaf("localhost", "127.0.0.1")
    plain = proxy([origin], workers=1, compress={"algorithms": ["br", "gzip"]})
    tls = proxy([origin], workers=1, compress=True,
                tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]})
    runs = [
        (["--http2-prior-knowledge"], f"http://127.0.0.1:{plain.address[1]}", "br"),
        (["--http2", "--cacert", str(pki.ca)], f"https://localhost:{tls.address[1]}", "zstd"),
        (["--http1.1", "--cacert", str(pki.ca)], f"https://localhost:{tls.address[1]}", "zstd"),
    ]
    for flags, base, coding in runs:
        out = subprocess.run([CURL, "-s", *flags, "--compressed", "-D", "-", "-w", "%{http_version}",
                              f"{base}/text?n=30000&chunked=1"], capture_output=True, timeout=30, check=False)
        head, _, rest = out.stdout.partition(b"\r\n\r\n")
        assert f"content-encoding: {coding}".encode() in head.lower(), (flags, head)
        assert b"content-length" not in head.lower()
        version = b"2" if "--http1.1" not in flags else b"1.1"
        assert rest == text(30000) + version, (flags, rest[-20:])


def test_a_route_overrides_the_listener(origin: str, proxy: Any) -> None:
    lb = proxy([origin], workers=1, compress={"algorithms": ["gzip"], "min_length": 0},
               routes=[{"path_prefix": "/raw", "backend": "default", "compress": False},
                       {"path_prefix": "/text", "backend": "default"}])
    _, h, body = get(lb, "/text?n=10", {"Accept-Encoding": "br, gzip"})
    assert h["content-encoding"] == "gzip" and decode("gzip", body) == text(10)
    _, h, body = get(lb, "/raw?n=10", {"Accept-Encoding": "gzip"})
    assert "content-encoding" not in h


def test_counters(lb: Any) -> None:
    before = lb.stats()
    _, _, body = get(lb, "/text?n=100000", {"Accept-Encoding": "gzip"})
    after = lb.stats()
    assert after["compressed"] == before["compressed"] + 1
    assert after["compress_bytes_in"] - before["compress_bytes_in"] == 100000
    assert after["compress_bytes_out"] - before["compress_bytes_out"] == len(body) < 100000
    exported = exposition(registry_for(lb.stats)).decode()
    assert f"balancer_compressed_responses_total {float(after['compressed'])}" in exported
    assert "balancer_compress_out_bytes_total" in exported


def rss() -> int:
    """This process's resident memory (the balancer runs in it), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_large_body_streams_in_bounded_memory(lb: Any) -> None:
    mb = 50
    c = http.client.HTTPConnection("127.0.0.1", lb.address[1], timeout=60)
    c.request("GET", f"/big?mb={mb}", headers={"Accept-Encoding": "zstd"})
    r = c.getresponse()
    assert r.getheader("content-encoding") == "zstd"
    d = zstandard.ZstdDecompressor().decompressobj()
    base, peak, total, frames = rss(), 0, 0, 0
    while chunk := r.read1(256 * 1024):
        total += len(d.decompress(chunk))
        frames += 1
        if frames % 16 == 0:
            peak = max(peak, rss())
    c.close()
    assert total == mb * 1024 * 1024
    assert peak - base < 24 * 1024 * 1024, (base, peak)


def test_server_sent_events_flow(origin: str, proxy: Any) -> None:
    lb = proxy([origin], workers=1, compress={"types": ["text/event-stream"], "algorithms": ["gzip"]})
    port = lb.address[1]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
    buf = b""
    while True:
        got = s.recv(65536)
        assert got, "closed before the first event"
        buf += got
        head, sep, body = buf.partition(b"\r\n\r\n")
        if sep and b"data: one" in zlib.decompressobj(31).decompress(dechunk_prefix(body)):
            break
    assert b"content-encoding: gzip" in head.lower(), head
    # the first event arrived while the backend still holds the second back
    raw_exchange(port, b"GET /release HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    while not buf.endswith(b"0\r\n\r\n"):
        got = s.recv(65536)
        assert got
        buf += got
    s.close()
    assert gzip.decompress(dechunk(buf[buf.find(b"\r\n\r\n") + 4:])) == b"data: one\n\ndata: two\n\n"


def dechunk_prefix(body: bytes) -> bytes:
    """The data of the complete chunks at the start of ``body``."""
    out, i = b"", 0
    while (nl := body.find(b"\r\n", i)) >= 0:
        size = int(body[i:nl], 16)
        if size == 0 or len(body) < nl + 2 + size + 2:
            break
        out += body[nl + 2:nl + 2 + size]
        i = nl + 4 + size
    return out


HOSTILE = [
    "gzip;q=2", "gzip;q=-1", "gzip;q=0.5.5", "gzip;q=", ";;;;", ",,,,", "*;q=abc", "g\tzip",
    "gzip;" + "q=1;" * 500, "x," * 2000 + "gzip", "\x01gzip", "gzip, " * 1000, "br;q=1e3",
    "zstd;q=0.0001", "identity;q=0, *;q=0", "GZIP;Q=1.000", "😀",
]


@pytest.mark.parametrize("accept", HOSTILE)
def test_hostile_accept_encoding(lb: Any, accept: str) -> None:
    port = lb.address[1]
    req = b"GET /text?n=3000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept-Encoding: " + \
        accept.encode() + b"\r\n\r\n"
    status, h, body = split_response(raw_exchange(port, req))
    if status.split()[1] == "200":
        coding = h.get("content-encoding")
        assert coding in (None, "gzip", "br", "zstd")
        assert decode(coding, dechunk(body) if h.get("transfer-encoding") else body) == text(3000)
    else:
        assert status.split()[1] in ("400", "431"), status
    # and the balancer keeps serving
    assert get(lb, "/text?n=3000", {"Accept-Encoding": "gzip"})[1]["content-encoding"] == "gzip"


@pytest.mark.parametrize(("table", "message"), [
    ({"algorithms": ["deflate"]}, "compress.algorithms: unknown coding 'deflate'"),
    ({"algorithms": []}, "compress.algorithms: give at least one"),
    ({"gzip_level": 10}, "compress.gzip_level must be in 1..9"),
    ({"br_level": -1}, "compress.br_level must be in 0..11"),
    ({"types": ["json"]}, "compress.types: invalid media type 'json'"),
    ({"level": 3}, "unknown key(s) in compress: level"),
    ("yes", "compress must be true, false or a table"),
])
def test_configuration_errors(origin: str, table: Any, message: str) -> None:
    from balancer_helpers import lb_config

    with pytest.raises(BalancerConfigError, match=re.escape(message)):
        lb_config([origin], compress=table)
