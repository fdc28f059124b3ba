"""Active health checks, run from asyncio.

Each backend gets one task that checks it every ``interval`` (each check
bounded by ``timeout``):

* HTTP checks send ``GET <path>`` on a fresh connection; a 2xx/3xx answer is
  a success (redirects are not followed). For ``proto = "h1"`` pools the
  client is aiohttp; a backend that expects a PROXY protocol header
  (``send_proxy``) is checked over a raw connection that starts with one
  naming no client (v2 ``LOCAL``, v1 ``UNKNOWN``), as HAProxy's checks of
  such servers do. For ``proto = "h2"`` pools the check speaks HTTP/2
  (h2c with prior knowledge, or ALPN ``h2`` over TLS), since many HTTP/2
  and gRPC servers answer nothing else. With TLS to backends, checks use
  TLS too (after the PROXY header, for servers that expect one).
* gRPC checks (``type = "grpc"``) call ``grpc.health.v1.Health/Check`` as
  Envoy, Kubernetes' gRPC probes and ``grpc_health_probe`` do: ``SERVING``
  is a success; any other status, a gRPC error (``UNIMPLEMENTED`` from a
  server without the health service, ``NOT_FOUND`` for an unknown
  service), a timeout or a broken connection is a failure. One HTTP/2
  connection per backend stays open between checks and is replaced once it
  breaks or a check times out (its state is then unknown).

HTTP/2 is the ``h2`` library's sans-I/O state machine driven over asyncio
streams, not grpcio: the checks then reach backends exactly as the data
plane does (Unix sockets, ``tls.backend_insecure``, which grpcio cannot
express). The two health messages go through protobuf's runtime from a
descriptor built here (no generated module): ``HealthCheckRequest{string
service = 1}``, ``HealthCheckResponse{ServingStatus status = 1}``, ``SERVING = 1``.

After ``rise`` successes in a row a down backend is marked up, after
``fall`` failures in a row an up backend is marked down; every transition
calls ``on_change(name, healthy)`` (the service forwards it to the data
plane). Backends start up, as the data plane assumes.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import ssl
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

if TYPE_CHECKING:
    import aiohttp

from balancer.checks import parse_hostport, unix_path
from balancer.config_sections import HealthCheck, Tls

log = logging.getLogger("balancer.health")


USER_AGENT = "juggler-balancer-health"
#: the most of a response body a check reads (a health answer is a few bytes)
MAX_BODY = 64 * 1024


def backend_ssl(tls: Tls, alpn: str) -> ssl.SSLContext:
    """The TLS settings the data plane uses towards backends, for checks."""
    ctx = ssl.create_default_context(cafile=tls.backend_ca)
    if tls.backend_insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    return ctx


def check_target(address: str, check: HealthCheck) -> str:
    """Where a server's checks go: its address, or its host at ``check.port``."""
    if check.port is None or unix_path(address) is not None:
        return address
    host, _ = parse_hostport(address, "backend address")
    return f"[{host}]:{check.port}" if ":" in host else f"{host}:{check.port}"


def answer_ok(status: int, body: bytes | None, check: HealthCheck) -> bool:
    """Whether an HTTP check's answer means up: its status (``expect_status``,
    else any 2xx/3xx) and, with ``expect_body``, that text in its body."""
    if not (status in check.expect_status if check.expect_status is not None else 200 <= status < 400):
        return False
    if check.expect_body is None:
        return True
    return body is not None and check.expect_body.encode() in body


async def probe(session: aiohttp.ClientSession, address: str, check: HealthCheck,
                tls: ssl.SSLContext | None = None) -> bool:
    """One check: True when the backend answers as ``check`` expects within the timeout."""
    import aiohttp

    host, port = parse_hostport(check_target(address, check), "backend address")
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        async with session.request(
            check.method, f"{'https' if tls else 'http'}://{authority}{check.path}",
            headers={"Host": check.host or address, "User-Agent": USER_AGENT},
            allow_redirects=False,
            ssl=tls if tls is not None else True,
            timeout=aiohttp.ClientTimeout(total=check.timeout),
        ) as resp:
            body = await resp.content.read(MAX_BODY) if check.expect_body is not None else None
            return answer_ok(resp.status, body, check)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return False


def parse_response(data: bytes) -> tuple[int, bytes]:
    """The status and body of an HTTP/1 response read whole (``Connection:
    close``): http.client's parser, over the bytes, for chunked bodies too."""
    import io

    class Bytes:
        def makefile(self, _mode: str) -> io.BytesIO:
            return io.BytesIO(data)

    resp = http.client.HTTPResponse(Bytes())  # type: ignore[arg-type]
    resp.begin()
    try:
        body = resp.read()
    except http.client.IncompleteRead as exc:  # cut at MAX_BODY: what came is enough to look in
        body = exc.partial
    return resp.status, body


