"""The two request paths (the fast path for common HTTP/1.1 requests, hyper
for the rest) must forward the same request and answer the same response
under every header rule: the same request, with a body sent by length (fast
path) or chunked (hyper's path), through a real balancer to a real backend
that echoes the headers it got. Two divergences were found this way (a
deleted X-Forwarded-For kept by the fast path; a rule's X-Forwarded-Proto
doubled by it)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from balancer_helpers import split_response

from balancer import LoadBalancer
from balancer.config import from_dict

pytestmark = pytest.mark.timeout(60)

REQUEST_CASES: list[dict[str, Any]] = [
    {},
    {"request_headers": {"delete": ["X-A"]}},
    {"request_headers": {"set": {"X-A": "v"}}},
    {"request_headers": {"add": {"X-A": "v"}}},
    {"request_headers": {"delete": ["User-Agent", "Accept"]}},
    {"request_headers": {"set": {"X-Forwarded-Proto": "https"}}},
    {"request_headers": {"delete": ["X-Forwarded-Proto"]}},
    {"request_headers": {"delete": ["X-Forwarded-For", "Forwarded"]}},
    {"request_headers": {"set": {"Forwarded": "for=1.1.1.1"}}},
    {"request_headers": {"add": {"X-Forwarded-For": "9.9.9.9"}}},
    {"request_headers": {"set": {"X-Src": "%[src]"}}},
    {"request_id": {"header": "X-Request-ID"}},
    {"request_id": {"header": "X-Request-ID"}, "request_headers": {"delete": ["X-Request-ID"]}},
    {"response_headers": {"set": {"X-Served-By": "lb"}, "delete": ["X-Backend"]}},
    {"response_headers": {"add": {"Set-Cookie": "a=1"}}},
    # listener and route rules folded: the route's set wins
    {"request_headers": {"set": {"X-R": "listener", "X-L": "l"}},
     "routes": [{"path_prefix": "/", "backend": "default", "request_headers": {"set": {"X-R": "route"}},
                 "response_headers": {"set": {"X-Route": "1"}}}]},
    {"routes": [{"path_prefix": "/", "backend": "default",
                 "request_headers": {"delete": ["X-Forwarded-For"], "set": {"X-Forwarded-Proto": "https"}}}]},
]

HEAD = (b"Host: t\r\nX-A: 1\r\nX-A: 2\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: ftp\r\n"
        b"Forwarded: for=6.6.6.6\r\nX-Request-ID: abc123\r\nUser-Agent: u\r\nAccept: */*\r\nConnection: close\r\n")
#: framing and per-exchange fields, which differ by design
IGNORED = {"content-length", "transfer-encoding", "connection", "date", "keep-alive"}


def exchange(port: int, chunked: bool) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
    """(status line, response fields, request fields the backend saw), fields sorted."""
    body = b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n" if chunked else b"Content-Length: 1\r\n\r\nx"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /headers HTTP/1.1\r\n" + HEAD + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _, payload = split_response(data)
    raw = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    response = sorted((k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in raw)
                      if k.lower() not in IGNORED)
    seen = sorted((k.lower(), v) for k, v in json.loads(payload)["headers"] if k.lower() not in IGNORED)
    return status, response, seen


@pytest.mark.parametrize("case", REQUEST_CASES, ids=[json.dumps(c, sort_keys=True) for c in REQUEST_CASES])
def test_both_paths_forward_and_answer_alike(backends: Any, case: dict[str, Any]) -> None:
    (b,) = backends(1)

    async def run() -> None:
        async with LoadBalancer(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [b.address],
                                           **case})) as lb:
            fast = await asyncio.to_thread(exchange, lb.address[1], False)
            hyper = await asyncio.to_thread(exchange, lb.address[1], True)
            assert fast[0] == hyper[0]
            assert fast[2] == hyper[2], "the backend saw different requests"
            assert fast[1] == hyper[1], "the client got different responses"

    asyncio.run(run())
