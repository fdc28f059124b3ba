"""libkv's Redis store layout, as Go rpcx reads and writes it (sans-I/O).

Go rpcx's ``serverplugin.RedisRegisterPlugin`` and rpcx-redis's
``RedisDiscovery`` both go through github.com/rpcxio/libkv v0.5.1
(``store/redis``). A libkv path ``P`` lives at the Redis key ``"/" + P``
(libkv's ``store.Normalize``; rpcx's base path ``/rpcx`` starts with a slash,
hence keys such as ``//rpcx/Arith/tcp@127.0.0.1:8972``) as a string holding
the JSON of a ``store.KVPair``::

    {"Key":"/rpcx/Arith/tcp@127.0.0.1:8972","Value":"Z3JvdXA9Y2FuYXJ5","LastIndex":762640776}

``Value`` is base64 (Go's ``[]byte``), here the rpcx metadata
``group=canary``; ``LastIndex`` is libkv's ``sequenceNum`` (the nanosecond
within the current second). Besides one key per server, with a TTL, the
plugin writes two "directories" without one: the base path (value
``rpcx_path``) and the service path (value: the service name).

This module builds and parses those keys and values; ``rpc.discovery.redis``
does the I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass

#: the value rpcx's plugin gives the base path "directory"
BASE_DIR_VALUE = b"rpcx_path"

_GLOB_SPECIAL = frozenset("\\*?[]")


@dataclass(frozen=True, slots=True)
class KVPair:
    """libkv's ``store.KVPair``: the libkv path (not the Redis key), the raw value, and its index."""

    key: str
    value: bytes
    last_index: int


def normalize(path: str) -> str:
    """The Redis key of a libkv path (``store.Normalize``: a slash in front, nothing else changed)."""
    return "/" + path


def service_path(base: str, service: str) -> str:
    """The libkv path of a service "directory", as rpcx's plugin formats it (``%s/%s``)."""
    return f"{base}/{service}"


def server_path(base: str, service: str, address: str) -> str:
    """The libkv path of one server of a service (``%s/%s/%s``: the base is used as given)."""
    return f"{base}/{service}/{address}"


def sequence_num(now_ns: int) -> int:
    """libkv's ``LastIndex`` for a write at ``now_ns`` (Unix nanoseconds): Go's ``time.Now().Nanosecond()``."""
    return now_ns % 1_000_000_000


def encode_pair(pair: KVPair) -> bytes:
    """The JSON Go's ``encoding/json`` writes for a ``store.KVPair``, byte for byte: fields in
    declaration order, no spaces, UTF-8, and ``<``, ``>``, ``&``, U+2028, U+2029 escaped."""
    doc = json.dumps(
        {"Key": pair.key, "Value": base64.b64encode(pair.value).decode("ascii"), "LastIndex": pair.last_index},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    # those characters can only occur inside the JSON strings, so replacing them everywhere is exact
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        doc = doc.replace(char, escaped)
    return doc.encode()


def decode_pair(raw: bytes | str) -> KVPair:
    """Parse a stored ``store.KVPair`` as Go's ``json.Unmarshal`` does (field names matched
    case-insensitively, a null ``Value`` is empty). Raises ValueError for anything else."""
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a libkv KVPair (bad JSON: {exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a libkv KVPair (not a JSON object)")  # noqa: TRY004 - bad data, not a bad argument
    fields = {name.lower(): value for name, value in doc.items()}
    key, value, index = fields.get("key", ""), fields.get("value"), fields.get("lastindex", 0)
    if not isinstance(key, str) or not isinstance(index, int) or index < 0:
        raise ValueError("not a libkv KVPair (Key must be a string, LastIndex an unsigned integer)")
    if value is None:
        data = b""
    elif isinstance(value, str):
        try:
            data = base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
        except binascii.Error as exc:
            raise ValueError(f"not a libkv KVPair (Value is not base64: {exc})") from None
    else:
        raise ValueError("not a libkv KVPair (Value must be a base64 string)")
    return KVPair(key=key, value=data, last_index=index)


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis glob pattern (SCAN MATCH, PSUBSCRIBE)."""
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


def servers_prefix(base: str, service: str) -> str:
    """The Redis key prefix of a service's server entries (its directory key and a slash)."""
    return normalize(service_path(base, service)) + "/"


def servers_from_keys(base: str, service: str, entries: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """The servers of ``service``: address → metadata, from (Redis key, stored value)
    pairs as SCAN and MGET return them.

    As rpcx-redis does, the address is what follows the service directory
    (``unix@/tmp/a.sock`` keeps its slashes) and the metadata is the value's
    bytes as text; keys outside the directory (a sibling service whose name
    starts with this one's), the directory itself, vanished keys and values
    that are not libkv pairs are skipped.
    """
    prefix = servers_prefix(base, service)
    out: dict[str, str] = {}
    for key, raw in entries:
        if raw is None or not key.startswith(prefix) or len(key) == len(prefix):
            continue
        try:
            pair = decode_pair(raw)
        except ValueError:
            continue
        out[key[len(prefix):]] = pair.value.decode("utf-8", "replace")
    return out