#: The PROXY header of a health check: the balancer's own connection, no client.
CHECK_PROXY_HEADERS = {
    "v1": b"PROXY UNKNOWN\r\n",
    "v2": b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00",
}


async def probe_raw(address: str, check: HealthCheck, version: str | None,
                    tls: ssl.SSLContext | None = None) -> bool:
    """``probe`` over a connection made here: for a backend on a Unix socket,
    or one that expects a PROXY header (``version``) first. With ``tls`` the
    handshake follows the header, as the data plane's connections do, naming
    the address's host (``localhost`` for a Unix socket)."""
    path = unix_path(address)

    async def once() -> bool:
        if path is not None:
            reader, writer = await asyncio.open_unix_connection(path)
            host = "localhost"
        else:
            host, port = parse_hostport(check_target(address, check), "backend address")
            reader, writer = await asyncio.open_connection(host, port)
        try:
            header = CHECK_PROXY_HEADERS.get(version or "", b"")
            if tls is not None:
                if header:
                    writer.write(header)
                    await writer.drain()
                    header = b""
                await writer.start_tls(tls, server_hostname=host)
            writer.write(header + (
                f"{check.method} {check.path} HTTP/1.1\r\nHost: {check.host or ('localhost' if path else address)}\r\n"
                "User-Agent: juggler-balancer-health\r\nConnection: close\r\n\r\n").encode("latin-1"))
            await writer.drain()
            if check.expect_body is None:
                status = (await reader.readline()).split()
                return len(status) >= 2 and status[0].startswith(b"HTTP/") and status[1].isdigit() \
                    and answer_ok(int(status[1]), None, check)
            data = b""
            while len(data) < MAX_BODY + 16 * 1024 and (chunk := await reader.read(65536)):
                data += chunk
            return answer_ok(*parse_response(data), check)
        finally:
            writer.close()

    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that races the probe's end, and the checker then never stops
        async with asyncio.timeout(check.timeout):
            return await once()
    except (OSError, TimeoutError, ValueError, UnicodeError, http.client.HTTPException):
        return False


class H2Connection:
    """One HTTP/2 connection to a backend, one request at a time.

    h2c with prior knowledge on plain backends, ALPN ``h2`` over TLS
    (``tls``). Not safe to share between tasks; a request cancelled or
    timed out midway leaves the connection unusable: close it.
    """

    def __init__(self, address: str, tls: ssl.SSLContext | None) -> None:
        self.address = address
        self.tls = tls
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn: h2.connection.H2Connection | None = None

    @property
    def open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        path = unix_path(self.address)
        if path is not None:
            self._reader, self._writer = await asyncio.open_unix_connection(
                path, ssl=self.tls, server_hostname="localhost" if self.tls else None)
        else:
            host, port = parse_hostport(self.address, "backend address")
            self._reader, self._writer = await asyncio.open_connection(host, port, ssl=self.tls)
        if self.tls is not None:
            tls_object = self._writer.get_extra_info("ssl_object")
            alpn = tls_object.selected_alpn_protocol() if tls_object is not None else None
            if alpn != "h2":
                raise ConnectionError(f"backend {self.address} did not agree to HTTP/2 (ALPN {alpn!r})")
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self._conn.initiate_connection()
        self._writer.write(self._conn.data_to_send())
        await self._writer.drain()

    async def request(self, headers: list[tuple[bytes, bytes]], body: bytes = b"", *,
                      want_body: bool = True) -> tuple[dict[bytes, bytes], bytes, dict[bytes, bytes]]:
        """(response headers, body, trailers); without ``want_body`` it
        returns once the headers are in and resets the stream."""
        if not self.open:
            await self.connect()
        conn, reader, writer = self._conn, self._reader, self._writer
        assert conn is not None and reader is not None and writer is not None
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, headers, end_stream=not body)
        if body:  # a few bytes: within any initial flow-control window
            conn.send_data(sid, body, end_stream=True)
        writer.write(conn.data_to_send())
        await writer.drain()
        head: dict[bytes, bytes] = {}
        data = bytearray()
        trailers: dict[bytes, bytes] = {}
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                raise ConnectionError(f"backend {self.address} closed the connection")
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ConnectionTerminated):
                    raise ConnectionError(f"backend {self.address} sent GOAWAY ({event.error_code!r})")
                if getattr(event, "stream_id", sid) != sid:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    head = dict(event.headers)
                    if head.get(b":status", b"").startswith(b"1"):
                        continue  # an interim response
                    if not want_body:
                        try:  # a body may follow: not needed
                            conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                        except h2.exceptions.StreamClosedError:
                            pass  # it already ended, within the bytes just read
                        writer.write(conn.data_to_send())
                        return head, b"", {}
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    if len(data) > MAX_BODY:
                        raise ValueError(f"backend {self.address} answered a health check with over {MAX_BODY} bytes")
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = dict(event.headers)
                elif isinstance(event, h2.events.StreamReset):
                    raise ConnectionError(f"backend {self.address} reset the check's stream ({event.error_code!r})")
                elif isinstance(event, h2.events.StreamEnded):
                    writer.write(conn.data_to_send())
                    return head, bytes(data), trailers
            writer.write(conn.data_to_send())  # SETTINGS and PING acks, window updates
            await writer.drain()

    async def aclose(self) -> None:
        """Idempotent."""
        writer, self._writer, self._conn = self._writer, None, None
        if writer is not None:
            writer.close()
            try:  # bounded: a TLS peer may never answer close_notify
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()
            except (OSError, ssl.SSLError, TimeoutError):
                writer.transport.abort()
            except asyncio.CancelledError:
                writer.transport.abort()  # the socket now, not after a TLS shutdown nobody waits for
                raise


