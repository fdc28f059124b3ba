"""Authentication of the admin endpoint (balancer/auth.py, balancer/admin.py):
hostile requests against a real endpoint, the happy paths, the config, the CLI."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import bcrypt
import pytest

from balancer import BalancerConfig, BalancerConfigError
from balancer.auth import AdminAuth, Authenticator
from balancer.config import BackendConfig, from_dict
from balancer.runner import BalancerProcess
from tests.netutil import free_port, wait_for_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
TOKEN = "t0ken-of-twenty-chars"


def user(name: str, password: str, rounds: int = 4) -> str:
    return f"{name}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()}"


def basic(name: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()


def request(port: int, path: str, method: str = "GET", authorization: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        h = dict(headers or {})
        if authorization is not None:
            h["Authorization"] = authorization
        c.request(method, path, headers=h)
        r = c.getresponse()
        return r.status, r.headers, r.read()
    finally:
        c.close()


@pytest.fixture
async def admin(backends, tmp_path):
    b = backends(1)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    cfg = BalancerConfig(
        listen="127.0.0.1:0", workers=1, admin=f"127.0.0.1:{port}", backends=(BackendConfig(address=b[0].address),),
        admin_auth=AdminAuth(users=(user("alice", "wonderland"), user("bob", "p\u00e4ss:w\u00f6rd")),
                             token_file=str(token_file), public=("/metrics",)))
    async with BalancerProcess(cfg) as process:
        yield port, process


HOSTILE = [
    ("no header", None),
    ("empty", ""),
    ("wrong scheme", "Digest username=\"alice\""),
    ("scheme only", "Basic"),
    ("malformed base64", "Basic !!!not-base64!!!"),
    ("base64 with junk", "Basic " + base64.b64encode(b"alice:wonderland").decode() + "*"),
    ("no colon", "Basic " + base64.b64encode(b"alicewonderland").decode()),
    ("not UTF-8", "Basic " + base64.b64encode(b"alice:\xff\xfe").decode()),
    ("wrong password", basic("alice", "wonderlanD")),
    ("empty password", basic("alice", "")),
    ("unknown user", basic("mallory", "wonderland")),
    ("user of another's password", basic("bob", "wonderland")),
    ("over 72 bytes", basic("alice", "wonderland" + "x" * 100)),
    ("NUL in password", basic("alice", "wonder\0land")),
    ("wrong token", "Bearer " + TOKEN[:-1] + "X"),
    ("token prefix", "Bearer " + TOKEN[:-1]),
    ("token as basic", "Basic " + base64.b64encode(TOKEN.encode()).decode()),
    ("password as bearer", "Bearer wonderland"),
    ("huge header", "Basic " + "A" * 6000),
]


@pytest.mark.parametrize(("name", "authorization"), HOSTILE, ids=[n for n, _ in HOSTILE])
async def test_hostile_credentials_get_401_with_challenges(admin, name, authorization):
    port, _ = admin
    for method, path in (("GET", "/backends"), ("POST", "/reload"), ("GET", "/nope")):
        status, headers, body = await asyncio.to_thread(request, port, path, method, authorization)
        assert status == 401, (name, path)
        assert json.loads(body) == {"error": "authentication required"}
        assert headers.get_all("WWW-Authenticate") == [
            'Basic realm="juggler balancer", charset="UTF-8"', 'Bearer realm="juggler balancer"']


async def test_header_too_large_for_the_server_is_refused(admin):
    port, _ = admin
    status, _, _ = await asyncio.to_thread(request, port, "/backends", "GET", "Basic " + "A" * 20000)
    assert status in (400, 431)


async def test_valid_credentials_and_public_paths(admin, backends):
    port, process = admin
    for auth in (basic("alice", "wonderland"), basic("bob", "p\u00e4ss:w\u00f6rd"), "Bearer " + TOKEN,
                 "bearer " + TOKEN, "BASIC " + basic("alice", "wonderland")[6:]):
        status, _, body = await asyncio.to_thread(request, port, "/backends", "GET", auth)
        assert status == 200, auth
    status, _, body = await asyncio.to_thread(request, port, "/metrics")
    assert status == 200 and b"balancer_requests_total" in body
    assert (await asyncio.to_thread(request, port, "/healthz"))[0] == 401  # not listed as public
    status, _, body = await asyncio.to_thread(request, port, "/config", "GET", "Bearer " + TOKEN)
    assert status == 200
    assert json.loads(body)["admin_auth"] == {"users": ["alice", "bob"], "users_file": False, "token": True,
                                              "public": ["/metrics"]}
    assert b"$2b$" not in body and TOKEN.encode() not in body
    status, _, _ = await asyncio.to_thread(
        request, port, f"/backends/{process.lb.config.backends[0].address}/drain", "POST", "Bearer " + TOKEN)
    assert status == 200


def test_unknown_user_costs_a_bcrypt_check_like_a_known_one():
    auth = Authenticator(AdminAuth(users=(user("alice", "wonderland", rounds=10),)))

    def fastest(header: str) -> float:
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            assert not auth.check(header)
            best = min(best, time.perf_counter() - t)
        return best

    known, unknown = fastest(basic("alice", "nope")), fastest(basic("mallory", "nope"))
    assert known > 0.005  # a real bcrypt check
    assert unknown > known / 3  # not a dictionary miss returning at once


@pytest.mark.parametrize(("table", "message"), [
    ({}, "needs users, users_file, token_file or token_env"),
    ({"users": ["alice:plaintext"]}, "bcrypt-hash"),
    ({"users": [user("a", "x"), user("a", "y")]}, "listed twice"),
    ({"token_env": "JUGGLER_TEST_NO_SUCH_VARIABLE"}, "16 characters"),
    ({"token_file": "/nonexistent/token"}, "No such file"),
    ({"users": [user("a", "x")], "public": ["/reload"]}, "read-only paths"),
    ({"users": [user("a", "x")], "realm": 'a"b'}, "realm"),
])
def test_admin_auth_table_is_validated(table, message):
    with pytest.raises(BalancerConfigError, match=message):
        from_dict({"listen": "127.0.0.1:1", "admin_auth": table})


def test_cli_flags_warning_and_reload_keeps_the_flags(tmp_path, backends):
    if shutil.which("htpasswd") is None:
        pytest.skip("htpasswd is not installed (apache2-utils)")
    b = backends(1)
    users = tmp_path / "admin.htpasswd"
    subprocess.run(["htpasswd", "-cbB", "-C", "4", str(users), "alice", "wonderland"], check=True,
                   capture_output=True, timeout=30)
    port, admin = free_port(), free_port()
    path = tmp_path / "balancer.toml"
    path.write_text(f'listen = "127.0.0.1:{port}"\nworkers = 1\nbackends = ["{b[0].address}"]\n')
    # without credentials on every interface: a warning
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", str(path), "--admin",
                             f"0.0.0.0:{admin}", "--log-level", "WARNING"], cwd=ROOT, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for_port(admin, 20, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "has no authentication" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    admin = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--config", str(path), "--admin",
                             f"127.0.0.1:{admin}", "--admin-users-file", str(users), "--admin-public", "/healthz",
                             "--log-level", "WARNING"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(admin, 20, proc)
        assert request(admin, "/healthz")[0] == 200
        assert request(admin, "/backends")[0] == 401
        assert request(admin, "/backends", authorization=basic("alice", "wonderland"))[0] == 200
        # a reload re-reads the file, and the flags still apply over it
        assert request(admin, "/reload", "POST", authorization=basic("alice", "wonderland"))[0] == 200
        assert request(admin, "/backends")[0] == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "has no authentication" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
