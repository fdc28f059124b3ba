"""Routing (balancer/routing.py, rustext/src/balancer/route.rs): named backend
pools, routes by host, path, header and method, several listeners, header
rules, request ids, redirects and HSTS, and their reload; real balancer,
real backend processes, real sockets. Each request is sent twice: on the
fast path (an origin-form GET) and on hyper's (an absolute-form target,
which the fast path hands over), and both must agree."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import tomllib
from typing import Any

import pytest
from balancer_helpers import BackendProc, split_response

from balancer import BalancerConfigError, LoadBalancer
from balancer.config import from_dict
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(120)]


def lb_for(text: str) -> LoadBalancer:
    return LoadBalancer(from_dict(tomllib.loads(text)))


def pools(bks: list[BackendProc], names: str = "abc") -> str:
    return "".join(f'[backends.{n}]\nservers = ["{b.address}"]\n' for n, b in zip(names, bks))


def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection (``Connection: close``); status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    status, headers, body = split_response(b"".join(chunks))
    return int(status.split()[1]), headers, body


def request(port: int, path: str, *, host: str | None = "example.com", method: str = "GET",
            headers: dict[str, str] | None = None, absolute: bool = False) -> tuple[int, dict[str, str], bytes]:
    target = f"http://{host}{path}" if absolute else path
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append("Connection: close")
    return exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode())


def who(port: int, path: str, **kw: Any) -> str | int:
    """The backend that answered on both paths (they must agree), or the status."""
    out = []
    for absolute in (False, True):
        status, _, body = request(port, path, absolute=absolute, **kw)
        out.append(json.loads(body)["name"] if status == 200 else status)
    assert out[0] == out[1], (path, kw, out)
    return out[0]


ROUTES = """
[[routes]]
host = "API.example.com"
backend = "a"

[[routes]]
host = "*.static.example.com"
backend = "b"

[[routes]]
path = "/r/exact"
backend = "b"

[[routes]]
path_prefix = ["/r/api/", "/r/v2/"]
method = ["POST", "PUT"]
backend = "a"

[[routes]]
path_prefix = "/r/api/"
header = [{ name = "X-Canary", equals = "1" }, { name = "X-User", prefix = "adm" }]
backend = "b"

[[routes]]
host = "shop.example.com"
path_prefix = "/r/cart"
backend = "a"

[[routes]]
header = { name = "X-Debug" }
backend = "b"
"""


async def test_routes_by_each_condition_first_match_and_default(backends):
    a, b, c = backends(3)
    text = f'listen = "127.0.0.1:0"\nworkers = 2\ndefault_backend = "c"\n{pools([a, b, c])}{ROUTES}'
    async with lb_for(text) as lb:
        port = lb.address[1]
        assert who(port, "/r/x", host="api.example.com") == "b0"
        assert who(port, "/r/x", host="API.Example.COM:8080") == "b0"  # case and port ignored
        assert who(port, "/r/x", host="api.example.com.") == "b0"  # trailing dot
        assert who(port, "/r/x", host="img.static.example.com") == "b1"
        assert who(port, "/r/x", host="a.b.static.example.com") == "b1"
        assert who(port, "/r/x", host="static.example.com") == "b2"  # the wildcard wants a subdomain
        assert who(port, "/r/exact") == "b1"
        assert who(port, "/r/exact/more") == "b2"  # exact is exact
        assert who(port, "/r/api/x", method="PUT") == "b0"
        assert who(port, "/r/v2/x", method="POST") == "b0"
        assert who(port, "/r/api/x") == "b2"  # GET: not the method route, headers missing
        assert who(port, "/r/api/x", headers={"X-Canary": "1", "X-User": "admin"}) == "b1"
        assert who(port, "/r/api/x", headers={"X-Canary": "1"}) == "b2"  # all conditions must hold
        assert who(port, "/r/api/x", headers={"X-Canary": "2", "X-User": "admin"}) == "b2"
        assert who(port, "/r/cart/1", host="shop.example.com") == "b0"
        assert who(port, "/r/cart/1", host="other.example.com") == "b2"
        assert who(port, "/r/x", headers={"X-Debug": ""}) == "b1"  # present, even empty
        # first match wins: the host route comes before the header route
        assert who(port, "/r/x", host="api.example.com", headers={"X-Debug": "1"}) == "b0"
        # HTTP/1.0 without Host: host routes do not match, the default takes it
        status, _, body = exchange(port, b"GET /r/x HTTP/1.0\r\n\r\n")
        assert status == 200 and json.loads(body)["name"] == "b2"


async def test_no_matching_route_and_no_default_is_503(backends):
    a, = backends(1)
    text = (f'listen = "127.0.0.1:0"\nworkers = 1\nrequest_id = {{ header = "X-Request-ID" }}\n'
            f'{pools([a], "a")}[backends.dead]\nservers = ["127.0.0.1:1"]\n'
            '[[routes]]\nhost = "a.example"\nbackend = "a"\n[[routes]]\nhost = "dead.example"\nbackend = "dead"\n')
    async with lb_for(text) as lb:
        port = lb.address[1]
        assert who(port, "/r/x", host="a.example") == "b0"
        # as HAProxy without a default_backend: 503; the balancer's own answers carry the request id too
        for absolute in (False, True):
            status, headers, body = request(port, "/r/x", host="b.example", absolute=absolute,
                                            headers={"X-Request-ID": "mine"})
            assert (status, body, headers["x-request-id"]) == (503, b"no backend for this request\n", "mine")
            status, headers, _ = request(port, "/r/x", host="dead.example", absolute=absolute)
            assert status == 502 and len(headers["x-request-id"]) == 32
        assert lb.stats()["no_backend"] == 2


async def test_header_rules_both_directions_and_request_ids(backends):
    a, b = backends(2)
    text = f"""
