"""Binary upgrade: a new balancer process takes the listening sockets of the
running one over its handover socket, under load: nothing refused, nothing
failed, the new process serves, the old one finishes its request in flight
and exits 0. A takeover that cannot happen fails with one line, exit 2, and
leaves the running process serving."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from balancer_helpers import BackendProc, split_response, start_backend

from tests.netutil import free_port

pytestmark = [pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, generation: str, ports: list[int | str], backend: str, workers: int) -> Path:
    """Listeners on ``ports`` (or Unix socket paths) answering with X-Generation."""
    listeners = "".join(f'[[listeners]]\naddress = "{p if isinstance(p, str) else f"127.0.0.1:{p}"}"\n'
                        'default_backend = "main"\n'
                        f'response_headers = {{ set = {{ "X-Generation" = "{generation}" }} }}\n' for p in ports)
    path.write_text(f'workers = {workers}\n[backends.main]\nservers = ["{backend}"]\n{listeners}')
    return path


def start(config: Path, *flags: str, log: Path) -> subprocess.Popen:
    with log.open("w") as err:
        return subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", str(config), *flags],
                                cwd=ROOT, stderr=err, stdout=subprocess.DEVNULL)


def wait_until(cond, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} while waiting for {what}: {proc.args}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling another process's state: there is no event to await


def serves(port: int) -> bool:
    try:
        return get(port)[0].endswith("200 OK")
    except OSError:
        return False


def read_response(s: socket.socket) -> tuple[str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response" + (" (after a partial one)" if data else ""))
        data += chunk
    status, headers, body = split_response(data)
    while len(body) < int(headers["content-length"]):
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        body += chunk
    return status, headers, body


def get(port: int | str, path: str = "/whoami", timeout: float = 10) -> tuple[str, dict[str, str], bytes]:
    if isinstance(port, str):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(port)
    else:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    with s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return read_response(s)


class Load:
    """Requests in a loop: one thread with a new connection each, one on a
    keep-alive connection (opened again when the server closes it between
    requests, as any HTTP client does). Records who served each."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.served: list[tuple[str, str]] = []  # (client, generation)
        self.threads = [threading.Thread(target=self.fresh), threading.Thread(target=self.keep_alive)]
        for t in self.threads:
            t.start()

    def check(self, client: str, status: str, headers: dict[str, str], body: bytes) -> None:
        if not status.endswith("200 OK") or body != b"b0":
            self.failures.append(f"{client}: {status} {body[:80]!r}")
        self.served.append((client, headers.get("x-generation", "?")))

    def fresh(self) -> None:
        while not self.stop.is_set():
            try:
                self.check("fresh", *get(self.port))
            except Exception as exc:  # every failure is reported by the test
                self.failures.append(f"new connection: {exc!r}")

    def keep_alive(self) -> None:
        s: socket.socket | None = None
        try:
            while not self.stop.is_set():
                reused = s is not None
                if s is None:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                try:
                    s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\n\r\n")
                    status, headers, body = read_response(s)
                except (ConnectionError, BrokenPipeError) as exc:
                    # an idle keep-alive connection closed by the server as the request went out: retried
                    # on a new connection (RFC 9112 9.3.1), but only if no byte of a response came
                    s.close()
                    s = None
                    if reused and "partial" not in str(exc) and "body" not in str(exc):
                        continue
                    raise
                self.check("keep-alive", status, headers, body)
                if headers.get("connection", "").lower() == "close":
                    s.close()
                    s = None
        except Exception as exc:
            self.failures.append(f"keep-alive: {exc!r}")
        finally:
            if s is not None:
                s.close()

    def count(self, generation: str) -> dict[str, int]:
        out = {"fresh": 0, "keep-alive": 0}
        for client, gen in list(self.served):
            if gen == generation:
                out[client] += 1
        return out

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=20)


