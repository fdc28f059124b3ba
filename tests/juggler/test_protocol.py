"""The message model's rules (timeouts, allowed types)."""

from __future__ import annotations

import pytest

from juggler.protocol import ALL_CLIENT_TYPES, MessageType, allowed_mask, call_timeout_ms, mask_names


def test_call_timeout_conversion() -> None:
    assert call_timeout_ms(5_000_000_000) == 5000
    assert call_timeout_ms(0) == 60_000
    assert call_timeout_ms(None) == 60_000
    assert call_timeout_ms(999_999) == 60_000  # under 1 ms: the default
    assert call_timeout_ms(1_999_999) == 1  # truncation
    assert call_timeout_ms(0, default_ms=5) == 5
    assert call_timeout_ms(-1_000_000) == -1
    assert call_timeout_ms(-1) < 0


def test_allowed_mask() -> None:
    assert allowed_mask(None) == ALL_CLIENT_TYPES
    assert allowed_mask("*") == ALL_CLIENT_TYPES
    assert mask_names(allowed_mask("Call, PUB")) == ["CALL", "PUB"]
    with pytest.raises(ValueError):
        allowed_mask("call, ack")
    assert MessageType.EVNT == 10