listen = "127.0.0.1:0"
workers = 1
default_backend = "a"
request_id = {{ header = "X-Request-ID" }}

[request_headers]
set = {{ "X-Env" = "prod", "X-From" = "%[src]" }}
delete = ["X-Secret"]

[response_headers]
delete = ["X-Internal"]
set = {{ "X-Served-By" = "balancer" }}

[backends.a]
servers = ["{a.address}"]
[backends.a.request_headers]
add = {{ "X-Pool" = "a" }}

[backends.b]
servers = ["{b.address}"]

[[routes]]
path_prefix = "/r/b/"
backend = "b"
[routes.request_headers]
set = {{ "X-Env" = "canary", "X-Trace" = "id=%[req.id]" }}
[routes.response_headers]
add = {{ "X-Route" = "b" }}
"""
    async with lb_for(text) as lb:
        port = lb.address[1]
        for absolute in (False, True):
            status, headers, body = request(port, "/r/a/x", absolute=absolute,
                                            headers={"X-Secret": "s", "X-Env": "dev", "X-Keep": "k"})
            assert status == 200
            got = {k.lower(): v for k, v in json.loads(body)["headers"]}
            seen = [k.lower() for k, _ in json.loads(body)["headers"]]
            assert got["x-env"] == "prod" and seen.count("x-env") == 1  # set replaces
            assert "x-secret" not in got and got["x-keep"] == "k"
            assert got["x-from"] == "127.0.0.1" and got["x-pool"] == "a"
            rid = got["x-request-id"]
            assert len(rid) == 32 and int(rid, 16) >= 0  # generated
            assert headers["x-request-id"] == rid  # echoed
            assert "x-internal" not in headers and headers["x-served-by"] == "balancer"
            assert headers["x-backend"] == "b0"

            status, headers, body = request(port, "/r/b/x", absolute=absolute,
                                            headers={"X-Request-ID": "client-id-1"})
            got = {k.lower(): v for k, v in json.loads(body)["headers"]}
            assert got["x-env"] == "canary" and "x-pool" not in got
            assert got["x-request-id"] == "client-id-1" and got["x-trace"] == "id=client-id-1"  # kept
            assert headers["x-request-id"] == "client-id-1" and headers["x-route"] == "b"
            # an invalid one (a space) is replaced
            status, headers, body = request(port, "/r/b/x", absolute=absolute, headers={"X-Request-ID": "bad id"})
            assert headers["x-request-id"] != "bad id" and len(headers["x-request-id"]) == 32
        ids = {request(port, "/r/a/x")[1]["x-request-id"] for _ in range(20)}
        assert len(ids) == 20


async def test_redirects_https_and_hsts(backends, pki: TestPKI):
    a, = backends(1)
    leaf = pki.leaf("localhost", "127.0.0.1")
    from tests.netutil import free_port

    https_port = free_port()
    text = f"""
