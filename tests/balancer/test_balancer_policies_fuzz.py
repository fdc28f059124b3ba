"""Fuzzing the decoders of the rate limit and pool policies: any value is a
configuration or a BalancerConfigError naming the key, never a crash; what
the Python side accepts, the data plane accepts too."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rustext
from balancer.config import BalancerConfigError, from_dict

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=20),
    st.sampled_from(["10/s", "5r/m", "1/h", "0/s", "src", "header:X-K", "header:bad name", "30s", "500ms",
                     "503", "response-timeout", "all-retryable-errors", "layer7", "SERVERID", "insert"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=8)
rate_limit = st.fixed_dictionaries({"rate": values}, optional={
    k: values for k in ("burst", "key", "missing", "max_keys", "status")})
sticky = st.fixed_dictionaries({}, optional={
    k: values for k in ("cookie", "mode", "indirect", "nocache", "httponly", "secure", "max_age", "domain", "path")})
server = st.fixed_dictionaries({"address": st.just("127.0.0.1:1")}, optional={
    "backup": values, "slow_start": values, "cookie": values})
policies = st.fixed_dictionaries({}, optional={
    "rate_limit": st.one_of(rate_limit, values), "sticky": st.one_of(sticky, values), "retry_on": values,
    "slow_start": values, "all_backups": values,
    "passive": st.fixed_dictionaries({}, optional={"observe": values, "error_statuses": values}),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies, server)
def test_policy_keys_are_checked_on_both_sides(extra, srv):
    try:
        cfg = from_dict({"listen": "127.0.0.1:0", "backends": [srv, "127.0.0.2:1"], **extra})
    except BalancerConfigError:
        return
    rustext.Balancer(cfg.to_native())  # the data plane takes it (not started)
