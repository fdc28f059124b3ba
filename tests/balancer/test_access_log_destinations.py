"""Access logs per listener, to syslog (UDP, TCP and a local datagram socket,
RFC 3164 and RFC 5424), and the lines of connections that end without a
complete request (HAProxy's ``CR``/``cR`` with ``<BADREQ>``). Real
balancers, sockets and syslog receivers bound by the tests."""

from __future__ import annotations

import os
import queue
import re
import socket
import threading
import time

import pytest
from balancer_helpers import lb_config, raw_exchange, split_response
from test_access_log import get, wait_lines

from balancer import BalancerConfigError, LoadBalancer, load
from tests.netutil import free_port

pytestmark = pytest.mark.timeout(120)


class SyslogReceiver:
    """A datagram socket standing for a syslog daemon: UDP on loopback or a Unix socket."""

    def __init__(self, unix_path: str | None = None) -> None:
        if unix_path is None:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.bind(("127.0.0.1", 0))
            self.address = f"udp://127.0.0.1:{self.sock.getsockname()[1]}"
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind(unix_path)
            self.address = f"unix:{unix_path}"
        self.sock.settimeout(15)

    def messages(self, n: int) -> list[bytes]:
        return [self.sock.recv(65536) for _ in range(n)]

    def close(self) -> None:
        self.sock.close()


class TcpSyslogReceiver:
    """A syslog server over TCP reading RFC 6587 octet-counted frames
    (``LEN SP MSG``), as rsyslog's and syslog-ng's TCP inputs do (a frame
    that is not one ends the test with the bytes it got), or newline-ended
    messages (``newline=True``)."""

    def __init__(self, port: int = 0, *, newline: bool = False) -> None:
        self.newline = newline
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.got: queue.Queue[bytes] = queue.Queue()
        self.conns: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            if self.newline:
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self.got.put(line)
                continue
            while (m := re.match(rb"([1-9]\d*) ", buf)) and len(buf) >= m.end() + int(m.group(1)):
                end = m.end() + int(m.group(1))
                self.got.put(buf[m.end():end])
                buf = buf[end:]
            if buf and not re.match(rb"\d{1,6}( |$)", buf):
                self.got.put(b"NOT A FRAME: " + buf)
                return

    def messages(self, n: int) -> list[bytes]:
        return [self.got.get(timeout=15) for _ in range(n)]

    def close(self) -> None:
        # shut down first: a close() alone leaves a socket another thread blocks on open
        for s in (self.listener, *self.conns):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture
def syslog_receiver(tmp_path):
    made: list[SyslogReceiver] = []

    def make(unix: bool = False) -> SyslogReceiver:
        r = SyslogReceiver(str(tmp_path / "log.sock") if unix else None)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_each_listener_logs_where_it_is_told(tmp_path, backends, proxy):
    b = backends(1)
    top, own = tmp_path / "top.log", tmp_path / "own.log"
    def listeners(own_format: str) -> list[dict[str, object]]:
        logs = [{}, {"access_log": {"path": str(own), "format": own_format}}, {"access_log": False}]
        return [{"address": "127.0.0.1:0", "default_backend": "default", **log} for log in logs]

    lb = proxy(b, workers=1, access_log={"path": str(top), "format": "top %ft %HP"}, listeners=listeners("json"))
    ports = [a[1] for a in lb.addresses]
    for i, port in enumerate(ports):
        assert get(port, f"/size/{i}")[0].startswith("HTTP/1.1 200")
    assert wait_lines(top, 1) == [f"top 127.0.0.1:{ports[0]} /size/0"]
    (line,) = wait_lines(own, 1)
    assert '"path":"/size/1"' in line and f'"frontend":"127.0.0.1:{ports[1]}"' in line
    # the third listener logs nothing; a request on the first after it shows its line was not held back
    assert get(ports[0], "/size/9")[0].startswith("HTTP/1.1 200")
    assert wait_lines(top, 2)[1] == f"top 127.0.0.1:{ports[0]} /size/9"
    assert len(wait_lines(own, 1)) == 1
    # a reload changes a listener's format; its destination stays
    lb.update(lb_config(b, workers=1, access_log={"path": str(top), "format": "top %ft %HP"},
                        listeners=listeners("own2 %HP %ST")))
    assert get(ports[1], "/size/4")[0].startswith("HTTP/1.1 200")
    assert wait_lines(own, 2)[1] == "own2 /size/4 200"