workers = 1
[tls]
certificates = [{{ cert = "{leaf.cert}", key = "{leaf.key}" }}]

{pools([a], "a")}

[[listeners]]
address = "127.0.0.1:0"
default_backend = "a"
request_id = {{ header = "X-Request-ID" }}
[[listeners.routes]]
path = "/old"
redirect = {{ code = 301, location = "https://example.com/new" }}
[[listeners.routes]]
path_prefix = "/"
redirect = {{ scheme = "https", code = 308, port = {https_port} }}

[[listeners]]
address = "127.0.0.1:{https_port}"
tls = true
default_backend = "a"
hsts = {{ max_age = 600, include_subdomains = true }}
"""
    async with lb_for(text) as lb:
        port = lb.address[1]
        assert lb.addresses[1] == ("127.0.0.1", https_port)
        for absolute in (False, True):
            status, headers, _ = request(port, "/old", absolute=absolute)
            assert status == 301 and headers["location"] == "https://example.com/new"
            assert len(headers["x-request-id"]) == 32
            status, headers, _ = request(port, "/r/x?q=1", host="Example.com:8080", absolute=absolute)
            assert status == 308 and headers["location"] == f"https://Example.com:{https_port}/r/x?q=1"
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        conn = http.client.HTTPSConnection("localhost", https_port, context=ctx, timeout=10)
        try:
            conn.request("GET", "/r/x")
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())["name"] == "b0"
            assert r.getheader("strict-transport-security") == "max-age=600; includeSubDomains"
        finally:
            conn.close()
        # the plain listener sends no HSTS
        status, headers, _ = request(port, "/old")
        assert "strict-transport-security" not in headers


async def test_several_listeners_have_their_own_routes(backends):
    a, b = backends(2)
    text = f"""
workers = 2
{pools([a, b], "ab")}
[[listeners]]
address = "127.0.0.1:0"
default_backend = "a"

