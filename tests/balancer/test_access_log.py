"""Access logs: one line per request on every path, their variables, JSON,
escaping, reopening on SIGHUP, drops when the writer falls behind, the CLI
flags and the errors of bad formats. Real balancers, backends and sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from balancer_helpers import lb_config, raw_exchange, split_response
from tests.netutil import free_port, wait_for_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

pytestmark = pytest.mark.timeout(120)


def wait_lines(path, n: int, timeout: float = 15.0) -> list[str]:
    """The file's lines once it has at least ``n`` (the workers hand lines to
    the writer every housekeeping tick)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, "rb") as f:
                lines = f.read().decode("utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        if len(lines) >= n:
            return lines
        assert time.monotonic() < deadline, f"{len(lines)} line(s) of {n}: {lines}"
        time.sleep(0.02)


def get(port: int, path: str, headers: str = "") -> tuple[str, dict[str, str], bytes]:
    raw = raw_exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode())
    return split_response(raw)


def test_each_variable_on_the_fast_path(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    fmt = ("%ci|%cp|%tr|%[time.iso]|%ft|%b|%s|%HM|%HP|%HQ|%HV|%r|%ST|%B|%U|%TR|%Tw|%Tc|%Tr|%Ta|%rc|%ID|"
           "%[req.hdr(User-Agent)]|%[res.hdr(Content-Length)]|%tsc|%ts")
    lb = proxy(b, timeouts={"header": 0.4}, access_log={"path": str(log), "format": fmt},
               listeners=[{"address": "127.0.0.1:0", "default_backend": "default",
                           "request_id": {"header": "X-Request-ID"}}])
    port = lb.address[1]
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /size/5?x=1&y=2 HTTP/1.1\r\nHost: x\r\nUser-Agent: tester/1\r\n"
                  b"X-Request-ID: req-42\r\nConnection: close\r\n\r\n")
        client_port = s.getsockname()[1]
        assert s.recv(1 << 16).startswith(b"HTTP/1.1 200")
    (line,) = wait_lines(log, 1)
    f = line.split("|")
    assert f[0] == "127.0.0.1" and f[1] == str(client_port)
    assert time.strptime(f[2][:20], "%d/%b/%Y:%H:%M:%S") and f[3].endswith("Z") and "T" in f[3]
    assert f[4] == f"127.0.0.1:{port}" and f[5] == "default" and f[6] == b[0].address
    assert f[7:11] == ["GET", "/size/5", "?x=1&y=2", "HTTP/1.1"]
    assert f[11] == "GET /size/5?x=1&y=2 HTTP/1.1"
    assert f[12:15] == ["200", "5", "0"]
    timings = [int(x) for x in f[15:20]]
    assert all(t >= 0 for t in timings) and timings[4] >= timings[3]
    assert f[20] == "0" and f[21] == "req-42"
    assert f[22] == "tester/1" and f[23] == "5"
    assert f[24] == "----" and f[25] == "--"