@pytest.mark.parametrize("unix", [False, True], ids=["udp", "unix"])
def test_syslog_rfc3164_as_haproxy_sends_it(tmp_path, backends, proxy, syslog_receiver, unix):
    b = backends(1)
    rx = syslog_receiver(unix)
    lb = proxy(b, workers=1, access_log={
        "format": "%HM %HP %ST", "syslog": rx.address, "facility": "local0", "syslog_format": "rfc3164",
        "tag": "edge", "max_length": 1024})
    port = lb.address[1]
    assert get(port, "/size/2")[0].startswith("HTTP/1.1 200")
    assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
    got = [m.decode() for m in rx.messages(2)]
    # <PRI> = local0 (16) * 8 + info (6); "Mmm dd hh:mm:ss TAG[PID]: MSG", one message per line, no newline
    pid = os.getpid()
    pattern = r"<134>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d edge\[" + str(pid) + r"\]: (.*)"
    assert [re.fullmatch(pattern, m).group(1) for m in got] == ["GET /size/2 200", "GET /whoami 200"], got


def test_syslog_rfc5424_and_max_length(backends, proxy, syslog_receiver):
    b = backends(1)
    rx = syslog_receiver()
    lb = proxy(b, workers=1, access_log={
        "format": "%HP %[req.hdr(X-Pad)]", "syslog": rx.address, "facility": "daemon", "syslog_format": "rfc5424",
        "tag": "balancer", "max_length": 100})
    assert get(lb.address[1], "/size/1", "X-Pad: " + "p" * 300 + "\r\n")[0].startswith("HTTP/1.1 200")
    (m,) = rx.messages(1)
    assert len(m) == 100
    m = m.decode()
    # <PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD MSG; daemon (3) * 8 + 6 = 30
    head = re.match(r"<30>1 (\S+) (\S+) balancer (\d+) - - /size/1 p+$", m)
    assert head, m
    assert head.group(1).endswith("Z") and head.group(2) == socket.gethostname() and int(head.group(3)) == os.getpid()


def test_syslog_over_tcp_octet_counted(backends, proxy):
    b = backends(1)
    rx = TcpSyslogReceiver()
    try:
        lb = proxy(b, workers=2, access_log={
            "format": "%HM %HP %ST", "syslog": rx.address, "facility": "local0", "syslog_format": "rfc5424",
            "tag": "edge", "max_length": 1024})
        paths = [f"/size/{i}" for i in range(20)]
        for path in paths:
            assert get(lb.address[1], path)[0].startswith("HTTP/1.1 200")
        got = [m.decode() for m in rx.messages(len(paths))]
        pattern = r"<134>1 \S+Z \S+ edge " + str(os.getpid()) + r" - - GET (/size/\d+) 200"
        assert sorted(re.fullmatch(pattern, m).group(1) for m in got) == sorted(paths), got
        assert rx.accepted == 1  # one connection carries every line
    finally:
        rx.close()


def test_syslog_over_tcp_newline_framing(backends, proxy):
    b = backends(1)
    rx = TcpSyslogReceiver(newline=True)
    try:
        lb = proxy(b, workers=1, access_log={
            "format": "%HP", "syslog": rx.address, "facility": "local0", "syslog_format": "rfc3164", "tag": "lb",
            "max_length": 1024, "syslog_framing": "newline"})
        for i in range(3):
            assert get(lb.address[1], f"/size/{i}")[0].startswith("HTTP/1.1 200")
        got = rx.messages(3)
        assert [m.rpartition(b": ")[2] for m in got] == [b"/size/0", b"/size/1", b"/size/2"], got
        assert all(m.startswith(b"<134>") for m in got), got
    finally:
        rx.close()


def test_a_tcp_syslog_server_that_restarts_gets_the_lines_after_it(backends, proxy):
    """Lines while the server is away are dropped and counted, requests go on,
    and the lines after it is back reach it on a new connection."""
    b = backends(1)
    rx = TcpSyslogReceiver()
    port = rx.port
    lb = proxy(b, workers=1, access_log={
        "format": "%HP", "syslog": rx.address, "facility": "local0", "syslog_format": "rfc3164", "tag": "lb",
        "max_length": 1024})
    try:
        assert get(lb.address[1], "/size/1")[0].startswith("HTTP/1.1 200")
        assert rx.messages(1)[0].endswith(b": /size/1")
        rx.close()
        deadline = time.monotonic() + 15
        while lb.stats()["access_log_dropped"] == 0:
            assert time.monotonic() < deadline, lb.stats()
            assert get(lb.address[1], "/size/2")[0].startswith("HTTP/1.1 200")
        rx = TcpSyslogReceiver(port)
        deadline = time.monotonic() + 15
        got: list[bytes] = []
        while not any(m.endswith(b": /size/3") for m in got):
            assert get(lb.address[1], "/size/3")[0].startswith("HTTP/1.1 200")
            try:
                got.append(rx.got.get(timeout=0.2))
            except queue.Empty:
                assert time.monotonic() < deadline, lb.stats()
        # lines of requests made while it was away may come first: queued, not yet dropped
        assert all(m.endswith((b": /size/2", b": /size/3")) for m in got) and rx.accepted == 1, got
    finally:
        rx.close()