def _authority(address: str, check: HealthCheck) -> bytes:
    return (check.host or ("localhost" if unix_path(address) is not None else address)).encode("idna")


async def probe_h2(address: str, check: HealthCheck, tls: ssl.SSLContext | None) -> bool:
    """An HTTP check over HTTP/2 on a fresh connection, answered as ``check`` expects."""
    conn = H2Connection(check_target(address, check), tls)
    try:
        async with asyncio.timeout(check.timeout):
            head, body, _ = await conn.request([
                (b":method", check.method.encode()), (b":scheme", b"https" if tls else b"http"),
                (b":authority", _authority(address, check)), (b":path", check.path.encode()),
                (b"user-agent", USER_AGENT.encode())], want_body=check.expect_body is not None)
        status = head.get(b":status", b"")
        return status.isdigit() and answer_ok(int(status), body, check)
    except (OSError, TimeoutError, ValueError, UnicodeError, ssl.SSLError, h2.exceptions.H2Error):
        return False
    finally:
        await conn.aclose()


#: grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING
SERVING = 1


def _health_messages() -> tuple[type[Message], type[Message]]:
    """``HealthCheckRequest{string service = 1}`` and ``HealthCheckResponse{status = 1}``
    (the enum read as its int32 wire form), built from a descriptor in a pool of their own:
    no generated module, and no clash with grpcio-health-checking's if it is loaded."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="balancer/grpc_health_v1.proto", package="grpc.health.v1",
                                               syntax="proto3")
    proto.message_type.add(name="HealthCheckRequest").field.add(
        name="service", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    proto.message_type.add(name="HealthCheckResponse").field.add(
        name="status", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")))


_REQUEST, _RESPONSE = _health_messages()


def health_request(service: str) -> bytes:
    """A length-prefixed, uncompressed ``HealthCheckRequest{service}``."""
    msg = _REQUEST(service=service).SerializeToString()
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def serving_status(body: bytes) -> int:
    """The ``status`` of one length-prefixed ``HealthCheckResponse`` (0,
    UNKNOWN, when absent, as proto3 omits defaults); ValueError if malformed."""
    if len(body) < 5 or body[0] != 0:
        raise ValueError("not one uncompressed gRPC message")
    size = int.from_bytes(body[1:5], "big")
    if len(body) - 5 != size:
        raise ValueError("truncated gRPC message")
    try:
        return int(_RESPONSE.FromString(body[5:]).status)
    except DecodeError as exc:
        raise ValueError(f"malformed HealthCheckResponse: {exc}") from exc


async def probe_grpc(conn: H2Connection, check: HealthCheck) -> bool:
    """One ``grpc.health.v1.Health/Check`` on ``conn``: True for SERVING.
    A kept connection found closed (the server's idle timeout, a GOAWAY
    between checks) is replaced once within the same timeout; ``conn`` is
    closed when the check leaves it in an unknown state."""
    headers = [
        (b":method", b"POST"), (b":scheme", b"https" if conn.tls is not None else b"http"),
        (b":path", b"/grpc.health.v1.Health/Check"), (b":authority", _authority(conn.address, check)),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        (b"grpc-timeout", b"%dm" % max(1, int(check.timeout * 1000))), (b"user-agent", USER_AGENT.encode())]
    request = health_request(check.grpc_service)
    try:
        async with asyncio.timeout(check.timeout):
            reused = conn.open
            try:
                head, body, trailers = await conn.request(headers, request)
            except (ConnectionError, h2.exceptions.ProtocolError):
                if not reused:
                    raise
                await conn.aclose()
                head, body, trailers = await conn.request(headers, request)
    except (OSError, TimeoutError, ValueError, UnicodeError, ssl.SSLError, h2.exceptions.H2Error) as exc:
        log.debug("gRPC health check of %s failed: %r", conn.address, exc)
        await conn.aclose()
        return False
    grpc_status = trailers.get(b"grpc-status", head.get(b"grpc-status"))  # trailers-only: in the headers
    if head.get(b":status") != b"200" or grpc_status != b"0":
        log.debug("gRPC health check of %s: HTTP %s, grpc-status %s, %s", conn.address, head.get(b":status"),
                  grpc_status, trailers.get(b"grpc-message", head.get(b"grpc-message")))
        return False
    try:
        return serving_status(body) == SERVING
    except ValueError as exc:
        log.debug("gRPC health check of %s: %s", conn.address, exc)
        return False


class HealthChecker:
    """Runs one probe task per backend; ``set_backends`` follows reloads."""

    def __init__(self, check: HealthCheck, on_change: Callable[[str, bool], None], *,
                 proto: str = "h1", tls: Tls | None = None) -> None:
        """``proto``: the pool's protocol to its backends; ``tls``: its
        ``[tls]`` settings (``backend = true``: checks go over TLS too)."""
        self.check = check
        self.proto = proto
        self.tls = tls if tls is not None and tls.backend else None
        self._ssl: ssl.SSLContext | None = None
        if self.tls is not None:
            self._ssl = backend_ssl(self.tls, "h2" if proto == "h2" else "http/1.1")
        self._on_change = on_change
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.healthy: dict[str, bool] = {}
        #: ``name → whether the data plane has it out after passive failures``: with
        #: ``passive.on_error = "mark-down"`` such a server is down until ``rise`` checks pass
        self.ejected: Callable[[str], bool] | None = None
        self._session: aiohttp.ClientSession | None = None
        #: backend address → ``"v1"`` / ``"v2"`` for those checked with a PROXY header
        self.send_proxy: dict[str, str | None] = {}

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp  # loaded only when health checks are configured

        if self._session is None:
            # a fresh connection per check: a backend's listener is what is tested
            connector = aiohttp.TCPConnector(force_close=True, limit=0)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    def set_backends(self, addresses: Iterable[str], check: HealthCheck | None = None) -> None:
        """Start checking new backends and stop checking removed ones."""
        if check is not None and check != self.check:
            self.check = check
            for name in list(self._tasks):
                self._tasks.pop(name).cancel()
        wanted = set(addresses)
        for name in list(self._tasks):
            if name not in wanted:
                self._tasks.pop(name).cancel()
                self.healthy.pop(name, None)
        for name in wanted:
            if name not in self._tasks:
                self.healthy.setdefault(name, True)
                self._tasks[name] = asyncio.create_task(self._run(name), name=f"health {name}")

    async def _run(self, name: str) -> None:
        ok_streak = bad_streak = 0
        grpc = H2Connection(check_target(name, self.check), self._ssl)  # kept open between gRPC checks
        try:
            while True:
                ok = await self._probe(name, grpc)
                if ok:
                    ok_streak, bad_streak = ok_streak + 1, 0
                else:
                    ok_streak, bad_streak = 0, bad_streak + 1
                up = self.healthy.get(name, True)
                if up and self._marked_down(name):
                    # marked down by its errors (HAProxy's on-error mark-down): up again after
                    # `rise` good checks from now
                    self.healthy[name] = up = False
                    ok_streak = 0
                    log.warning("backend %s is down (marked down by its errors)", name)
                if up and bad_streak >= self.check.fall:
                    self._set(name, False)
                elif not up and ok_streak >= self.check.rise:
                    self._set(name, True)
                await asyncio.sleep(self.check.interval)
        finally:
            await grpc.aclose()

    async def _probe(self, name: str, grpc: H2Connection) -> bool:
        if self.check.type == "grpc":
            return await probe_grpc(grpc, self.check)
        if self.proto == "h2":
            return await probe_h2(name, self.check, self._ssl)
        version = self.send_proxy.get(name)
        if (version is not None and version in CHECK_PROXY_HEADERS) or unix_path(name) is not None:
            return await probe_raw(name, self.check, version, self._ssl)
        return await probe(self._client(), name, self.check, self._ssl)

    def _marked_down(self, name: str) -> bool:
        if self.ejected is None:
            return False
        try:
            return self.ejected(name)
        except Exception:  # a backend removed by a concurrent reload
            return False

    def _set(self, name: str, healthy: bool) -> None:
        self.healthy[name] = healthy
        log.warning("backend %s is %s", name, "up" if healthy else "down")
        try:
            self._on_change(name, healthy)
        except Exception:  # a backend removed by a concurrent reload
            log.exception("cannot mark backend %s", name)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
