"""Regex routing and target rewrites (balancer/rewrite.py,
rustext/src/balancer/route/rewrite.rs): ``path_regex`` and ``host_regex``
conditions, ``strip_prefix``, ``replace_path`` with captures, ``set_path``,
``set_query`` and ``remove_query``, their hostile results (answered 500,
never forwarded) and their configuration errors; a real balancer and real
backend processes. Each request is sent on the fast path (an origin-form
GET) and on hyper's (an absolute-form target, which the fast path hands
over): both must agree."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from balancer_helpers import split_response

from balancer import BalancerConfigError
from balancer.config import from_dict, load

pytestmark = pytest.mark.timeout(60)


def get(port: int, target: str, host: str = "example.com", absolute: bool = False) -> tuple[int, bytes]:
    line = f"GET http://{host}{target} HTTP/1.1" if absolute else f"GET {target} HTTP/1.1"
    raw = f"{line}\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _, body = split_response(data)
    return int(status.split()[1]), body


def seen(port: int, target: str, host: str = "example.com") -> tuple[Any, ...]:
    """What the backend saw (its name and the target), or the status; the same on both paths."""
    out = []
    for absolute in (False, True):
        status, body = get(port, target, host, absolute)
        out.append((json.loads(body)["name"], json.loads(body)["target"]) if status == 200 else (status, body))
    assert out[0] == out[1], (target, out)
    return out[0]


def routed(bks: list[Any], routes: list[dict[str, Any]], **settings: Any) -> dict[str, Any]:
    return {"backends": {"a": {"servers": [bks[0].address]}, "b": {"servers": [bks[1].address]}},
            "routes": routes, "default_backend": "b", **settings}


def test_path_and_host_regular_expressions_route(backends, proxy):
    bks = backends(2)
    lb = proxy((), **routed(bks, [
        {"path_regex": r"^/r/v\d+/", "backend": "a"},
        {"host_regex": r"^(api|www)\.example\.(com|org)$", "path_prefix": "/r/", "backend": "a"},
        {"path_regex": r"\.png$", "backend": "a"},
    ]))
    port = lb.address[1]
    assert seen(port, "/r/v2/x?q=1") == ("b0", "/r/v2/x?q=1")
    assert seen(port, "/r/vx/x") == ("b1", "/r/vx/x")
    assert seen(port, "/r/x", host="API.Example.org:8080") == ("b0", "/r/x")
    assert seen(port, "/r/x", host="evil-api.example.com") == ("b1", "/r/x")
    assert seen(port, "/r/a.png") == ("b0", "/r/a.png")
    assert seen(port, "/r/a.png.txt") == ("b1", "/r/a.png.txt")


def test_rewrites_change_what_the_backend_sees(backends, proxy, tmp_path):
    bks = backends(2)
    log = tmp_path / "access.log"
    lb = proxy((), access_log={"path": str(log), "format": "%HP"}, **routed(bks, [
        {"path_prefix": "/api/", "backend": "a", "rewrite": {"strip_prefix": "/api"}},
        {"path_regex": r"^/old/", "backend": "a",
         "rewrite": {"replace_path": {"regex": r"^/old/(?P<id>\d+)/(.*)$", "replacement": "/r/new/$2/${id}"}}},
        {"path": "/page", "backend": "a", "rewrite": {"set_path": "/r/index.html", "remove_query": True}},
        {"path_prefix": "/r/v1/", "backend": "a", "rewrite": {"set_query": "v=1&from=lb"}},
        {"path_prefix": "/r/", "backend": "a", "rewrite": {"remove_query": True}},
    ]))
    port = lb.address[1]
    # the query is kept when only the path changes
    assert seen(port, "/api/r/users?id=7&x=%20") == ("b0", "/r/users?id=7&x=%20")
    assert seen(port, "/api/r/users") == ("b0", "/r/users")
    # the access log keeps the client's path (both request paths log it so)
    assert all(line.startswith("/api/r/users") for line in wait_lines(log, 4))
    # captures by number and by name
    assert seen(port, "/old/42/r/a/b?k=v") == ("b0", "/r/new/r/a/b/42?k=v")
    assert seen(port, "/page?a=1") == ("b0", "/r/index.html")
    assert seen(port, "/r/v1/x?old=1") == ("b0", "/r/v1/x?v=1&from=lb")
    assert seen(port, "/r/v1/x") == ("b0", "/r/v1/x?v=1&from=lb")
    assert seen(port, "/r/x?drop=1") == ("b0", "/r/x")


def wait_lines(path: Path, n: int, timeout: float = 15.0) -> list[str]:
    """The access log's lines once it has at least ``n`` (written every housekeeping tick)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            return lines
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)