def test_a_missing_syslog_daemon_drops_lines_and_requests_go_on(backends, proxy, tmp_path):
    b = backends(1)
    lb = proxy(b, workers=1, access_log={
        "format": "%HP", "syslog": f"unix:{tmp_path / 'nobody.sock'}", "facility": "local0",
        "syslog_format": "rfc3164", "tag": "balancer", "max_length": 1024})
    for _ in range(3):
        assert get(lb.address[1], "/whoami")[0].startswith("HTTP/1.1 200")
    deadline = time.monotonic() + 15
    while lb.stats()["access_log_dropped"] < 3:
        assert time.monotonic() < deadline, lb.stats()
        time.sleep(0.02)
    assert lb.stats()["access_log_lines"] == 0


def test_connections_ending_without_a_request(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, timeouts={"header": 0.3},
               access_log={"path": str(log), "format": "%ST %tsc \"%r\" %b/%s"})
    port = lb.address[1]
    # connected and closed without a byte: not logged (HAProxy's "option dontlognull")
    socket.create_connection(("127.0.0.1", port)).close()
    # closed in the middle of a request head: CR, 400, <BADREQ>
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\n")
    # a head that never ends: cut by the header timeout, cR, 408
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /whoami HTTP/1.1\r\n")
        s.settimeout(10)
        assert s.recv(100) == b""  # closed by the balancer
    # a keep-alive connection closed between requests is not a bad request
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /size/1 HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"\x00"):
            got += s.recv(4096)
    lines = wait_lines(log, 3)
    assert lines == ['400 CR-- "<BADREQ>" -/-', '408 cR-- "<BADREQ>" -/-',
                     f'200 ---- "GET /size/1 HTTP/1.1" default/{b[0].address}'], lines
    # no line came for the keep-alive close: the next line is the next request's
    assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
    assert wait_lines(log, 4)[3:] == [f'200 ---- "GET /whoami HTTP/1.1" default/{b[0].address}']


def test_log_empty_logs_connections_closed_before_a_byte(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, access_log={"path": str(log), "format": "%ST %tsc %r", "log_empty": True})
    socket.create_connection(("127.0.0.1", lb.address[1])).close()
    assert wait_lines(log, 1) == ["400 CR-- <BADREQ>"]


def test_the_hyper_path_logs_a_head_cut_short(tmp_path, backends, proxy):
    """After a request hyper's path served (chunked body), the client sends
    half a head and closes."""
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, access_log={"path": str(log), "format": "%ST %ts %HP"})
    with socket.create_connection(("127.0.0.1", lb.address[1])) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        got = b""
        while b"abc" not in got:
            got += s.recv(4096)
        s.sendall(b"GET /whoami HTTP/1.1\r\nHo")
    assert wait_lines(log, 2) == ["200 -- /echo", "400 CR -"]


def test_toml_listener_logs_syslog_and_reload_of_destinations(tmp_path, backends, syslog_receiver):
    b = backends(1)
    rx = syslog_receiver()
    own = tmp_path / "admin-side.log"
    path = tmp_path / "balancer.toml"
    text = (f'workers = 1\n[access_log]\nsyslog = "{rx.address.removeprefix("udp://")}"\nfacility = "local3"\n'
            f'format = "%HP"\n'
            f'[[listeners]]\naddress = "127.0.0.1:0"\ndefault_backend = "web"\n'
            f'[[listeners]]\naddress = "127.0.0.1:0"\ndefault_backend = "web"\n'
            f'access_log = {{ path = "{own}", format = "{{fmt}}" }}\n'
            f'[[listeners]]\naddress = "127.0.0.1:0"\ndefault_backend = "web"\naccess_log = false\n'
            f'[backends.web]\nservers = ["{b[0].address}"]\n')
    path.write_text(text.replace("{fmt}", "side %HP"))
    import asyncio

    async def run() -> None:
        async with LoadBalancer(load(path), config_path=path) as lb:
            p = [a[1] for a in lb.addresses]
            for i, port in enumerate(p):
                assert (await asyncio.to_thread(get, port, f"/size/{i}"))[0].startswith("HTTP/1.1 200")
            (m,) = rx.messages(1)
            assert m.startswith(b"<158>") and m.endswith(b": /size/0")  # local3 = 19: 19 * 8 + 6
            assert wait_lines(own, 1) == ["side /size/1"]
            path.write_text(text.replace("{fmt}", "side2 %HP"))
            await lb.reload()
            assert (await asyncio.to_thread(get, p[1], "/whoami"))[0].startswith("HTTP/1.1 200")
            assert wait_lines(own, 2)[1] == "side2 /whoami"

    asyncio.run(run())


