"""The Redis broker against a real redis-server: upstream's key layout and
scripts, byte for byte; the options' validation (keys.py, config.py)."""

from __future__ import annotations

import hashlib

import pytest
from redis_helpers import CONN, U1, U2, UPSTREAM_POP_SHA, UPSTREAM_PUSH_SHA

from juggler.broker.redis import (
    POP_CHECK_SCRIPT,
    PUSH_SCRIPT,
    RedisBrokerConfig,
    call_key,
    call_ttl_key,
    group_by_slot,
    key_slot,
    result_key,
    result_ttl_key,
)

pytestmark = pytest.mark.timeout(60)


def test_scripts_are_upstreams_byte_for_byte() -> None:
    assert PUSH_SCRIPT.sha.decode() == UPSTREAM_PUSH_SHA
    assert POP_CHECK_SCRIPT.sha.decode() == UPSTREAM_POP_SHA
    assert hashlib.sha1(PUSH_SCRIPT.body).hexdigest() == UPSTREAM_PUSH_SHA


def test_keys_and_slots() -> None:
    assert call_key("test.echo") == "juggler:calls:{test.echo}"
    assert call_ttl_key("test.echo", U1) == f"juggler:calls:timeout:{{test.echo}}:{U1}"
    assert result_key(CONN) == f"juggler:results:{{{CONN}}}"
    assert result_ttl_key(CONN, U1) == f"juggler:results:timeout:{{{CONN}}}:{U1}"
    # CLUSTER KEYSLOT values
    assert key_slot("foo") == 12182
    assert key_slot("123456789") == 12739
    assert key_slot(call_key("a")) == key_slot(call_ttl_key("a", U1)) == key_slot("a")
    assert key_slot(result_key(CONN)) == key_slot(result_ttl_key(CONN, U2))
    groups = group_by_slot(["test.echo", "test.reverse", "test.delay", "{x}a", "{x}b"])
    assert sorted(u for g in groups.values() for u in g) == sorted(["test.echo", "test.reverse", "test.delay", "{x}a", "{x}b"])
    assert any(set(g) >= {"{x}a", "{x}b"} for g in groups.values())


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        RedisBrokerConfig(call_cap=-1)
    with pytest.raises(ValueError):
        RedisBrokerConfig(url="http://nope")
    with pytest.raises(ValueError):
        RedisBrokerConfig(block_timeout=0)
