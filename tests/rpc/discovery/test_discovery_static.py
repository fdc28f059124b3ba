"""Static peer / multiple servers discovery, and the file cache."""

from __future__ import annotations

import json
import os

from rpc.discovery import FileCache, StaticDiscovery


def test_peer_and_multiple_servers_with_updates() -> None:
    d = StaticDiscovery.peer("tcp@127.0.0.1:8972", "weight=2")
    assert d.servers() == {"tcp@127.0.0.1:8972": "weight=2"}
    seen: list[dict[str, str]] = []
    unsubscribe = d.subscribe(seen.append)
    d.update(["tcp@a:1", "tcp@b:1"])
    d.update(["tcp@a:1", "tcp@b:1"])  # no change, no notification
    unsubscribe()
    d.update({"tcp@c:1": ""})
    assert seen == [{"tcp@a:1": "", "tcp@b:1": ""}]
    assert d.servers() == {"tcp@c:1": ""}


def test_subscriber_errors_do_not_break_others() -> None:
    d = StaticDiscovery()
    seen: list[dict[str, str]] = []

    def broken(_: dict[str, str]) -> None:
        raise RuntimeError("subscriber bug")

    d.subscribe(broken)
    d.subscribe(seen.append)
    d.update(["tcp@a:1"])
    assert seen == [{"tcp@a:1": ""}]


def test_file_cache_roundtrip_and_bad_files(tmp_path) -> None:
    path = tmp_path / "sub" / "arith.json"
    cache = FileCache(path)
    assert cache.load() is None
    cache.save({"tcp@a:1": "weight=1"})
    assert cache.load() == {"tcp@a:1": "weight=1"}
    assert [p for p in os.listdir(path.parent) if p.startswith(".rpc-discovery-")] == []
    path.write_text("{not json")
    assert cache.load() is None
    path.write_text(json.dumps({"servers": {"a": 1}}))
    assert cache.load() is None