@pytest.mark.parametrize(("table", "message"), [
    ('[access_log]\nsyslog = "tls://127.0.0.1:6514"\n', "access_log.syslog must be udp://host:port (or host:port), tcp://"),
    ('[access_log]\nsyslog = "tcp://127.0.0.1"\n', "access_log.syslog"),
    ('[access_log]\nsyslog = "tcp://127.0.0.1:514"\nsyslog_framing = "lf"\n',
     "access_log.syslog_framing must be octet-count or newline"),
    ('[access_log]\nsyslog = "127.0.0.1:514"\nsyslog_framing = "newline"\n', "applies to a tcp:// syslog server only"),
    ('[access_log]\nsyslog = "127.0.0.1:514"\npath = "-"\n', "give path or syslog, not both"),
    ('[access_log]\nsyslog = "127.0.0.1:514"\nfacility = "local9"\n', "access_log.facility must be one of"),
    ('[access_log]\nsyslog = "127.0.0.1:514"\nsyslog_format = "json"\n', "syslog_format must be rfc3164 or rfc5424"),
    ('[access_log]\nsyslog = "unix:dev/log"\n', "must be absolute"),
    ('[access_log]\nformat = "json"\n', "access_log.path must be a file name"),
    ('[[listeners]]\naddress = "127.0.0.1:0"\naccess_log = "yes"\n', "listeners[0].access_log must be a table"),
    ('[[listeners]]\naddress = "127.0.0.1:0"\naccess_log = { path = "-", format = "%zz" }\n',
     "listeners[0].access_log.format"),
])
def test_bad_log_tables_name_file_and_line(tmp_path, table, message):
    path = tmp_path / "balancer.toml"
    top = 'listen = "127.0.0.1:0"\n' if "[[listeners]]" not in table else ""
    path.write_text(f'{top}backends = ["127.0.0.1:9"]\n{table}')
    with pytest.raises(BalancerConfigError, match=re.escape(message)) as e:
        load(path)
    assert f"{path}:" in str(e.value)


