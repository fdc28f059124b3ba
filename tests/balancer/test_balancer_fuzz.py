"""Fuzzing the configuration: bad input is a BalancerConfigError, never a
crash, and what ``balancer.config`` accepts the data plane takes."""

from __future__ import annotations

import socket

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rustext
from balancer.checks import parse_hostport, unix_path
from balancer.config import BalancerConfig, BalancerConfigError, from_dict, parse_backends
from balancer.discovery import is_ip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=30), st.sampled_from(["127.0.0.1:1", "round_robin", "header:X", "path", "[::1]:80", ":80"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=10)
keys = st.sampled_from([
    "listen", "backends", "algorithm", "hash_key", "workers", "retries", "admin", "timeouts", "passive",
    "limits", "health", "tls", "routes", "listeners", "default_backend", "request_id", "hsts", "request_headers",
    "response_headers", "access_log", "accept_proxy", "send_proxy", "rate_limit", "all_backups", "slow_start",
    "retry_on", "sticky", "proto", "h2_max_streams", "h2_connections", "bogus",
])
configs = st.dictionaries(keys, values, max_size=8)


def resolves_nothing(cfg: BalancerConfig) -> bool:
    """Whether the data plane needs no name resolution for ``cfg`` (its addresses are
    IPs or Unix paths): resolving names is the data plane's, outside these properties."""
    addresses = [x.address for x in cfg.effective_listeners()]
    addresses += [b.address for p in cfg.backend_pools() for b in p.config.backends]
    addresses += [cfg.tls.redirect] if cfg.tls.redirect else []
    return all(unix_path(a) is not None or is_ip(parse_hostport(a, "address")[0]) for a in addresses)


def data_plane_takes(cfg: BalancerConfig) -> None:
    """What balancer.config accepted, the data plane takes (checked, not started)."""
    if resolves_nothing(cfg):
        rustext.Balancer(cfg)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
@example({"listen": None, "backends": 1})  # found by this test: a scalar `backends` was iterated
@example({"listen": "127.0.0.1:1", "backends": "127.0.0.1:2"})  # a string is not a list of backends
@example({"listen": "127.0.0.1:1", "timeouts": {"idle": float("inf")}})  # a duration the data plane cannot hold
@example({"listen": "127.0.0.1:1", "passive": {"eject_after": 2**40}})  # a count over its 32 bits
def test_python_loader_rejects_cleanly_and_the_data_plane_takes_the_rest(data):
    try:
        cfg = from_dict(data)
    except BalancerConfigError:
        return
    data_plane_takes(cfg)


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