def test_one_line_per_request_on_both_paths_and_own_errors(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, timeouts={"header": 0.4},
               access_log={"path": str(log), "format": "%HM %HP %ST %ts %b/%s %U"})
    port = lb.address[1]
    # fast path, keep-alive: two requests on one connection
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(2):
            s.sendall(b"GET /size/3 HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"\x00\x01\x02"):
                got += s.recv(4096)
    # hyper's path: a chunked request body
    raw = raw_exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                             b"Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert split_response(raw)[0].startswith("HTTP/1.1 200")
    # the balancer's own 400 (framing two parsers could read differently)
    raw = raw_exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\nabc")
    assert raw.startswith(b"HTTP/1.1 400")
    # 503: no backend up
    lb.set_backend_state(b[0].address, "down")
    assert get(port, "/whoami")[0].startswith("HTTP/1.1 503")
    lines = wait_lines(log, 5)
    assert len(lines) == 5, lines
    assert lines[0] == lines[1] == f"GET /size/3 200 -- default/{b[0].address} 0"
    assert lines[2] == f"POST /echo 200 -- default/{b[0].address} 3"
    assert lines[3] == "- - 400 PR -/- 0"
    assert lines[4] == "GET /whoami 503 SC default/- 0"


def test_502_504_and_redirects(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    dead = f"127.0.0.1:{free_port()}"
    lb = proxy([], workers=1, timeouts={"header": 0.4, "response": 0.3}, retries=0,
               access_log={"path": str(log), "format": "%HP %ST %ts %s"},
               listeners=[{"address": "127.0.0.1:0", "default_backend": "live",
                           "routes": [{"path_prefix": ["/dead"], "backend": "dead"},
                                      {"path_prefix": ["/old"], "redirect": {"location": "/new", "code": 301}}]}],
               backends={"live": {"servers": [b[0].address]}, "dead": {"servers": [dead]}})
    port = lb.address[1]
    assert get(port, "/dead")[0].startswith("HTTP/1.1 502")
    assert get(port, "/slow?ms=2000")[0].startswith("HTTP/1.1 504")
    assert get(port, "/old")[0].startswith("HTTP/1.1 301")
    lines = wait_lines(log, 3)
    assert lines == [f"/dead 502 SC {dead}", f"/slow 504 sH {b[0].address}", "/old 301 LR -"]


def test_websocket_line_when_the_upgraded_connection_ends(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, timeouts={"header": 0.4}, access_log={"path": str(log), "format": "%HP %ST %B %U"})
    with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=10) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        s.sendall(b"hello")
        echoed = head.partition(b"\r\n\r\n")[2]
        while len(echoed) < 5:
            echoed += s.recv(4096)
        assert echoed == b"hello"
    assert wait_lines(log, 1) == ["/ws 101 5 5"]


def test_json_lines_and_escaping(tmp_path, backends, proxy):
    b = backends(1)
    log, text = tmp_path / "access.json", tmp_path / "access.log"
    lb_json = proxy(b, timeouts={"header": 0.4}, access_log={"path": str(log), "format": "json"})
    lb_text = proxy(b, timeouts={"header": 0.4}, access_log={"path": str(text), "format": '"%[req.hdr(X-Odd)]" %HQ'})
    odd = b'a"b\\c\td\xffe'
    for lb in (lb_json, lb_text):
        raw = raw_exchange(lb.address[1], b"GET /size/1?q=%22%0a HTTP/1.1\r\nHost: x\r\nX-Odd: " + odd +
                           b"\r\nConnection: close\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 200")
    (line,) = wait_lines(log, 1)
    rec = json.loads(line)
    assert rec["status"] == 200 and rec["method"] == "GET" and rec["path"] == "/size/1"
    assert rec["query"] == "?q=%22%0a" and rec["server"] == b[0].address and rec["termination"] == "--"
    assert isinstance(rec["time_total_ms"], int) and rec["time"].endswith("Z")
    (tline,) = wait_lines(text, 1)
    # quotes, backslashes, control and non-UTF-8 bytes escaped: one line, quotes balanced
    assert tline == '"a\\x22b\\x5cc\\x09d\\xffe" ?q=%22%0a'


def start_cli(*args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--log-level", "WARNING", *args],
                            cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.stderr.close()
    if proc.stdout is not None:
        proc.stdout.close()


def test_cli_flags_json_and_reopen_after_rename_on_sighup(tmp_path, backends):
    b = backends(1)
    port, admin = free_port(), free_port()
    log = tmp_path / "access.log"
    proc = start_cli("--listen", f"127.0.0.1:{port}", "--backends", b[0].address, "--workers", "1",
                     "--metrics-port", str(admin), "--access-log", str(log), "--log-format", "json")
    try:
        wait_for_port(admin, 20, proc)
        assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
        assert json.loads(wait_lines(log, 1)[0])["path"] == "/whoami"
        os.rename(log, tmp_path / "access.log.1")  # logrotate
        proc.send_signal(signal.SIGHUP)
        # the reopen happens when the writer next runs: requests until the new file has a line
        deadline = time.monotonic() + 20
        while not log.exists() or not log.read_text():
            assert time.monotonic() < deadline, "the log was not reopened"
            assert get(port, "/after")[0]
            time.sleep(0.05)
        assert json.loads(wait_lines(log, 1)[0])["path"] == "/after"
        assert all(json.loads(x)["path"] in ("/whoami", "/after")
                   for x in wait_lines(tmp_path / "access.log.1", 1))
    finally:
        stop(proc)


def test_a_stopped_writer_drops_lines_and_requests_go_on(backends):
    b = backends(1)
    port, admin = free_port(), free_port()
    # standard output is a pipe nobody reads: the writer blocks once it is full
    proc = start_cli("--listen", f"127.0.0.1:{port}", "--backends", b[0].address, "--workers", "1",
                     "--metrics-port", str(admin), "--access-log", "-", "--log-format", "%HP " + "x" * 4000,
                     stdout=subprocess.PIPE)
    try:
        wait_for_port(admin, 20, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            for _ in range(3000):
                s.sendall(b"GET /size/1 HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while not got.endswith(b"\r\n\r\n\x00"):
                    got += s.recv(4096)
                assert got.startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + 20
        while True:
            metrics = raw_exchange(admin, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            dropped = [float(x.split()[1]) for x in metrics.decode().splitlines()
                       if x.startswith("balancer_access_log_dropped_total ")]
            if dropped and dropped[0] > 0:
                break
            assert time.monotonic() < deadline, metrics.decode()[-2000:]
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
        proc.stdout.close()


@pytest.mark.parametrize(("fmt", "message"), [
    ("%ci %zz", "unknown variable %zz"),
    ("%[req.hdr(User-Agent)", "unbalanced '['"),
    ("%[nope]", "unknown variable %[nope]"),
])
def test_bad_formats_exit_2_naming_file_and_line(tmp_path, fmt, message):
    path = tmp_path / "lb.toml"
    path.write_text(f'listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:1"]\n\n[access_log]\npath = "{tmp_path}/a.log"\n'
                    f'format = "{fmt}"\n')
    proc = subprocess.run([sys.executable, "-m", "cli", "balancer", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{path}:6:" in proc.stderr and message in proc.stderr and "Traceback" not in proc.stderr


def test_unwritable_path_and_flag_errors(tmp_path):
    from cli.main import main

    path = tmp_path / "lb.toml"
    path.write_text('listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:1"]\n[access_log]\n'
                    'path = "/nonexistent-dir/a.log"\n')
    proc = subprocess.run([sys.executable, "-m", "cli", "balancer", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"{path}:4:" in proc.stderr and "no such directory" in proc.stderr
    assert main(["balancer", "--listen", "127.0.0.1:0", "--backends", "127.0.0.1:1", "--log-format", "json"]) == 2
    assert main(["balancer", "--listen", "127.0.0.1:0", "--backends", "127.0.0.1:1",
                 "--access-log", str(tmp_path / "a.log"), "--log-format", "%bad"]) == 2


def test_requests_hyper_refuses_itself_get_a_line(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, timeouts={"header": 0.4}, limits={"max_header_bytes": 8192},
               access_log={"path": str(log), "format": "%ST %ts \"%r\""})
    port = lb.address[1]
    # a head over max_header_bytes: hyper's 431
    raw = raw_exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 431")
    # a request line no parser accepts: 400
    raw = raw_exchange(port, b"GET / HTTP/1.1 extra\r\nHost: x\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400")
    assert wait_lines(log, 2) == ['431 PR "<BADREQ>"', '400 PR "<BADREQ>"']


def test_https_http1_and_http2_requests_get_a_line(tmp_path, backends, proxy, pki):
    import shutil
    import ssl

    b = backends(1)
    leaf = pki.leaf("localhost", "127.0.0.1")
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, timeouts={"header": 0.4},
               tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]},
               access_log={"path": str(log), "format": "%HV %HP %ST %b/%s"})
    port = lb.address[1]
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /whoami HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            got = b""
            while data := s.recv(4096):
                got += data
    assert got.startswith(b"HTTP/1.1 200")
    expected = [f"HTTP/1.1 /whoami 200 default/{b[0].address}"]
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-s", "--http2", "--cacert", str(pki.ca), "--resolve",
                              f"localhost:{port}:127.0.0.1", f"https://localhost:{port}/size/2"],
                             capture_output=True, timeout=30)
        assert out.returncode == 0 and out.stdout == b"\x00\x01"
        expected.append(f"HTTP/2.0 /size/2 200 default/{b[0].address}")
    assert wait_lines(log, len(expected)) == expected


def test_the_last_lines_are_written_before_the_process_exits(tmp_path, backends):
    b = backends(1)
    port, admin = free_port(), free_port()
    log = tmp_path / "access.log"
    proc = start_cli("--listen", f"127.0.0.1:{port}", "--backends", b[0].address, "--workers", "1",
                     "--metrics-port", str(admin), "--access-log", str(log), "--log-format", "%HP %ST")
    try:
        wait_for_port(admin, 20, proc)
        assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert log.read_text() == "/whoami 200\n"  # no waiting: written before the exit
    finally:
        stop(proc)


def test_a_reload_changes_the_format_and_a_bad_one_keeps_the_old(tmp_path, backends, proxy):
    import rustext

    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, timeouts={"header": 0.4}, access_log={"path": str(log), "format": "old %HP"})
    port = lb.address[1]
    assert get(port, "/whoami")[0].startswith("HTTP/1.1 200")
    assert wait_lines(log, 1) == ["old /whoami"]
    with pytest.raises(rustext.BalancerConfigError, match="unknown variable %nope"):
        lb.update(lb_config(b, access_log={"path": str(log), "format": "%nope"}))
    lb.update(lb_config(b, access_log={"path": str(log), "format": "new %HP %ST"}))
    assert get(port, "/size/1")[0].startswith("HTTP/1.1 200")
    assert wait_lines(log, 2) == ["old /whoami", "new /size/1 200"]


def test_the_https_redirect_listener_logs_its_answers(tmp_path, backends, proxy, pki):
    b = backends(1)
    leaf = pki.leaf("localhost", "127.0.0.1")
    log = tmp_path / "access.log"
    lb = proxy(b, workers=1, timeouts={"header": 0.4},
               tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}], "redirect": "127.0.0.1:0"},
               access_log={"path": str(log), "format": "%ft %HP %ST %ts %[res.hdr(Location)]"})
    rport = lb.redirect_address[1]
    status, headers, _ = split_response(raw_exchange(rport, b"GET /p?q=1 HTTP/1.1\r\nHost: localhost\r\n"
                                                            b"Connection: close\r\n\r\n"))
    assert status.startswith("HTTP/1.1 308")
    assert wait_lines(log, 1) == [f"127.0.0.1:{rport} /p 308 LR {headers['location']}"]
