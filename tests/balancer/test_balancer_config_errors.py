"""Config errors name the file and the line (balancer/config_errors.py): real
``juggler balancer --config FILE`` processes, at start and on reload."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from balancer.config_errors import key_lines
from tests.netutil import free_port, wait_for_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
L = 'listen = "127.0.0.1:1"\n'

# (name, file, line, words the message must contain)
BAD = [
    ("send_proxy on an h2 pool", L + 'proto = "h2"\nsend_proxy = "v1"\n', 3, ["send_proxy", "proto = \"h1\""]),
    ("unknown top-level key", L + "workers = 2\nbogus = 1\n", 3, ["bogus"]),
    ("wrong type", L + "\n# two workers\nworkers = \"two\"\n", 4, ["workers", "expected an integer"]),
    ("unknown algorithm", L + "retries = 1\nalgorithm = \"fastest\"\n", 3, ["algorithm", "fastest"]),
    ("duplicate backend", L + '[[backends]]\naddress = "127.0.0.1:5"\n[[backends]]\naddress = "127.0.0.1:6"\n'
     '[[backends]]\naddress = "127.0.0.1:5"\n', 6, ["backends[2]", "listed twice"]),
    ("duplicate in an array", L + 'backends = [\n  "127.0.0.1:5",\n  "127.0.0.1:6", "127.0.0.1:5",\n]\n', 4,
     ["backends[2]", "listed twice"]),
    ("bad weight", L + '[[backends]]\naddress = "127.0.0.1:5"\n\n[[backends]]\naddress = "127.0.0.1:6"\n'
     'weight = -1\n', 7, ["weight", "127.0.0.1:6"]),
    ("misspelt key in a table", L + "[timeouts]\nconnect = 1\nconect = 2\n", 4, ["conect", "[timeouts]"]),
    ("zero response timeout", L + "[timeouts]\nconnect = 1\nresponse = 0\n", 4, ["timeouts.response"]),
    ("health path", L + '[health]\ninterval = 1\npath = "x"\n', 4, ["health.path"]),
    ("grpc check on an h1 pool", L + '[health]\ninterval = 1\ntype = "grpc"\n', 4, ["health.type", "proto = \"h2\""]),
    ("grpc check of an h1 pool", L + '[backends.api]\nservers = ["127.0.0.1:5"]\n[backends.api.health]\n'
     'interval = 1\ntype = "grpc"\n', 6, ["backends.api.health.type", "proto = \"h2\""]),
    ("pool's health type", L + '[backends.api]\nservers = ["127.0.0.1:5"]\nproto = "h2"\n[backends.api.health]\n'
     'interval = 1\ntype = "tcp"\n', 7, ["backends.api.health.type", "tcp"]),
    ("path of a grpc check", L + 'proto = "h2"\n[health]\ntype = "grpc"\npath = "/health"\n', 5,
     ["health.path", "grpc_service"]),
    ("listen", "# the front\nlisten = \"nowhere\"\n", 2, ["listen", "HOST:PORT"]),
    ("backend without address", L + "[[backends]]\nweight = 2\n", 2, ["backends[0]", "address"]),
    ("dns nameserver", L + '[dns]\ninterval = 5\nnameservers = ["1.1.1.1", "bad"]\n', 4, ["dns.nameservers", "bad"]),
    ("quoted key", L + '"hash_key" = "cookie"  # not a key the balancer knows\n', 2, ["hash_key", "cookie"]),
    ("after a multi-line string", L + 'x = """\n[limits]\n"""\n', 2, ["unknown top-level", "x"]),
    ("limits", L + '[limits]\nmax_header_bytes = 10\n', 3, ["limits.max_header_bytes", "8192"]),
    ("dotted key", L + "timeouts.connect = -1\n", 2, ["connect", ">= 0"]),
    ("invalid TOML", L + "workers = = 2\n", 2, ["invalid TOML"]),
    ("a pool's passive table", L + '[backends.web]\nservers = ["127.0.0.1:5"]\n[backends.web.passive]\n'
     'on_error = "markdown"\n', 5, ["backends.web.passive.on_error", "markdown"]),
    ("a pool's rate limit", L + '[backends.web]\nservers = ["127.0.0.1:5"]\n[backends.web.rate_limit]\n'
     'rate = "fast"\n', 5, ["backends.web.rate_limit.rate", "fast"]),
    ("mark-down without health checks", L + '[passive]\neject_after = 2\non_error = "mark-down"\n', 4,
     ["passive.on_error", "health checks"]),
    ("a route of the second listener", '[backends.web]\nservers = ["127.0.0.1:5"]\n'
     + '[[listeners]]\naddress = "127.0.0.1:1"\ndefault_backend = "web"\n[[listeners.routes]]\npath = "/a"\n'
       'backend = "web"\n'
     + '[[listeners]]\naddress = "127.0.0.1:2"\ndefault_backend = "web"\n[[listeners.routes]]\npath = "/b"\n'
       'backend = "web"\n[[listeners.routes]]\npath = "c"\nbackend = "web"\n', 15,
     ["listeners[1].routes[1]", "must start with /"]),
    ("unknown key in a route's table", L + '[backends.web]\nservers = ["127.0.0.1:5"]\n[[routes]]\npath = "/a"\n'
     'redirect = { location = "/b", cod = 301 }\n', 6, ["routes[0].redirect", "cod"]),
    ("a route's rate limit", L + '[backends.web]\nservers = ["127.0.0.1:5"]\n[[routes]]\npath = "/a"\n'
     'backend = "web"\n[[routes]]\npath = "/b"\nbackend = "web"\n[routes.rate_limit]\nrate = "1/s"\n'
     'burst = -1\n', 12, ["routes[1].rate_limit.burst"]),
]


def run_cli(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", "balancer", "--config", path, "--log-level", "WARNING"],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_bad_files_exit_2_with_one_line_naming_file_line_and_key(tmp_path):
    paths = []
    for i, (_, text, _, _) in enumerate(BAD):
        (tmp_path / str(i)).mkdir()
        p = tmp_path / str(i) / "balancer.toml"
        p.write_text(text)
        paths.append(str(p))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run_cli, paths))
    for (name, _, line, words), path, r in zip(BAD, paths, results):
        assert r.returncode == 2, (name, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (name, r.stderr)
        assert lines[0].startswith(f"juggler balancer: {path}:{line}: "), (name, lines[0])
        for w in words:
            assert w in lines[0], (name, w, lines[0])
        assert "Traceback" not in r.stderr


def test_key_lines_index():
    text = ('a = 1\n[t]\nb = """\nc = 2\n"""\nd.e = [\n  1,\n  { f = 2 }, 3 # ]\n]\n'
            '[[arr]]\ng = \'x = "\'\n[[arr]]\n"h.i" = 1\n[t.u]\nj = 2\n')
    lines = key_lines(text)
    assert lines[("a",)] == 1 and lines[("t",)] == 2 and lines[("t", "b")] == 3
    assert ("t", "c") not in lines  # inside a multi-line string
    assert lines[("t", "d", "e")] == 6
    assert [lines[("t", "d", "e", i)] for i in range(3)] == [7, 8, 8]
    assert lines[("arr", 0)] == 10 and lines[("arr", 0, "g")] == 11 and lines[("arr", 1)] == 12
    assert lines[("arr", 1, "h.i")] == 13 and lines[("t", "u", "j")] == 15


def http(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_a_bad_file_on_reload_keeps_the_running_config_and_says_where(tmp_path, backends):
    b = backends(2)
    port, admin = free_port(), free_port()
    path = tmp_path / "balancer.toml"
    good = f'listen = "127.0.0.1:{port}"\nadmin = "127.0.0.1:{admin}"\nworkers = 1\nbackends = ["{b[0].address}"]\n'
    path.write_text(good)
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", str(path), "--log-level", "INFO"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(admin, 20, proc)
        bad = good.replace("workers = 1", 'workers = 1\nalgorithm = "fastest"')
        path.write_text(bad)
        status, body = http(admin, "/reload", "POST")
        expected = f"{path}:4: algorithm must be one of"
        assert status == 400 and json.loads(body)["error"].startswith(expected)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while True:  # the log line of the rejected reload
            line = proc.stderr.readline()
            assert line and time.monotonic() < deadline, "no log line for the rejected reload"
            if "reload rejected" in line:
                assert expected in line
                break
        assert http(port, "/whoami") == (200, b"b0")
        assert json.loads(http(admin, "/config")[1])["algorithm"] == "round_robin"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize("text", ["[[backends]]\n", "listen = 1\n", "listen = \"127.0.0.1:1\"\n[dns]\n[dns]\n"])
def test_odd_files_still_give_one_line(tmp_path, text):
    p = tmp_path / "balancer.toml"
    p.write_text(text)
    r = run_cli(str(p))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