[[listeners]]
address = "127.0.0.1:0"
default_backend = "b"
[[listeners.routes]]
path_prefix = "/r/a/"
backend = "a"
"""
    async with lb_for(text) as lb:
        (_, p0), (_, p1) = lb.addresses
        assert p0 != p1
        assert who(p0, "/r/a/x") == "b0" and who(p0, "/r/x") == "b0"
        assert who(p1, "/r/a/x") == "b0" and who(p1, "/r/x") == "b1"
        names = {(x["pool"], x["name"]) for x in lb.backends()}
        assert names == {("a", a.address), ("b", b.address)}


async def test_reload_swaps_routes_under_load_without_a_failed_request(tmp_path, backends):
    a, b = backends(2)
    path = tmp_path / "balancer.toml"

    def write(target: str) -> None:
        path.write_text(f'listen = "127.0.0.1:0"\nworkers = 2\n{pools([a, b], "ab")}'
                        f'[[routes]]\npath_prefix = "/r/"\nbackend = "{target}"\n')

    write("a")
    from balancer.config import load

    async with LoadBalancer(load(path), config_path=path) as lb:
        port = lb.address[1]
        stop = asyncio.Event()
        errors: list[object] = []
        seen: set[str] = set()

        def client() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            while not stop.is_set():
                try:
                    c.request("GET", "/r/x")
                    r = c.getresponse()
                    body = r.read()
                    if r.status != 200:
                        errors.append(r.status)
                    else:
                        seen.add(json.loads(body)["name"])
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(exc)
                    return
            c.close()

        tasks = [asyncio.create_task(asyncio.to_thread(client)) for _ in range(4)]
        for i in range(8):
            write("b" if i % 2 == 0 else "a")
            await lb.reload()
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
        assert errors == []
        assert seen == {"b0", "b1"}
        # after the last reload (to a), everything goes to a
        assert who(port, "/r/x") == "b0"
        # an invalid file (an unknown backend) is refused naming the key; the routes stay
        path.write_text(f'listen = "127.0.0.1:0"\nworkers = 2\n{pools([a, b], "ab")}'
                        '[[routes]]\npath_prefix = "/r/"\nbackend = "nope"\n')
        with pytest.raises(BalancerConfigError, match=r"balancer.toml:9: routes\[0\].backend: no backend named 'nope'"):
            await lb.reload()
        assert who(port, "/r/x") == "b0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[routes]]\nbackend = "x"', r"^routes\[0\].backend: no backend named 'x' \(known: default\)"),
        ('default_backend = "x"', r"^default_backend: no backend named 'x'"),
        ('[[routes]]\nhost = "*"\nbackend = "default"', r"routes\[0\].host: invalid host '\*'"),
        ('[[routes]]\npath_prefix = "api"\nbackend = "default"', r"routes\[0\]: path 'api' must start with /"),
        ('[[routes]]\npath = "/"', r"routes\[0\]: a route needs a backend, a redirect or respond"),
        ('[[routes]]\npath = "/"\nbackend = "default"\nredirect = { location = "/x" }', "not both|one of them"),
        ('[[routes]]\npath = "/"\nredirect = { code = 200, location = "/x" }', "redirect.code must be 301"),
        ('[[routes]]\npath = "/"\nredirect = { scheme = "ftp" }', 'redirect.scheme must be "https"'),
        ('[[routes]]\npath = "/"\nrespond = { status = 99 }', r"routes\[0\].respond.status must be an HTTP status"),
        ('[[routes]]\npath = "/"\nrespond = { body = "a", file = "b" }', "give body or file, not both"),
        ('[[routes]]\npath = "/"\nrespond = { file = "/nonexistent/page" }', r"routes\[0\].respond.file: cannot read"),
        ('[[routes]]\npath = "/"\nbackend = "default"\nrespond = { status = 403 }', "one of them"),
        ('[[routes]]\npath = "/"\nbackend = "default"\nbogus = 1', r"unknown key\(s\) in routes\[0\]: bogus"),
        ('[[routes]]\nheader = { name = "bad name" }\nbackend = "default"', "invalid header name 'bad name'"),
        ('[request_headers]\nset = { "X-A" = "%[nope]" }', r"request_headers.set.X-A: unknown value %\[nope\]"),
        ('[request_headers]\ndelete = ["Content-Length"]', "Content-Length is managed by the balancer"),
        ('request_id = { header = "Host" }', "cannot carry a request id"),
        ('hsts = { max_age = 1 }', "hsts needs HTTPS"),
        ('[[listeners]]\naddress = "127.0.0.1:1"', "give listen or \\[\\[listeners\\]\\], not both"),
    ],
)
def test_routing_errors_name_the_key(text, message):
    base = 'listen = "127.0.0.1:1"\nbackends = ["127.0.0.1:2"]\n'
    with pytest.raises(BalancerConfigError, match=message):
        from_dict(tomllib.loads(base + text))


def test_named_backends_inherit_and_override():
    cfg = from_dict(tomllib.loads("""