def test_invalid_results_are_answered_500_and_never_forwarded(backends, proxy):
    bks = backends(2)
    lb = proxy((), **routed(bks, [
        # a capture alone: "/relx" becomes "x", which is no origin-form path
        {"path_prefix": "/rel", "backend": "a",
         "rewrite": {"replace_path": {"regex": r"^/rel(.*)$", "replacement": "$1"}}},
        # nine copies of the path: over the 8 KiB bound for a long one
        {"path_prefix": "/long/", "backend": "a",
         "rewrite": {"replace_path": {"regex": r"^(.*)$", "replacement": "$1" * 9}}},
    ]))
    port = lb.address[1]
    status, body = seen(port, "/relx?q=1")
    assert status == 500 and body == b"the rewritten request target is invalid\n"
    assert seen(port, "/rel/r/x?q=1") == ("b0", "/r/x?q=1")  # the capture starts with / here: fine
    assert seen(port, "/long/" + "a" * 1000)[0] == 500
    assert seen(port, "/r/after") == ("b1", "/r/after")


@pytest.mark.parametrize(("rewrite", "message"), [
    ({"replace_path": {"regex": "(", "replacement": "/"}}, "replace_path.regex: invalid regular expression"),
    ({"replace_path": {"regex": "^/(a)", "replacement": "/$2"}}, "has no group"),
    ({"replace_path": {"regex": "^/(a)", "replacement": "/$1a"}}, 'no group "1a"'),
    ({"replace_path": {"regex": "^/(a)", "replacement": "/$1?x=1"}}, "query"),
    ({"set_path": "/a b"}, "which a path may not"),
    ({"set_path": "/a\r\nX-Injected: 1"}, "which a path may not"),
    ({"set_path": "relative"}, "must start with /"),
    ({"strip_prefix": "/a", "set_path": "/b"}, "one of strip_prefix, replace_path and set_path"),
    ({"set_query": "a", "remove_query": True}, "not both"),
    ({"set_query": "a#b"}, "which a query may not"),
    ({"set_path": "/" + "a" * 9000}, "over 8192 bytes"),
])
def test_bad_rewrites_are_configuration_errors(rewrite, message):
    with pytest.raises(BalancerConfigError, match="routes\\[0\\]\\.rewrite") as e:
        from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"],
                   "routes": [{"path_prefix": "/", "backend": "default", "rewrite": rewrite}]})
    assert message in str(e.value)


@pytest.mark.parametrize(("condition", "message"), [
    ({"path_regex": "a("}, "routes[0].path_regex: invalid regular expression"),
    ({"host_regex": "[z-a]"}, "routes[0].host_regex: invalid regular expression"),
    ({"path_regex": "a" * 1025}, "over 1024 bytes"),
    ({"path_regex": "(a{100}){100}{100}"}, "compiles too big"),
    ({"path_regex": ""}, "non-empty string"),
])
def test_bad_patterns_are_configuration_errors(condition, message):
    with pytest.raises(BalancerConfigError) as e:
        from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"],
                   "routes": [{**condition, "backend": "default"}]})
    assert message in str(e.value)


def test_a_rewrite_needs_a_backend():
    with pytest.raises(BalancerConfigError, match="a rewrite needs a backend"):
        from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"],
                   "routes": [{"path": "/", "redirect": {"scheme": "https"}, "rewrite": {"set_path": "/x"}}]})


def test_errors_in_a_file_name_its_line(tmp_path):
    path = tmp_path / "lb.toml"
    path.write_text('listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:1"]\n\n[[routes]]\nbackend = "default"\n'
                    "path_regex = '^/(api'\n")
    with pytest.raises(BalancerConfigError, match=r"lb\.toml:6: routes\[0\]\.path_regex: invalid regular"):
        load(path)
    path.write_text('listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:1"]\n\n[[routes]]\nbackend = "default"\n'
                    "[routes.rewrite]\nreplace_path = { regex = '^/(a)', replacement = '/${b}' }\n")
    with pytest.raises(BalancerConfigError, match=r"lb\.toml:7: .*replace_path.*no group"):
        load(path)
