"""The HTTP/JSON API of seq members (``--http``), on real 3-member clusters of
``juggler seq server`` processes, called as curl would: next with and
without a count, ranges disjoint and increasing across members and APIs,
current, forward-only set, the names listing, health and readiness (a member
catching up, a cluster without a majority), a battery of hostile requests
after which the members keep serving, the cap on per-name metric series, the
status page's escaping, and HTTPS with the members' certificates."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yarl

from seq._proto import rrseq_pb2 as pb
from seq.localcluster import LocalCluster
from seq.wire import ApiStub
from tests.netutil import wait_until

pytestmark = [pytest.mark.timeout(180)]

CAP = 5  # --metrics-max-names of the shared cluster
TIMEOUT = aiohttp.ClientTimeout(total=20)


@pytest.fixture(scope="module")
def hc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A healthy 3-member cluster with the HTTP API, shared by the module's tests (distinct names)."""
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seqhttp")), http=True)
    c.start_all("--bootstrap", "--metrics-max-names", str(CAP))
    try:
        asyncio.run(c.wait_ready(timeout=60))
    except BaseException:
        c.close()
        raise
    yield c
    c.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        yield s


async def call(s: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None,
               **kw: Any) -> tuple[int, Any, aiohttp.ClientResponse]:
    """(status, decoded JSON or text, response); the URL is sent exactly as written."""
    async with s.request(method, yarl.URL(url, encoded=True), data=body, **kw) as r:
        text = await r.text()
        doc = json.loads(text) if r.content_type == "application/json" and method != "HEAD" else text
        return r.status, doc, r


async def next_range(s: aiohttp.ClientSession, base: str, name: str, count: int | None = None) -> tuple[int, int]:
    q = "" if count is None else f"?count={count}"
    status, doc, _ = await call(s, "GET", f"{base}/v1/next/{name}{q}")
    assert status == 200, doc
    assert doc["name"] == name
    return doc["from"], doc["to"]


# -- the API ------------------------------------------------------------------------