def test_a_listener_log_keeps_requests_of_others_flowing(backends, proxy, tmp_path):
    """Splitting logs costs nothing on a listener that has none: its requests go as usual."""
    b = backends(1)
    lb = proxy(b, workers=1, listeners=[
        {"address": "127.0.0.1:0", "default_backend": "default",
         "access_log": {"path": str(tmp_path / "x.log"), "format": "%HP"}},
        {"address": "127.0.0.1:0", "default_backend": "default", "access_log": False}])
    raw = raw_exchange(lb.addresses[1][1], b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert split_response(raw)[2] == b"b0"
    assert wait_lines(tmp_path / "x.log", 0) == []


def test_logs_follow_listeners_a_reload_adds_and_removes(tmp_path, backends):
    """Listener logs are kept by listener, not by position: after a reload
    removes the first listener and adds another, each listener's lines
    still go where its table says."""
    import asyncio

    b = backends(1)
    top, own = tmp_path / "top.log", tmp_path / "own.log"
    path = tmp_path / "balancer.toml"
    ports = [free_port() for _ in range(3)]

    def listener(port: int, log: str = "") -> str:
        return f'[[listeners]]\naddress = "127.0.0.1:{port}"\ndefault_backend = "web"\n{log}'

    head = f'workers = 1\n[access_log]\npath = "{top}"\nformat = "top %ft %HP"\n[backends.web]\nservers = ["{b[0].address}"]\n'
    mine = f'access_log = {{ path = "{own}", format = "own %ft %HP" }}\n'
    path.write_text(head + listener(ports[0]) + listener(ports[1], mine))

    async def run() -> None:
        async with LoadBalancer(load(path), config_path=path) as lb:
            for p in ports[:2]:
                assert (await asyncio.to_thread(get, p, "/size/1"))[0].startswith("HTTP/1.1 200")
            assert wait_lines(top, 1) == [f"top 127.0.0.1:{ports[0]} /size/1"]
            assert wait_lines(own, 1) == [f"own 127.0.0.1:{ports[1]} /size/1"]
            # the first listener goes, a third comes: the second keeps its own log
            path.write_text(head + listener(ports[1], mine) + listener(ports[2]))
            await lb.reload()
            for p in ports[1:]:
                assert (await asyncio.to_thread(get, p, "/size/2"))[0].startswith("HTTP/1.1 200")
            assert wait_lines(own, 2)[1] == f"own 127.0.0.1:{ports[1]} /size/2"
            assert wait_lines(top, 2)[1] == f"top 127.0.0.1:{ports[2]} /size/2"

    asyncio.run(run())


def open_by_this_process(path) -> bool:
    """Whether a descriptor of this process (the balancer runs in it) names ``path``."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def test_a_reload_adds_moves_and_removes_access_logs(tmp_path, backends, syslog_receiver):
    """Started without an access log: a reload adds one, another moves it to a new file (the old one
    is closed), another sends a listener's lines to a syslog server, and the last removes them all."""
    import asyncio

    b = backends(1)
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    rx = syslog_receiver()
    path = tmp_path / "balancer.toml"
    ports = [free_port(), free_port()]
    listeners = "".join(f'[[listeners]]\naddress = "127.0.0.1:{p}"\ndefault_backend = "web"\n{{own{i}}}'
                        for i, p in enumerate(ports))
    base = f'workers = 2\n{{top}}[backends.web]\nservers = ["{b[0].address}"]\n' + listeners

    def write(top: str = "", own0: str = "", own1: str = "") -> None:
        path.write_text(base.format(top=top, own0=own0, own1=own1))

    def top(log) -> str:
        return f'[access_log]\npath = "{log}"\nformat = "%ft %HP"\n'

    async def request(port: int, target: str) -> None:
        assert (await asyncio.to_thread(get, port, target))[0].startswith("HTTP/1.1 200")

    write()
    async def run() -> None:
        async with LoadBalancer(load(path), config_path=path) as lb:
            await request(ports[0], "/size/1")  # nothing logged anywhere
            write(top(first))
            await lb.reload()
            await request(ports[0], "/size/2")
            assert wait_lines(first, 1) == [f"127.0.0.1:{ports[0]} /size/2"]
            write(top(second))  # moved: the new file gets the lines, the old one is closed
            await lb.reload()
            await request(ports[1], "/size/3")
            assert wait_lines(second, 1) == [f"127.0.0.1:{ports[1]} /size/3"]
            deadline = time.monotonic() + 30
            while open_by_this_process(first):
                assert time.monotonic() < deadline, "the old access log stayed open"
                await asyncio.sleep(0.1)
            assert first.read_text().splitlines() == [f"127.0.0.1:{ports[0]} /size/2"]
            # one listener's lines to a syslog server named by the reload
            write(top(second), own1=f'access_log = {{ syslog = "{rx.address}", format = "%HP" }}\n')
            await lb.reload()
            await request(ports[1], "/size/4")
            await request(ports[0], "/size/5")
            (m,) = await asyncio.to_thread(rx.messages, 1)
            assert m.endswith(b": /size/4")
            assert wait_lines(second, 2)[1] == f"127.0.0.1:{ports[0]} /size/5"
            write()  # no access log at all
            await lb.reload()
            await request(ports[0], "/size/6")
            deadline = time.monotonic() + 30
            while open_by_this_process(second):
                assert time.monotonic() < deadline, "the access log stayed open"
                await asyncio.sleep(0.1)
            assert len(second.read_text().splitlines()) == 2
            assert lb.stats()["access_log_dropped"] == 0

    asyncio.run(run())


def test_a_log_destination_that_cannot_be_opened_changes_nothing(tmp_path, backends, proxy):
    """The new destination is opened before anything else changes: if it cannot be, the reload fails
    and the running configuration (backends and logs) stays."""
    b = backends(2)
    log = tmp_path / "access.log"
    lb = proxy([b[0]], workers=1, access_log={"path": str(log), "format": "%s"})
    port = lb.address[1]
    assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
    gone = tmp_path / "gone"
    gone.mkdir()
    new = lb_config([b[1]], workers=1, access_log={"path": str(gone / "x.log"), "format": "%s"})
    gone.rmdir()  # after the configuration was checked: only the data plane finds out
    with pytest.raises(BalancerConfigError, match="cannot open the access log"):
        lb.update(new)
    assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
    assert wait_lines(log, 2) == [b[0].address, b[0].address]  # still the first backend, still this file
