"""The juggler.0 codec against the captured upstream traffic (shared/vectors/juggler)."""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rustext
from rustext import JugglerDecodeError

# Scenarios whose client frames must close the connection (no reply).
PROTOCOL_ERRORS = {
    "invalid_json",
    "unknown_type",
    "server_type_from_client",
    "string_type",
    "float_timeout",
    "string_timeout",
    "invalid_uuid",
    "missing_payload",
}


def load_transcript(shared_dir: str) -> list[dict]:
    path = os.path.join(shared_dir, "vectors", "juggler", "transcript.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def transcript(shared_dir: str) -> list[dict]:
    return load_transcript(shared_dir)


def client_frames(transcript: list[dict]) -> list[dict]:
    return [r for r in transcript if r["direction"] == "client->server"]


def test_accepts_every_valid_client_frame(transcript: list[dict]) -> None:
    frames = [r for r in client_frames(transcript) if r["scenario"] not in PROTOCOL_ERRORS]
    assert len(frames) > 30
    for rec in frames:
        text = rec["frame"]
        for frame in (text, text.encode()):
            msg = rustext.parse_client_message(frame)
            # the first JSON value of the frame (two_json_values: only the first)
            obj, _ = json.JSONDecoder().raw_decode(text)
            assert msg.type == obj["meta"]["type"]
            assert msg.uuid == obj["meta"]["uuid"].lower()
            payload = obj["payload"]
            if msg.type == rustext.CALL:
                assert msg.uri == payload["uri"]
                assert msg.timeout_ns == payload["timeout"]
            else:
                assert msg.channel == payload["channel"]
                assert msg.pattern == payload.get("pattern", False)
            if "args" in payload:
                assert msg.args is not None
                assert json.loads(msg.args) == payload["args"]
            else:
                assert msg.args is None


def test_rejects_every_protocol_error_frame(transcript: list[dict]) -> None:
    frames = [r for r in client_frames(transcript) if r["scenario"] in PROTOCOL_ERRORS]
    assert {r["scenario"] for r in frames} == PROTOCOL_ERRORS
    for rec in frames:
        with pytest.raises(JugglerDecodeError):
            rustext.parse_client_message(rec["frame"])
        with pytest.raises(ValueError):  # the error tree: a DecodeError is a ValueError
            rustext.parse_client_message(rec["frame"].encode())


def test_binary_frame_payload_is_not_a_message(transcript: list[dict]) -> None:
    (rec,) = [r for r in transcript if r["direction"] == "client->server:binary"]
    # the server closes on any binary frame before decoding; its bytes also lack uuid/payload
    with pytest.raises(JugglerDecodeError):
        rustext.parse_client_message(bytes.fromhex(rec["frame"]))


def test_allowed_messages_header_forbids_sub(transcript: list[dict]) -> None:
    mask = rustext.parse_allowed_messages("call, pub")
    recs = [r for r in client_frames(transcript) if r["scenario"] == "allowed_messages_header"]
    kinds = []
    for rec in recs:
        try:
            kinds.append(rustext.parse_client_message(rec["frame"], mask).type)
        except JugglerDecodeError:
            kinds.append(None)
    assert kinds == [rustext.CALL, rustext.PUB, None]
    assert rustext.parse_allowed_messages("*") == rustext.ALL_CLIENT_TYPES
    assert rustext.parse_allowed_messages("") == rustext.ALL_CLIENT_TYPES
    with pytest.raises(JugglerDecodeError):
        rustext.parse_allowed_messages("call, bogus")


def _rebuild(frame: str, requests: dict[str, dict]) -> bytes:
    """Build the same server frame with our codec, from what the server knew."""
    obj = json.loads(frame)
    t = obj["meta"]["type"]
    p = obj["payload"]

    def raw(v: object) -> bytes:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()

    if t == rustext.ACK:
        target = p["uri"] if p["for_type"] == rustext.CALL else p["channel"]
        return rustext.build_ack(p["for"], p["for_type"], target)
    if t == rustext.NACK:
        target = p["uri"] if p["for_type"] == rustext.CALL else p["channel"]
        return rustext.build_nack(p["for"], p["for_type"], target, p["code"], p["message"])
    if t == rustext.RES:
        # the result payload the callee stored holds these args (normalized through the codec)
        stored = rustext.build_call_payload(rustext.new_uuid(), p["for"], p["uri"], raw(p["args"]))
        res = rustext.parse_call_payload(stored)
        return rustext.build_res(res.msg_uuid, res.uri, res.args)
    if t == rustext.EVNT:
        req = requests.get(p["for"])
        if req is not None:
            # the EVNT of a PUB we saw: args come from the PUB, through the pub payload
            pub = rustext.parse_client_message(req["frame"])
            body = rustext.build_pub_payload(pub.uuid, pub.args)
        else:  # raw redis PUBLISH
            body = json.dumps({"msg_uuid": p["for"], "args": p["args"]}).encode()
        msg_uuid, args = rustext.parse_pub_payload(body)
        return rustext.build_evnt(msg_uuid, p["channel"], p.get("pattern"), args)
    raise AssertionError(f"unexpected server type {t}")


def test_reproduces_every_server_frame(transcript: list[dict]) -> None:
    requests = {}
    for rec in client_frames(transcript):
        try:
            requests[rustext.parse_client_message(rec["frame"]).uuid] = rec
        except JugglerDecodeError:
            pass
    server = [r for r in transcript if r["direction"] == "server->client"]
    assert len(server) > 40
    for rec in server:
        ours = _rebuild(rec["frame"], requests)
        assert ours.endswith(b"\n")
        theirs = rec["frame"]
        # same structure, and byte for byte once the fresh meta.uuid is swapped
        our_obj, their_obj = json.loads(ours), json.loads(theirs)
        assert our_obj["meta"]["uuid"] != their_obj["meta"]["uuid"]
        assert rustext.canonical_uuid(our_obj["meta"]["uuid"]) == our_obj["meta"]["uuid"]
        our_obj["meta"]["uuid"] = their_obj["meta"]["uuid"]
        assert our_obj == their_obj
        assert list(our_obj["payload"]) == list(their_obj["payload"])  # key order
        swapped = ours.decode().replace(json.loads(ours)["meta"]["uuid"], their_obj["meta"]["uuid"])
        assert swapped == theirs, rec["scenario"]
        # and a client parses it back
        parsed = rustext.parse_server_message(ours)
        assert parsed.type == their_obj["meta"]["type"]
        assert parsed.for_uuid == their_obj["payload"]["for"]


_MONITOR_ESC = re.compile(rb'\\(x[0-9a-fA-F]{2}|.)', re.S)


def _unrepr(s: bytes) -> bytes:
    def sub(m: re.Match[bytes]) -> bytes:
        e = m.group(1)
        if e.startswith(b"x") and len(e) == 3:
            return bytes([int(e[1:], 16)])
        return {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}.get(e, e)

    return _MONITOR_ESC.sub(sub, s)


def _monitor_args(line: bytes) -> list[bytes]:
    return [_unrepr(m) for m in re.findall(rb'"((?:[^"\\]|\\.)*)"', line)]


def test_call_payloads_match_upstream_bytes(shared_dir: str, transcript: list[dict]) -> None:
    """Our call payload for each CALL equals the one upstream LPUSHed, byte for byte."""
    calls = {}
    for rec in client_frames(transcript):
        try:
            m = rustext.parse_client_message(rec["frame"])
        except JugglerDecodeError:
            continue
        if m.type == rustext.CALL:
            calls.setdefault(m.uuid, m)
    path = os.path.join(shared_dir, "vectors", "juggler", "redis_monitor.txt")
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    checked = 0
    for line in lines:
        if b"[0 lua]" not in line or b'"LPUSH"' not in line:
            continue
        _, key, body = _monitor_args(line)
        if not key.startswith(b"juggler:calls:"):
            continue
        stored = rustext.parse_call_payload(body)
        m = calls[stored.msg_uuid]
        ours = rustext.build_call_payload(stored.conn_uuid, m.uuid, m.uri, m.args)
        assert ours == body
        checked += 1
    assert checked >= 20
    # pub payloads likewise
    pubs = {}
    for rec in client_frames(transcript):
        try:
            m = rustext.parse_client_message(rec["frame"])
        except JugglerDecodeError:
            continue
        if m.type == rustext.PUB:
            pubs[m.uuid] = m
    published = 0
    for line in lines:
        if b'"PUBLISH"' not in line or b"127.0.0.1" not in line:
            continue
        _, _chan, body = _monitor_args(line)
        msg_uuid, args = rustext.parse_pub_payload(body)
        if msg_uuid in pubs:
            assert rustext.build_pub_payload(msg_uuid, pubs[msg_uuid].args) == body
            published += 1
    assert published >= 5


def test_html_escaping_and_raw_utf8() -> None:
    u = rustext.new_uuid()
    frame = rustext.build_call(u, "test.echo", 5_000_000_000, '"a<b>&c\u2028d é"'.encode())
    m = rustext.parse_client_message(frame)
    assert m.args == b'"a\\u003cb\\u003e\\u0026c\\u2028d \xc3\xa9"'
    assert rustext.normalize_json(b' { "k" : [ 1 , 2 ] } ') == b'{"k":[1,2]}'
    with pytest.raises(JugglerDecodeError):
        rustext.normalize_json(b"{} {}")


def test_args_null_and_absent_in_payloads() -> None:
    u = rustext.new_uuid()
    assert b'"args"' not in rustext.build_call_payload(u, u, "x", None)
    assert rustext.parse_call_payload(rustext.build_call_payload(u, u, "x", None)).args is None
    assert rustext.build_pub_payload(u, None) == ('{"msg_uuid":"%s"}' % u).encode()
    evnt = json.loads(rustext.build_evnt(u, "c", None, None))
    assert evnt["payload"]["args"] is None and "pattern" not in evnt["payload"]
    res = json.loads(rustext.build_res(u, "x", None))
    assert res["payload"]["args"] is None


def test_batch_parse_keeps_positions() -> None:
    u = rustext.new_uuid()
    good = rustext.build_call_payload(u, u, "x", b"1")
    out = rustext.parse_call_payloads([good, b"garbage", good])
    assert out[1] is None
    assert out[0].args == b"1" and out[2].msg_uuid == u


def test_bad_input_types() -> None:
    with pytest.raises(TypeError):
        rustext.parse_client_message(123)  # type: ignore[arg-type]
    with pytest.raises(JugglerDecodeError):
        rustext.parse_client_message(b"\xff\xfe")


def test_uuid_helpers() -> None:
    u = rustext.new_uuid()
    assert len(u) == 36 and u == u.lower() and u[14] == "4"
    assert rustext.canonical_uuid(u.upper()) == u
    assert rustext.canonical_uuid("nope") is None
    assert len({rustext.new_uuid() for _ in range(1000)}) == 1000


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_parsers_only_raise_decode_errors(data: bytes) -> None:
    for fn in (rustext.parse_client_message, rustext.parse_server_message, rustext.parse_call_payload,
               rustext.parse_pub_payload, rustext.normalize_json):
        try:
            fn(data)
        except JugglerDecodeError:
            pass


@settings(max_examples=200, deadline=None)
@given(json_values, st.text(max_size=20), st.integers(-(2**63), 2**63 - 1))
def test_fuzz_call_roundtrip(value: object, uri: str, timeout: int) -> None:
    u = rustext.new_uuid()
    raw = json.dumps(value, indent=1).encode()
    m = rustext.parse_client_message(rustext.build_call(u, uri, timeout, raw))
    assert (m.uuid, m.uri, m.timeout_ns) == (u, uri, timeout)
    assert json.loads(m.args) == value
    res = rustext.parse_server_message(rustext.build_res(m.uuid, m.uri, m.args))
    assert json.loads(res.args) == value and res.uri == uri


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_text_frames(text: str) -> None:
    try:
        rustext.parse_client_message(text)
    except JugglerDecodeError:
        pass
