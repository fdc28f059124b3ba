"""Fuzzing the configuration decoders: bad input is a BalancerConfigError, never a crash."""

from __future__ import annotations

import socket

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rustext
from balancer.config import BalancerConfigError, from_dict, parse_backends

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=30), st.sampled_from(["127.0.0.1:1", "round_robin", "header:X", "path", "[::1]:80", ":80"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=10)
keys = st.sampled_from([
    "listen", "backends", "algorithm", "hash_key", "workers", "retries", "admin", "timeouts", "passive",
    "limits", "health", "connect_timeout", "response_timeout", "total_timeout", "eject_after",
    "eject_cooldown", "max_connections", "queue_timeout", "header_timeout", "idle_timeout",
    "max_header_bytes", "pool_max_idle", "pool_idle_timeout", "bogus",
])
configs = st.dictionaries(keys, values, max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
@example({"listen": None, "backends": 1})  # found by this test: a scalar `backends` was iterated
@example({"listen": "127.0.0.1:1", "backends": "127.0.0.1:2"})  # a string is not a list of backends
def test_python_loader_rejects_cleanly(data):
    try:
        cfg = from_dict(data)
    except BalancerConfigError:
        return
    cfg.to_native()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_native_config_rejects_cleanly(data):
    data = dict(data)
    if "listen" in data:
        data["listen"] = "127.0.0.1:0"  # never bind a real port here
    try:
        rustext.Balancer(data)  # validates only; start() is not called
    except rustext.BalancerConfigError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_backend_flag_parser(spec):
    try:
        parse_backends(spec)
    except BalancerConfigError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=2048))
def test_garbage_requests_never_hurt_the_proxy(proxy_session, payload):
    """Random bytes on a client connection: the proxy answers or closes, and keeps serving."""
    port = proxy_session.address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /whoami HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.0 200") and data.endswith(b"b0")
