"""libkv's Redis layout (rpc/discovery/libkv.py), sans I/O: keys and values
byte for byte as Go's libkv v0.5.1 writes them (the expected values were
written by Go rpcx's RedisRegisterPlugin), parsed as Go parses them."""

from __future__ import annotations

import pytest

from rpc.discovery import libkv
from rpc.discovery.libkv import KVPair


def test_keys_are_libkv_paths_with_a_slash_in_front() -> None:
    assert libkv.normalize(libkv.server_path("/rpcx", "Arith", "tcp@127.0.0.1:8972")) == "//rpcx/Arith/tcp@127.0.0.1:8972"
    assert libkv.normalize(libkv.server_path("rpcx", "Arith", "unix@/tmp/a.sock")) == "/rpcx/Arith/unix@/tmp/a.sock"
    assert libkv.normalize(libkv.service_path("/rpcx", "Arith")) == "//rpcx/Arith"
    assert libkv.servers_prefix("/rpcx", "Arith") == "//rpcx/Arith/"


def test_a_pair_is_encoded_as_go_wrote_it() -> None:
    # written by RedisRegisterPlugin{BasePath: "/rpcx_test"} for RegisterName("Arith", …, "group=canary")
    go = b'{"Key":"/rpcx_test/Arith/tcp@127.0.0.1:18972","Value":"Z3JvdXA9Y2FuYXJ5","LastIndex":762640776}'
    pair = KVPair(key="/rpcx_test/Arith/tcp@127.0.0.1:18972", value=b"group=canary", last_index=762640776)
    assert libkv.encode_pair(pair) == go
    assert libkv.decode_pair(go) == pair
    assert libkv.encode_pair(KVPair(key="/rpcx_test", value=b"rpcx_path", last_index=762014501)) == (
        b'{"Key":"/rpcx_test","Value":"cnBjeF9wYXRo","LastIndex":762014501}')
    assert libkv.encode_pair(KVPair(key="/r/A/tcp@h:1", value=b"", last_index=0)) == (
        b'{"Key":"/r/A/tcp@h:1","Value":"","LastIndex":0}')


def test_encoding_escapes_as_go_encoding_json() -> None:
    pair = KVPair(key="/a<b>&c\u2028é", value=b"", last_index=1)
    assert libkv.encode_pair(pair) == '{"Key":"/a\\u003cb\\u003e\\u0026c\\u2028é","Value":"","LastIndex":1}'.encode()
    assert libkv.decode_pair(libkv.encode_pair(pair)) == pair


def test_the_index_is_the_nanosecond_of_the_second() -> None:
    assert libkv.sequence_num(1_764_000_000_762_640_776) == 762_640_776


def test_decoding_follows_go_json_unmarshal() -> None:
    assert libkv.decode_pair('{"key":"/k","VALUE":null,"lastindex":3}') == KVPair(key="/k", value=b"", last_index=3)
    assert libkv.decode_pair('{"Value":"YQ=="}') == KVPair(key="", value=b"a", last_index=0)
    for bad in ("nonsense", "[1]", '{"Value":"***"}', '{"Value":5}', '{"Key":1}', '{"LastIndex":-1}', b"\xff"):
        with pytest.raises(ValueError, match="not a libkv KVPair"):
            libkv.decode_pair(bad)


def test_servers_from_a_listing() -> None:
    def value(meta: str) -> bytes:
        return libkv.encode_pair(KVPair(key="ignored", value=meta.encode(), last_index=1))

    entries = [
        ("//rpcx/Arith", value("Arith")),  # the service directory
        ("//rpcx/Arith/tcp@127.0.0.1:1", value("weight=2&group=a")),
        ("//rpcx/Arith/unix@/tmp/a.sock", value("")),
        ("//rpcx/Arith/tcp@127.0.0.1:2", None),  # expired between SCAN and MGET
        ("//rpcx/Arith/tcp@127.0.0.1:3", b"not json"),
        ("//rpcx/Arith2/tcp@127.0.0.1:4", value("")),  # another service
        ("//rpcx/Arith/", value("")),
    ]
    assert libkv.servers_from_keys("/rpcx", "Arith", entries) == {
        "tcp@127.0.0.1:1": "weight=2&group=a", "unix@/tmp/a.sock": ""}


def test_glob_escape() -> None:
    assert libkv.glob_escape("//r[p]c*x?\\/Arith/") == "//r\\[p\\]c\\*x\\?\\\\/Arith/"