@pytest.fixture()
def backend():
    b = start_backend("b0")
    yield b
    b.kill()


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def test_takeover_under_load(tmp_path: Path, backend: BackendProc) -> None:
    port, only_old, only_new = free_port(), free_port(), free_port()
    sock = str(tmp_path / "handover.sock")
    unix = str(tmp_path / "lb.sock")
    a = start(write_config(tmp_path / "a.toml", "a", [port, only_old, f"unix:{unix}"], backend.address, workers=2),
              "--handover-socket", sock, log=tmp_path / "a.log")
    b = None
    load = None
    try:
        wait_until(lambda: os.path.exists(sock) and serves(port), 20, a, "the first balancer")
        assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
        load = Load(port)
        wait_until(lambda: min(load.count("a").values()) >= 20 or load.failures, 20, what="load on the first")
        # a slow request in flight on the old process across the switch
        slow_result: list[object] = []
        slow_sent = threading.Event()

        def slow() -> None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                    s.sendall(b"GET /slow?ms=1500 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    slow_sent.set()
                    slow_result.append(read_response(s))
            except Exception as exc:
                slow_result.append(exc)

        slow_thread = threading.Thread(target=slow)
        slow_thread.start()
        assert slow_sent.wait(10)
        # the old process has taken it: it reached the backend (else the new one could accept it)
        wait_until(lambda: urllib.request.urlopen(f"http://{backend.address}/slow-begun", timeout=5).read() == b"1",
                   10, a, "the slow request at the backend")
        b = start(write_config(tmp_path / "b.toml", "b", [port, only_new, f"unix:{unix}"], backend.address,
                               workers=3),
                  "--takeover", sock, "--handover-socket", sock, log=tmp_path / "b.log")
        # the new process serves, on the kept listener and on its new one; the old one finishes and exits 0
        wait_until(lambda: min(load.count("b").values()) >= 20 or load.failures, 30, b, "load on the new")
        assert serves(only_new)
        assert a.wait(timeout=30) == 0, (tmp_path / "a.log").read_text()
        slow_thread.join(timeout=20)
        assert len(slow_result) == 1 and not isinstance(slow_result[0], Exception), slow_result
        status, headers, _ = slow_result[0]  # type: ignore[misc]
        assert status.endswith("200 OK") and headers["x-generation"] == "a"
        before = load.count("b")
        wait_until(lambda: load.count("b")["fresh"] > before["fresh"] + 10 or load.failures, 20,
                   what="load after the old process exited")
        load.close()
        assert not load.failures, load.failures[:5]
        # the old process's other listener went with it; the new one keeps a handover socket for the next upgrade
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", only_old), timeout=5).close()
        assert os.path.exists(sock)
        assert get(unix)[1]["x-generation"] == "b"  # the Unix socket too, its file left in place by the old process
        assert "took over the listeners" in (tmp_path / "b.log").read_text()
        assert stop(b) == 0
    finally:
        if load is not None:
            load.close()
        for p in (a, b):
            if p is not None:
                stop(p)


def test_takeover_that_cannot_happen_leaves_the_old_process_serving(tmp_path: Path, backend: BackendProc) -> None:
    port, busy = free_port(), free_port()
    sock = str(tmp_path / "handover.sock")
    a = start(write_config(tmp_path / "a.toml", "a", [port], backend.address, workers=1),
              "--handover-socket", sock, log=tmp_path / "a.log")
    blocker = socket.create_server(("127.0.0.1", busy))
    try:
        wait_until(lambda: os.path.exists(sock) and serves(port), 20, a, "the first balancer")
        # garbage on the handover socket: an error answer, and the process goes on
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as g:
            g.settimeout(10)
            g.connect(sock)
            g.send(b"\xff\x00 not json")
            assert b"error" in g.recv(4096)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as g:
            g.settimeout(10)
            g.connect(sock)
            g.send(b'{"op": "drain"}')  # without having taken the listeners: refused, nothing drains
            assert b"error" in g.recv(4096)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as g:
            g.connect(sock)  # and gone at once
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as g, pytest.raises(OSError):
            g.connect(sock)  # the wrong kind of socket
        assert serves(port)
        # a listener the new configuration adds on a busy port: exit 2, one line, the old one untouched
        cfg = write_config(tmp_path / "b.toml", "b", [port, busy], backend.address, workers=1)
        b = subprocess.run([sys.executable, "-m", "cli", "balancer", "--config", str(cfg), "--takeover", sock],
                           cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
        assert b.returncode == 2, b.stderr
        assert b.stderr.strip().splitlines()[-1] == \
            f"juggler balancer: cannot listen on 127.0.0.1:{busy}: address already in use"
        assert get(port)[1]["x-generation"] == "a" and a.poll() is None
        # no process at that path: a clear line, exit 2
        b = subprocess.run([sys.executable, "-m", "cli", "balancer", "--config", str(cfg), "--takeover",
                            str(tmp_path / "missing.sock")], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
        assert b.returncode == 2
        assert b.stderr.strip() == (f"juggler balancer: cannot take over from {tmp_path / 'missing.sock'}: "
                                    "no such socket (is the running balancer started with handover_socket?)")
        # a path that is not a socket, or a socket that is not a handover socket: the same
        stream = socket.socket(socket.AF_UNIX)
        stream.bind(str(tmp_path / "stream.sock"))
        stream.listen()
        for path, why in ((cfg, "not a socket"), (tmp_path / "stream.sock", "not a balancer's handover socket")):
            b = subprocess.run([sys.executable, "-m", "cli", "balancer", "--config", str(cfg), "--takeover", str(path)],
                               cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
            assert (b.returncode, b.stderr.strip()) == (2, f"juggler balancer: cannot take over from {path}: {why}")
        stream.close()
        # and after all that, a takeover still works
        cfg = write_config(tmp_path / "c.toml", "c", [port], backend.address, workers=1)
        c = start(cfg, "--takeover", sock, log=tmp_path / "c.log")
        try:
            assert a.wait(timeout=30) == 0
            assert get(port)[1]["x-generation"] == "c"
        finally:
            assert stop(c) == 0
    finally:
        blocker.close()
        stop(a)


def test_takeover_of_https_and_its_redirect_listener(tmp_path: Path, backend: BackendProc, pki) -> None:
    import ssl

    leaf = pki.leaf("localhost", "127.0.0.1")
    port, redirect = free_port(), free_port()
    sock = str(tmp_path / "handover.sock")
    cfg = tmp_path / "lb.toml"
    cfg.write_text(f'listen = "127.0.0.1:{port}"\nworkers = 1\nbackends = ["{backend.address}"]\n'
                   f'[tls]\nredirect = "127.0.0.1:{redirect}"\n'
                   f'[[tls.certificates]]\ncert = "{leaf.cert}"\nkey = "{leaf.key}"\n')
    ctx = ssl.create_default_context(cafile=str(pki.ca))

    def https_ok() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                    ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return read_response(s)[2] == b"b0"
        except OSError:
            return False

    a = start(cfg, "--handover-socket", sock, log=tmp_path / "a.log")
    b = None
    try:
        wait_until(lambda: os.path.exists(sock) and https_ok(), 20, a, "the first balancer")
        b = start(cfg, "--takeover", sock, log=tmp_path / "b.log")
        assert a.wait(timeout=30) == 0, (tmp_path / "a.log").read_text()
        assert b.poll() is None, (tmp_path / "b.log").read_text()
        assert https_ok()
        status, headers, _ = get(redirect, "/x")
        assert status.endswith("308 Permanent Redirect") and headers["location"] == f"https://x:{port}/x"
        assert stop(b) == 0
    finally:
        for p in (a, b):
            if p is not None:
                stop(p)


#: run as another user: connect to the handover socket, ask for the listeners, say what came back
OTHER_UID_PEER = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print(json.dumps({"connect": "permission denied"}))
    sys.exit(0)
s.send(b'{"op": "listeners"}')
msg, fds, _, _ = socket.recv_fds(s, 65536, 64)
print(json.dumps({"connect": "ok", "answer": msg.decode(), "fds": len(fds)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a peer as another user")
def test_a_process_of_another_user_gets_no_listeners(tmp_path: Path, backend: BackendProc) -> None:
    """The socket's mode (0600) keeps other users from connecting; a socket
    made reachable anyway (its mode changed) still refuses them by their
    SO_PEERCRED uid, sending no descriptors; the balancer goes on serving."""
    import json
    import tempfile

    port = free_port()
    shared = Path(tempfile.mkdtemp(prefix="handover-"))
    shared.chmod(0o755)  # reachable by any user: only the socket's own mode and the uid check guard it
    sock = shared / "handover.sock"
    a = start(write_config(tmp_path / "a.toml", "a", [port], backend.address, workers=1),
              "--handover-socket", str(sock), log=tmp_path / "a.log")

    def as_nobody() -> dict[str, object]:
        out = subprocess.run(["/usr/bin/python3", "-c", OTHER_UID_PEER, str(sock)], user=65534, group=65534,
                             extra_groups=[], capture_output=True, text=True, timeout=30, check=False)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    try:
        wait_until(lambda: sock.exists() and serves(port), 20, a, "the first balancer")
        assert sock.stat().st_mode & 0o777 == 0o600
        assert as_nobody() == {"connect": "permission denied"}
        sock.chmod(0o666)
        got = as_nobody()
        assert got["connect"] == "ok" and got["fds"] == 0, got
        assert "permission denied: only the balancer's own user may take over" in str(got["answer"])
        assert serves(port) and a.poll() is None
        assert "refused a process of uid 65534" in (tmp_path / "a.log").read_text()
    finally:
        stop(a)
        sock.unlink(missing_ok=True)
        shared.rmdir()