async def test_next_with_and_without_count(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    a, b, c = hc.http_urls
    assert await next_range(http, a, "n1") == (1, 1)  # count defaults to 1, both ends included
    assert await next_range(http, a, "n1", 10) == (2, 11)
    assert await next_range(http, b, "n1", 5) == (12, 16)
    assert await next_range(http, c, "n1", 1) == (17, 17)


async def test_ranges_are_disjoint_and_increasing_across_members(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    counts = [1, 7, 100, 1, 3, 1000]

    async def client(base: str, k: int) -> list[tuple[int, int]]:
        got = []
        for i in range(30):
            got.append(await next_range(http, base, "shared", counts[(i + k) % len(counts)]))
        return got

    streams = await asyncio.gather(*(client(u, k) for k, u in enumerate(hc.http_urls * 3)))
    for st in streams:
        assert all(lo <= hi for lo, hi in st)
        assert all(p[1] < q[0] for p, q in zip(st, st[1:])), "a client's ranges must increase"
    every = sorted(r for st in streams for r in st)
    assert all(p[1] < q[0] for p, q in zip(every, every[1:])), "two ranges overlap"
    assert sum(hi - lo + 1 for lo, hi in every) == sum(counts[(i + k) % 6] for k in range(9) for i in range(30))


async def test_grpc_and_http_draw_from_one_sequence(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    first = await next_range(http, hc.http_urls[0], "both", 10)
    async with grpc.aio.insecure_channel(hc.addrs[1]) as ch:
        r = await ApiStub(ch).NextID(pb.NextIDRequest(name="both", range_size=10), timeout=10)
    third = await next_range(http, hc.http_urls[2], "both", 10)
    assert first == (1, 10) and (r.from_id, r.to_id) == (11, 21) and third == (21, 30)


async def test_current_and_forward_only_set(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    a = hc.http_urls[0]
    status, doc, _ = await call(http, "GET", f"{a}/v1/current/cur")
    assert (status, doc) == (200, {"name": "cur", "value": 1})  # the next ID a new name would hand out
    status, doc, _ = await call(http, "POST", f"{a}/v1/set/cur", b'{"value": 100}',
                                headers={"Content-Type": "application/json"})
    assert (status, doc) == (200, {"name": "cur", "value": 100})
    assert (await call(http, "GET", f"{a}/v1/current/cur"))[1]["value"] == 100
    for lower in (50, 100):  # backwards, and not forward either
        status, doc, _ = await call(http, "POST", f"{a}/v1/set/cur", json.dumps({"value": lower}).encode())
        assert status == 409
        assert doc["error"]["code"] == "not_forward" and "forward" in doc["error"]["message"]
        assert doc["value"] == 100
    assert (await call(http, "GET", f"{a}/v1/current/cur"))[1]["value"] == 100
    # set on a majority: every later range starts at or above it
    assert (await call(http, "POST", f"{hc.http_urls[1]}/v1/set/cur", b'{"value": 100}'))[0] == 200
    lo, _ = await next_range(http, hc.http_urls[2], "cur")
    assert lo >= 100


async def test_names_listing(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    a = hc.http_urls[0]
    before = time.time()
    await next_range(http, a, "list-a", 3)
    await next_range(http, a, "list-a", 4)
    await next_range(http, a, "list-b")
    status, doc, _ = await call(http, "GET", f"{a}/v1/names?limit={10_000}")
    assert status == 200 and doc["state"] == "ready" and doc["member"] == hc.addrs[0]
    rows = {r["name"]: r for r in doc["names"]}
    ra = rows["list-a"]
    assert ra["ranges_served"] == 2 and ra["ids_served"] == 7 and ra["value"] == 8 and ra["rate"] > 0
    assert time.mktime(time.strptime(ra["last_allocation"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone >= int(before) - 1
    assert rows["list-b"]["ids_served"] == 1
    names = [r["name"] for r in doc["names"]]
    assert names == sorted(names) and doc["total"] == len(names) and doc["next"] is None
    # paging
    status, page, _ = await call(http, "GET", f"{a}/v1/names?limit=1&after=list-a")
    assert [r["name"] for r in page["names"]] == ["list-b"] and page["next"] == "list-b"
    # another member holds the names (the writes reach every member) but served none of them
    other = {r["name"]: r for r in (await call(http, "GET", f"{hc.http_urls[1]}/v1/names"))[1]["names"]}
    assert other["list-b"]["ranges_served"] == 0 and other["list-b"]["last_allocation"] is None


async def test_health_and_readiness(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    for u in hc.http_urls:
        assert (await call(http, "GET", f"{u}/healthz"))[:2] == (200, {"status": "ok"})
        assert (await call(http, "GET", f"{u}/readyz"))[:2] == (200, {"status": "ready", "state": "ready"})


async def test_no_majority_and_a_catching_up_member(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Two members down: next answers 503 within the deadline. A wiped
    member back with --rejoin while another is still down cannot catch up:
    /readyz says 503 until it votes."""
    c = LocalCluster(3, root=str(tmp_path), http=True)
    try:
        c.start_all("--bootstrap", "--timeout", "1")
        await c.wait_ready(timeout=60)
        a, _, ur = c.http_urls
        await next_range(http, a, "nq", 5)
        c.kill(1)
        c.kill(2)
        t0 = time.monotonic()
        status, doc, _ = await call(http, "GET", f"{a}/v1/next/nq")
        took = time.monotonic() - t0
        assert status == 503 and doc["error"]["code"] == "no_quorum", doc
        assert took < 1.0 + 2.0  # the deadline (--timeout 1), with slack for a loaded machine
        assert (await call(http, "GET", f"{a}/healthz"))[0] == 200
        c.wipe(2)
        c.start(2, "--rejoin", "--timeout", "1")
        await wait_until(lambda: _ready_status(http, ur), 30, interval=0.05, what=lambda: c.output(2))
        status, doc, _ = await call(http, "GET", f"{ur}/readyz")
        assert status == 503 and doc["error"]["code"] == "not_ready" and doc["state"] == "catching_up"
        c.start(1, "--timeout", "1")
        await c.wait_ready(timeout=60)
        assert (await call(http, "GET", f"{ur}/readyz"))[0] == 200
        lo, _ = await next_range(http, ur, "nq")
        assert lo > 5
    finally:
        c.close()


async def test_a_stopping_member_answers_the_requests_in_flight(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """SIGTERM while a next waits for a quorum that cannot form (the member
    is alone): the request still gets its JSON answer at its deadline, then
    the member exits 0."""
    c = LocalCluster(3, root=str(tmp_path), http=True)
    try:
        c.start(0, "--bootstrap", "--timeout", "1")  # the others never come: bootstrapping, no quorum
        base = c.http_urls[0]
        assert await wait_until(lambda: _ready_status(http, base), 30, interval=0.05, what=lambda: c.output(0)) == 503
        pending = asyncio.ensure_future(call(http, "GET", f"{base}/v1/next/stopping"))

        async def received() -> bool:
            text = (await call(http, "GET", f"{base}/metrics"))[1]
            return bool(re.search(r"^seq_requests_total [1-9]", text, re.M))

        await wait_until(received, 10, interval=0.02, what="the member received the request")
        assert await asyncio.to_thread(c.stop, 0) == 0, c.output(0)
        status, doc, _ = await asyncio.wait_for(pending, 10)
        assert status == 503 and doc["error"]["code"] in ("no_quorum", "unavailable"), doc
        with pytest.raises(aiohttp.ClientConnectionError):
            await call(http, "GET", f"{base}/healthz")
    finally:
        c.close()


async def _ready_status(http: aiohttp.ClientSession, base: str) -> int | None:
    """The /readyz status once the listener answers (None before)."""
    try:
        return (await call(http, "GET", f"{base}/readyz"))[0]
    except aiohttp.ClientConnectionError:
        return None


# -- hostile input ------------------------------------------------------------------

BIG = str((1 << 32) + 1)  # above the default max_range
HOSTILE: list[tuple[str, str, bytes | None, int, str]] = [
    ("GET", "/v1/next/h?count=0", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=-1", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=abc", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=1.5", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=1e3", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=+5", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=0x10", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=%EF%BC%91", None, 400, "bad_count"),  # a fullwidth digit one
    ("GET", "/v1/next/h?count=", None, 400, "bad_count"),
    ("GET", f"/v1/next/h?count={BIG}", None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=" + "9" * 5000, None, 400, "bad_count"),
    ("GET", "/v1/next/h?count=1&count=2", None, 400, "bad_request"),
    ("GET", "/v1/next/h?cnt=1", None, 400, "bad_request"),
    ("GET", "/v1/next/" + "x" * 257, None, 400, "bad_name"),
    ("GET", "/v1/next/" + "%E2%82%AC" * 86, None, 400, "bad_name"),  # 86 euro signs: 258 bytes
    ("GET", "/v1/next/%FF", None, 400, "bad_name"),
    ("GET", "/v1/current/%ED%A0%80", None, 400, "bad_name"),  # a UTF-16 surrogate
    ("POST", "/v1/next/h", None, 405, "method_not_allowed"),
    ("HEAD", "/v1/next/h", None, 405, ""),  # HEAD must not allocate
    ("DELETE", "/v1/current/h", None, 405, "method_not_allowed"),
    ("PUT", "/v1/set/h", b'{"value": 5}', 405, "method_not_allowed"),
    ("GET", "/v1/set/h", None, 405, "method_not_allowed"),
    ("PATCH", "/healthz", None, 405, "method_not_allowed"),
    ("GET", "/v2/next/h", None, 404, "not_found"),
    ("GET", "/v1/next", None, 404, "not_found"),
    ("GET", "/../../etc/passwd", None, 404, "not_found"),
    ("POST", "/v1/set/h", b"", 400, "bad_request"),
    ("POST", "/v1/set/h", b"not json", 400, "bad_request"),
    ("POST", "/v1/set/h", b"[1]", 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": -1}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": 0}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": "5"}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": 1.5}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": true}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": NaN}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": 9223372036854775808}', 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": 5, "extra": 1}', 400, "bad_request"),
    ("POST", "/v1/set/h", b"\xff\xfe", 400, "bad_request"),
    ("POST", "/v1/set/h", b"[" * 2000 + b"]" * 2000, 400, "bad_request"),
    ("POST", "/v1/set/h", b'{"value": 5}' + b" " * 5000, 413, "payload_too_large"),
    ("GET", "/v1/names?limit=0", None, 400, "bad_request"),
    ("GET", "/v1/names?limit=100000", None, 400, "bad_request"),
    ("GET", "/healthz?x=1", None, 400, "bad_request"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), HOSTILE,
                         ids=[f"{m} {p[:40]}" for m, p, *_ in HOSTILE])
async def test_hostile_requests_get_typed_errors(hc: LocalCluster, http: aiohttp.ClientSession, method: str, path: str,
                                                 body: bytes | None, status: int, code: str) -> None:
    base = hc.http_urls[1]
    got, doc, r = await call(http, method, base + path, body)
    assert got == status, doc
    if code:
        assert r.content_type == "application/json"
        assert doc["error"]["code"] == code and doc["error"]["message"]
        assert len(doc["error"]["message"]) < 300  # what was sent is not echoed at length
    if status == 405:
        assert r.headers["Allow"]
    # the member carries on
    assert (await call(http, "GET", f"{base}/v1/current/h"))[0] == 200


async def test_garbage_on_the_socket_does_not_stop_the_member(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    host, _, port = hc.members[1].http_addr.rpartition(":")  # type: ignore[union-attr]
    for junk in (b"\x00\x01\x02 garbage\r\n\r\n", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
                 b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", b"GET / HTTP/1.1\r\n"):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(junk)
            await writer.drain()
            writer.write_eof()
            head = await asyncio.wait_for(reader.read(200), 10)
        finally:
            writer.close()
            await writer.wait_closed()
        assert head == b"" or re.match(rb"HTTP/1\.[01] 4\d\d ", head), head  # refused, or the connection closed
    assert (await call(http, "GET", f"{hc.http_urls[1]}/healthz"))[0] == 200
    assert (await next_range(http, hc.http_urls[1], "after-junk")) == (1, 1)


# -- monitoring ---------------------------------------------------------------------


def _series(text: str, metric: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(rf'^{metric}\{{name="((?:[^"\\]|\\.)*)"\}} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


async def test_metrics_are_bounded_by_the_cap(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    base = hc.http_urls[2]
    for i in range(3 * CAP):
        await next_range(http, base, f"cap-{i}", i + 1)
    status, text, r = await call(http, "GET", f"{base}/metrics")
    assert status == 200 and "text/plain" in r.headers["Content-Type"]
    ids = _series(text, "seq_name_ids_served_total")
    assert len(ids) == CAP + 1 and "_other" in ids  # CAP names of their own, the rest together
    for metric in ("seq_name_ranges_served_total", "seq_name_rate_ids_per_second"):
        assert set(_series(text, metric)) == set(ids)
    assert len(_series(text, "seq_name_value")) == CAP  # no value for the aggregate
    other = float(re.search(r"^seq_name_other_names (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert other >= 2 * CAP
    # nothing is lost in the aggregate: the series add up to what this member served
    rows = (await call(http, "GET", f"{base}/v1/names?limit=10000"))[1]["names"]
    assert sum(ids.values()) == sum(row["ids_served"] for row in rows)
    assert 'seq_ready 1.0' in text and "seq_rounds_total" in text


async def test_status_page_escapes_names(hc: LocalCluster, http: aiohttp.ClientSession) -> None:
    evil = "<script>alert(1)</script>&\"'"
    quoted = "".join(f"%{b:02X}" for b in evil.encode())
    status, doc, _ = await call(http, "GET", f"{hc.http_urls[0]}/v1/next/{quoted}")
    assert status == 200 and doc["name"] == evil  # names are any UTF-8, as over gRPC
    for path in ("/", "/status"):
        status, page, r = await call(http, "GET", hc.http_urls[0] + path)
        assert status == 200 and r.content_type == "text/html"
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;" in page
        assert "<script" not in page
        assert "script-src" not in r.headers["Content-Security-Policy"]  # default-src 'none': no script at all
    status, page, _ = await call(http, "GET", hc.http_urls[0] + "/?limit=1")
    assert 'href="?after=' in page  # the next page


# -- HTTPS and the CLI ---------------------------------------------------------------


async def test_https_with_the_member_certificates(pki: Any, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """The HTTP listener serves the member's certificate, and the new one after SIGHUP."""
    import signal
    import ssl

    from rustext.tls import ClientTls
    from tests.tlsutil import served_serial

    leaf = pki.leaf()
    cert, key = tmp_path / "member.pem", tmp_path / "member-key.pem"  # replaced below
    cert.write_bytes(leaf.cert.read_bytes())
    key.write_bytes(leaf.key.read_bytes())
    c = LocalCluster(3, root=str(tmp_path), http=True, tls=ClientTls(ca=str(pki.ca)))
    try:
        c.start_all("--bootstrap", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(pki.ca))
        await c.wait_ready(timeout=60)
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        url = c.http_urls[0].replace("http://", "https://")
        status, doc, _ = await call(http, "GET", f"{url}/v1/next/tls?count=3", ssl=ctx)
        assert (status, doc) == (200, {"name": "tls", "from": 1, "to": 3})
        with pytest.raises(aiohttp.ClientConnectionError):  # plaintext to the TLS listener
            await call(http, "GET", f"{c.http_urls[0]}/healthz")
        host, _, port = c.members[0].http_addr.rpartition(":")  # type: ignore[union-attr]
        before = await served_serial(host, int(port), pki.ca)
        fresh = pki.leaf(name="fresh")
        cert.write_bytes(fresh.cert.read_bytes())
        key.write_bytes(fresh.key.read_bytes())
        c.members[0].proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        await wait_until(lambda: "TLS certificate reloaded" in c.output(0), 10, what=lambda: c.output(0))
        assert await served_serial(host, int(port), pki.ca) != before
        assert (await call(http, "GET", f"{url}/healthz", ssl=ctx))[0] == 200
    finally:
        c.close()


def test_cli_help_names_the_http_flags() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cli", "seq", "server", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--http HOST:PORT" in out.stdout and "--metrics-max-names" in out.stdout


async def test_http_address_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket
    import subprocess

    c = LocalCluster(1, root=str(tmp_path), http=True)
    host, _, port = c.members[0].http_addr.rpartition(":")  # type: ignore[union-attr]
    with socket.socket() as s:
        s.bind((host, int(port)))
        s.listen()
        out = await asyncio.to_thread(subprocess.run, c.command(0, "--bootstrap"), capture_output=True, text=True,
                                      timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"cannot listen on {host}:{port}" in out.stderr and "Traceback" not in out.stderr
