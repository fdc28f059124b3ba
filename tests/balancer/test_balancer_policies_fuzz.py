"""Fuzzing the tables the data plane reads (rate limits, pool policies,
timeouts, limits, routes, header rules, listeners, named pools): any value is
a configuration or a BalancerConfigError naming the key, never a crash; and
every configuration ``balancer.config`` accepts, the data plane takes.

Values are mostly of the key's own kind, at and past the edges of what the
data plane holds (counts past 32 and 64 bits, infinite or huge durations,
header values with control characters...), and now and then anything: so
that many configurations are accepted and reach the data plane."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rustext
from balancer.config import BalancerConfigError, from_dict

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
hostile = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                       max_leaves=8)


def of(*kinds: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Mostly ``kinds``, one time in eight anything."""
    own = st.one_of(*kinds)
    return st.integers(0, 7).flatmap(lambda i: hostile if i == 0 else own)


def pick(*choices: object) -> st.SearchStrategy[object]:
    """One of ``choices`` (valid ones and near misses), or some text, or anything."""
    return of(st.sampled_from(choices), st.sampled_from(choices), st.text(max_size=12))


counts = of(st.integers(-2, 70_000), st.sampled_from([2**32 - 1, 2**32, 2**64 - 1, 2**64, 10**6 + 1, 10**8 + 1]))
seconds = of(st.floats(-1, 1e9), st.integers(-1, 100),
             st.sampled_from([float("inf"), float("nan"), 1e300, 31_536_000.0, 31_536_001.0]))
durations = of(st.floats(-1, 1e6), pick("30s", "500ms", "2m", "1h", "2d", "-1s"))
flags = of(st.booleans())
statuses = of(st.lists(st.one_of(st.integers(99, 600), st.sampled_from(["503", "response-timeout",
                                                                       "all-retryable-errors", "x"])), max_size=3))
header_names = pick("X-Tag", "X-Api-Key", "bad name", "Host", "")
header_values = pick("v", "%[src]", "%[req.id] at %[src]", "%[nope", "%[src", "a\x01b", "tab\there", "é", "\x7f")


def table(most: int = 3, **keys: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    """A table with up to ``most`` of ``keys``: few keys at a time, so that most
    tables are valid and reach the data plane."""
    return st.sets(st.sampled_from(sorted(keys)), max_size=most).flatmap(
        lambda chosen: st.fixed_dictionaries({k: keys[k] for k in sorted(chosen)}))


def with_(required: dict[str, st.SearchStrategy[object]], optional: st.SearchStrategy[dict[str, object]]
          ) -> st.SearchStrategy[dict[str, object]]:
    return st.tuples(st.fixed_dictionaries(required), optional).map(lambda t: {**t[0], **t[1]})


rate_limit = with_({"rate": pick("10/s", "5r/m", "1/h", "0/s", "1000000000/s", "1000000001/s", "9" * 25 + "/s")},
                   table(burst=counts, key=pick("src", "header:X-K", "header:bad name", "client_ip"),
                         missing=pick("src", "allow"), max_keys=counts, status=counts, nodelay=flags, delay=counts))
sticky = table(cookie=pick("SERVERID", "s-1", "bad name"), mode=pick("insert", "rewrite"), indirect=flags,
               nocache=flags, httponly=flags, secure=flags, max_age=counts, domain=pick("example.com", "é", "a;b"),
               path=pick("/", "/app", "a b"))
names_as_keys = st.sampled_from(["X-Tag", "X-Api-Key", "bad name", "Host", ""])
rules = table(set=st.dictionaries(names_as_keys, header_values, max_size=2),
              add=st.dictionaries(names_as_keys, header_values, max_size=2),
              delete=of(header_names, st.lists(header_names, max_size=2)))
route = with_({"backend": st.sampled_from(["default", "nope"])}, table(
    host=of(pick("example.com", "*.example.com", "*", "a" * 300, "é.example"), st.lists(
        st.sampled_from(["a.example", "*.b.example"]), max_size=2)),
    path=pick("/", "/api", "api"), path_prefix=pick("/", "/v1/", "v1"),
    method=of(pick("GET", "get", "PÖST", "M-SEARCH"), st.lists(st.sampled_from(["GET", "post"]), max_size=2)),
    request_headers=rules, response_headers=rules, rate_limit=of(rate_limit),
    header=st.lists(table(name=header_names, equals=header_values, prefix=header_values), max_size=2)))
server = with_({"address": st.just("127.0.0.1:1")}, table(
    backup=flags, slow_start=durations, cookie=pick("abc", "a b", "x" * 129), weight=counts, max_connections=counts,
    send_proxy=pick("v1", "v2", "none", "1")))
timeouts = table(connect=seconds, header=seconds, response=seconds, idle=seconds, total=seconds, queue=seconds,
                 tunnel=seconds)
passive = table(observe=pick("layer4", "layer7"), error_statuses=statuses, eject_after=counts, cooldown=seconds,
                on_error=pick("eject", "mark-down"))
policy = dict(
    algorithm=pick("round_robin", "wrr", "p2c", "least_conn", "random-two", "consistent_hash", "ketama", "fastest"),
    hash_key=pick("client_ip", "path", "header:X-User", "header:bad name", "header:", "ip"), retries=counts,
    send_proxy=pick("v1", "v2", "none", "2"), proto=pick("h1", "h2", "http/1.1"), h2_max_streams=counts,
    h2_connections=counts, slow_start=durations, retry_on=statuses, rate_limit=of(rate_limit), passive=passive,
    all_backups=flags)
top = table(
    4, sticky=of(sticky), timeouts=timeouts, routes=st.lists(route, max_size=2), request_headers=rules,
    response_headers=rules, request_id=table(header=header_names), default_backend=st.sampled_from(["default", "nope"]),
    limits=table(max_connections=counts, max_client_connections=counts, max_open_connections=counts,
                 max_header_bytes=counts, pool_max_idle=counts, pool_idle_timeout=seconds),
    **policy)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top, server)
def test_what_python_accepts_the_data_plane_takes(extra, srv):
    try:
        cfg = from_dict({"listen": "127.0.0.1:0", "backends": [srv, "127.0.0.2:1"], **extra})
    except BalancerConfigError:
        return
    rustext.Balancer(cfg)  # checked, not started


pool = with_({"servers": st.just(["127.0.0.1:1", {"address": "127.0.0.2:1", "weight": 2}])}, table(
    4, max_connections=counts, sticky=st.one_of(sticky, st.just(False)), request_headers=rules,
    response_headers=rules, timeouts=table(connect=seconds, response=seconds, total=seconds, queue=seconds,
                                           tunnel=seconds), **policy))
listener = with_({"address": st.sampled_from(["127.0.0.1:0", "[::1]:0", "unix:/tmp/lb-fuzz.sock"])}, table(
    default_backend=st.sampled_from(["web", "api"]), mode=pick("0660", "0999", "660"), accept_proxy=flags,
    request_headers=rules, routes=st.lists(route.map(lambda r: {**r, "backend": "api"}), max_size=2),
    request_id=table(header=header_names), access_log=st.just(False)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["web", "api"]), pool, min_size=1), st.lists(listener, min_size=1, max_size=3))
def test_named_pools_and_listeners_python_accepts_the_data_plane_takes(pools, listeners):
    try:
        cfg = from_dict({"backends": pools, "listeners": listeners})
    except BalancerConfigError:
        return
    rustext.Balancer(cfg)  # checked, not started
