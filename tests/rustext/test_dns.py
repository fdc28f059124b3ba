"""rustext.dns, the lookups behind both DNS discoveries, against a real dnsmasq."""

from __future__ import annotations

import pytest

from rustext.dns import ResolutionError, Resolver, SrvRecord, parse_nameserver
from tests.dnsmasq import Dnsmasq


def test_parse_nameserver() -> None:
    assert parse_nameserver("10.0.0.53") == ("10.0.0.53", 53)
    assert parse_nameserver("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_nameserver("[::1]:5353") == ("::1", 5353) and parse_nameserver("::1") == ("::1", 53)
    for bad in ("ns.example", "127.0.0.1:x", "127.0.0.1:0", "[::1]x", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="must be an IP address with an optional :port"):
            parse_nameserver(bad)


async def test_addresses_srv_ttl_and_failures(tmp_path) -> None:
    dns = Dnsmasq(str(tmp_path / "hosts"), {"app.test": ["127.0.0.2", "127.0.0.3"], "six.test": ["::1"]},
                  srv=["_x._tcp.app.test,app.test,8080,1,5", "_x._tcp.app.test,.,0"], ttl=9)
    try:
        r = Resolver([dns.nameserver], timeout=1)
        assert await r.addresses("app.test") == (["127.0.0.2", "127.0.0.3"], 9.0)
        assert await r.addresses("six.test") == (["::1"], 9.0)
        with pytest.raises(ResolutionError, match="six.test: "):
            await r.addresses("six.test", "ipv4")  # dnsmasq refuses the type it has not: an error either way
        records, ttl = await r.srv("_x._tcp.app.test")
        assert sorted(records, key=lambda x: x.port) == [SrvRecord(0, 0, 0, "."), SrvRecord(1, 5, 8080, "app.test")]
        assert ttl == 9.0
        with pytest.raises(ResolutionError, match="every nameserver failed .REFUSED."):
            await r.addresses("nowhere.test")
        port = dns.port
    finally:
        dns.stop()
    with pytest.raises(ResolutionError, match="app.test: no answer within 0.2 s"):
        await Resolver([f"127.0.0.1:{port}"], timeout=0.2).addresses("app.test")