listen = "127.0.0.1:1"
algorithm = "least_connections"
retries = 1
[timeouts]
connect = 2.0
[health]
path = "/health"
[backends.api]
servers = ["127.0.0.1:2", { address = "127.0.0.1:3", weight = 3 }]
algorithm = "random_two"
[backends.api.timeouts]
response = 5.0
[backends.web]
servers = ["127.0.0.1:4"]
health = { enabled = false }
[backends.bad]
servers = []
""".replace('[backends.bad]\nservers = []\n', "")))
    p = cfg.pools()
    assert p["api"].algorithm == "random_two" and p["web"].algorithm == "least_connections"
    assert p["api"].timeouts.connect == 2.0 and p["api"].timeouts.response == 5.0
    assert p["api"].backends[1].weight == 3 and p["api"].retries == 1
    assert p["api"].health is not None and p["web"].health is None
    assert cfg.effective_listeners()[0].default_backend is None
    with pytest.raises(BalancerConfigError, match=r"backends.x.servers must list"):
        from_dict(tomllib.loads('listen = "127.0.0.1:1"\n[backends.x]\nservers = []\n')).pools()


#: odd Host headers: (name, raw request). Both proxies route ``api.example.com``
#: to a, ``*.example.com`` to b, the rest to c.
HOSTS = [
    ("no Host, HTTP/1.1", b"GET /r/x HTTP/1.1\r\n"),
    ("no Host, HTTP/1.0", b"GET /r/x HTTP/1.0\r\n"),
    ("two equal Host", b"GET /r/x HTTP/1.1\r\nHost: api.example.com\r\nHost: api.example.com\r\n"),
    ("two different Host", b"GET /r/x HTTP/1.1\r\nHost: api.example.com\r\nHost: x.example.com\r\n"),
    ("with port", b"GET /r/x HTTP/1.1\r\nHost: api.example.com:8080\r\n"),
    ("with an empty port", b"GET /r/x HTTP/1.1\r\nHost: api.example.com:\r\n"),
    ("with a bad port", b"GET /r/x HTTP/1.1\r\nHost: api.example.com:abc\r\n"),
    ("upper case", b"GET /r/x HTTP/1.1\r\nHost: API.Example.COM\r\n"),
    ("trailing dot", b"GET /r/x HTTP/1.1\r\nHost: api.example.com.\r\n"),
    ("IPv6 literal with port", b"GET /r/x HTTP/1.1\r\nHost: [::1]:8080\r\n"),
    ("IPv6 literal", b"GET /r/x HTTP/1.1\r\nHost: [::1]\r\n"),
    ("empty", b"GET /r/x HTTP/1.1\r\nHost: \r\n"),
    ("userinfo", b"GET /r/x HTTP/1.1\r\nHost: u@api.example.com\r\n"),
    ("space inside", b"GET /r/x HTTP/1.1\r\nHost: api.example.com x\r\n"),
    ("tabs around", b"GET /r/x HTTP/1.1\r\nHost:\tapi.example.com\t\r\n"),
    ("wildcard", b"GET /r/x HTTP/1.1\r\nHost: x.example.com\r\n"),
    ("the wildcard's bare suffix", b"GET /r/x HTTP/1.1\r\nHost: example.com\r\n"),
    ("absolute-form, same Host", b"GET http://api.example.com/r/x HTTP/1.1\r\nHost: api.example.com\r\n"),
    ("absolute-form, other Host", b"GET http://api.example.com/r/x HTTP/1.1\r\nHost: other.test\r\n"),
    ("absolute-form, no Host", b"GET http://x.example.com/r/x HTTP/1.1\r\n"),
    ("absolute-form with port", b"GET http://API.example.com:81/r/x HTTP/1.1\r\nHost: API.example.com:81\r\n"),
]
#: where ours differs from HAProxy on purpose: a trailing dot names the same
#: host (DNS; nginx strips it too); HAProxy compares the bytes. Elsewhere ours
#: is stricter (400 for no Host in HTTP/1.1, two equal Host fields, userinfo,
#: a bad port, an absolute-form target without Host) and never routes what
#: HAProxy refuses; when both route, they pick the same backend.
DIFFERS = {"trailing dot": ("a", "c")}


async def test_odd_hosts_route_as_haproxy_routes_them(backends, tmp_path):
    import shutil
    import subprocess

    from tests.netutil import free_port, wait_for_port

    if shutil.which("haproxy") is None:
        pytest.skip("HAProxy is not installed: the comparison cannot run")
    a, b, c = backends(3)
    hport = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        "global\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 3s\n  timeout client 5s\n"
        f"  timeout server 5s\nfrontend f\n  bind 127.0.0.1:{hport}\n"
        "  http-request set-var(txn.host) req.hdr(host),host_only,lower\n"
        "  acl api var(txn.host) -m str api.example.com\n"
        "  acl wild var(txn.host) -m end .example.com\n"
        "  use_backend a if api\n  use_backend b if wild\n  default_backend c\n"
        + "".join(f"backend {n}\n  server s {x.address}\n" for n, x in zip("abc", (a, b, c))))
    haproxy = await asyncio.to_thread(subprocess.Popen, ["haproxy", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    names = {a.name: "a", b.name: "b", c.name: "c"}
    text = (f'listen = "127.0.0.1:0"\nworkers = 1\ndefault_backend = "c"\n{pools([a, b, c])}'
            '[[routes]]\nhost = "api.example.com"\nbackend = "a"\n[[routes]]\nhost = "*.example.com"\nbackend = "b"\n')
    lb = lb_for(text)

    def outcome(port: int, raw: bytes) -> str:
        try:
            status, _, body = exchange(port, raw + b"Connection: close\r\n\r\n")
        except (OSError, IndexError, ValueError):
            return "closed"
        return names[json.loads(body)["name"]] if status == 200 else str(status)

    problems = []
    try:
        wait_for_port(hport, proc=haproxy)
        async with lb:
            for name, raw in HOSTS:
                ours, theirs = outcome(lb.address[1], raw), outcome(hport, raw)
                if name in DIFFERS:
                    assert (ours, theirs) == DIFFERS[name], name
                elif theirs in ("a", "b", "c") and ours in ("a", "b", "c") and ours != theirs:
                    problems.append(f"{name}: ours routes to {ours}, HAProxy to {theirs}")
                elif theirs not in ("a", "b", "c") and ours in ("a", "b", "c"):
                    problems.append(f"{name}: HAProxy refuses it ({theirs}), ours routes it to {ours}")
                elif ours not in ("a", "b", "c") and ours != "400":
                    problems.append(f"{name}: ours answers {ours}")
    finally:
        haproxy.kill()
        haproxy.wait(timeout=10)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("rules", "xff", "forwarded", "proto"), [
    ({}, ["6.6.6.6, 127.0.0.1"], ["for=6.6.6.6, for=127.0.0.1;proto=http"], ["http"]),
    # an edge not trusting its clients' values: only the balancer's own go on
    ({"delete": ["X-Forwarded-For", "Forwarded"]}, ["127.0.0.1"], ["for=127.0.0.1;proto=http"], ["http"]),
    # a rule's value, then the balancer's own after it
    ({"set": {"X-Forwarded-For": "%[src]"}}, ["127.0.0.1, 127.0.0.1"], ["for=6.6.6.6, for=127.0.0.1;proto=http"],
     ["http"]),
    # TLS ended in front of the balancer: a rule's X-Forwarded-Proto wins over the balancer's own
    ({"set": {"X-Forwarded-Proto": "https"}}, ["6.6.6.6, 127.0.0.1"], ["for=6.6.6.6, for=127.0.0.1;proto=http"],
     ["https"]),
])
async def test_forwarding_headers_under_header_rules_on_both_paths(backends, rules, xff, forwarded, proto):
    """The fast path kept a client's X-Forwarded-For that a delete rule removes on hyper's path:
    the backend must see the same whichever path a request takes."""
    (b,) = backends(1)
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [b.address], "request_headers": rules})
    async with LoadBalancer(cfg) as lb:
        for chunked in (False, True):  # a chunked body goes to hyper's path
            def exchange() -> dict[str, list[str]]:
                with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=10) as s:
                    s.sendall(b"POST /headers HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: ftp\r\n"
                              b"Forwarded: for=6.6.6.6\r\nConnection: close\r\n"
                              + (b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n" if chunked
                                 else b"Content-Length: 1\r\n\r\nx"))
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
                seen: dict[str, list[str]] = {}
                for k, v in json.loads(split_response(data)[2])["headers"]:
                    seen.setdefault(k.lower(), []).append(v)
                return seen

            seen = await asyncio.to_thread(exchange)
            assert (seen["x-forwarded-for"], seen["forwarded"], seen["x-forwarded-proto"]) == (xff, forwarded, proto), \
                (chunked, seen)
