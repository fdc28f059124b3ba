"""juggler/proxy/mapping.py, handshake.py, config.py, stats.py: the sans-I/O
parts of the proxies (no sockets). Answers come from an application we do
not control: every hostile shape must become ProxyBadAnswer, nothing else."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from websockets.datastructures import Headers

from juggler.config import load_config
from juggler.proxy.config import ProxyConfig, proxies_from_toml
from juggler.proxy.errors import ProxyBadAnswer
from juggler.proxy.handshake import (
    allowed_cookies,
    allowed_headers,
    bearer_token,
    remote_address,
)
from juggler.proxy.mapping import (
    ConnectResult,
    PublishResult,
    RefreshResult,
    Refusal,
    RpcResult,
    connect_question,
    decode_answer,
    error_res,
    parse_connect,
    parse_publish,
    parse_refresh,
    parse_rpc,
    parse_subscribe,
    publish_question,
)
from juggler.proxy.stats import ProxyCollector, ProxyStats

pytestmark = pytest.mark.timeout(60)

PARSERS = (parse_connect, parse_refresh, parse_subscribe, parse_publish, parse_rpc)


def test_accepting_answers() -> None:
    assert parse_connect({"result": {"user": "42", "expire_at": 1700000000, "data": {"a": 1},
                                     "channels": ["news"]}}) == ConnectResult(
        user="42", expire_at=1700000000.0, data={"a": 1}, channels=("news",))
    assert parse_connect({"result": {}}) == ConnectResult(user="")  # an anonymous user let in
    assert parse_connect({"result": {"user": "u", "expire_at": 0}}).expire_at is None
    assert parse_refresh({"result": {"expire_at": 5.5}}) == RefreshResult(expire_at=5.5)
    assert parse_refresh({"result": {"expired": True}}).expired
    assert parse_subscribe({"result": {}}) is None
    assert parse_publish({"result": {}}) == PublishResult()
    assert parse_publish({"result": {"data": None}}) == PublishResult(True, b"null")
    assert parse_publish({"result": {"data": {"x": "é"}}}) == PublishResult(True, '{"x":"é"}'.encode())
    assert parse_rpc({"result": {"data": [1, 2]}}) == RpcResult(b"[1,2]")
    assert parse_rpc({"result": {}}) == RpcResult(b"null")


def test_refusals() -> None:
    for parse in (parse_connect, parse_subscribe, parse_publish, parse_rpc):
        assert parse({"error": {"code": 403, "reason": "no"}}) == Refusal(403, "no")
        assert parse({"error": {}}) == Refusal(403, "refused")
        assert parse({"error": {"code": 418}}) == Refusal(418, "refused")
    assert parse_refresh({"error": {"code": 401, "reason": "gone"}}) == RefreshResult(
        expired=True, refusal=Refusal(401, "gone"))
    # an error wins over a result sent with it
    assert parse_subscribe({"result": {}, "error": {"code": 404, "reason": "x"}}) == Refusal(404, "x")


HOSTILE: list[Any] = [
    [], "x", 1, None, True, {}, {"result": None}, {"error": None}, {"other": 1},
    {"result": []}, {"result": "ok"}, {"result": 1}, {"error": "no"}, {"error": []},
    {"error": {"code": "403"}}, {"error": {"code": 403.0}}, {"error": {"code": True}},
    {"error": {"code": 200}}, {"error": {"code": 999}}, {"error": {"code": -1}},
    {"error": {"code": 2**70}}, {"error": {"code": 403, "reason": 5}}, {"error": {"code": 403, "reason": None}},
]
HOSTILE_CONNECT: list[Any] = [
    {"result": {"user": 42}}, {"result": {"user": None}}, {"result": {"user": ["a"]}},
    {"result": {"user": "u", "expire_at": "soon"}}, {"result": {"user": "u", "expire_at": -5}},
    {"result": {"user": "u", "expire_at": float("inf")}}, {"result": {"user": "u", "expire_at": float("nan")}},
    {"result": {"user": "u", "expire_at": True}}, {"result": {"user": "u", "channels": "news"}},
    {"result": {"user": "u", "channels": [1]}}, {"result": {"user": "u", "channels": [""]}},
    {"result": {"user": "u", "channels": {"a": 1}}},
]


@pytest.mark.parametrize("answer", HOSTILE)
@pytest.mark.parametrize("parse", PARSERS)
def test_hostile_answers_are_bad_answers(parse: Any, answer: Any) -> None:
    if parse is parse_refresh and isinstance(answer, dict) and "error" in answer and answer["error"] == {}:
        return
    with pytest.raises(ProxyBadAnswer):
        parse(answer)


@pytest.mark.parametrize("answer", HOSTILE_CONNECT)
def test_hostile_connect_answers(answer: Any) -> None:
    with pytest.raises(ProxyBadAnswer):
        parse_connect(answer)


def test_hostile_refresh_answers() -> None:
    for answer in ({"result": {"expired": "yes"}}, {"result": {"expired": 1}}, {"result": {"expire_at": []}}):
        with pytest.raises(ProxyBadAnswer):
            parse_refresh(answer)


def test_decode_answer_battery() -> None:
    assert decode_answer(b'{"result": {}}') == {"result": {}}
    for body in (b"", b"not json", b'{"result": ', b"[]", b'"x"', b"null", b"\xff\xfe", b"NaN",
                 b'{"result": {"expire_at": NaN}}', b'{"a": Infinity}', b"[" * 100_000 + b"]" * 100_000,
                 b" " * ((1 << 20) + 1)):
        with pytest.raises(ProxyBadAnswer):
            decode_answer(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_any_bytes(body: bytes) -> None:
    """Any bytes: an object, or ProxyBadAnswer; never another exception."""
    try:
        assert isinstance(decode_answer(body), dict)
    except ProxyBadAnswer:
        pass


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["result", "error", "user", "code", "reason", "data", "expire_at", "expired", "channels"]),
        inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(JSON)
def test_parsers_take_any_json(answer: Any) -> None:
    """Any JSON value through every parser: a typed result, or ProxyBadAnswer."""
    for parse in PARSERS:
        try:
            parse(answer)
        except ProxyBadAnswer:
            pass


def test_questions() -> None:
    q = connect_question("c1", remote="127.0.0.1:5", headers={"X-A": "1"}, cookies={}, token=None, path="/ws")
    assert q == {"client": "c1", "transport": "websocket", "protocol": "juggler.0", "user": "", "remote": "127.0.0.1:5",
                 "path": "/ws", "headers": {"X-A": "1"}, "cookies": {}}
    assert "token" in connect_question("c", remote="", headers={}, cookies={}, token="t", path="/")
    assert publish_question("c", "u", channel="ch", args=b'{"a":[1]}')["data"] == {"a": [1]}
    assert publish_question("c", "u", channel="ch", args=None)["data"] is None
    assert json.loads(error_res(504, "slow")) == {"error": {"code": 504, "message": "slow"}}


def test_handshake_allow_lists() -> None:
    headers = Headers()
    headers["Authorization"] = "Bearer tok"
    headers["x-request-id"] = "r1"
    headers["X-Many"] = "a"
    headers["X-Many"] = "b"
    headers["X-Secret"] = "s"
    headers["Cookie"] = "sessionid=abc; other=x"
    headers["Cookie"] = 'theme="dark"'
    assert allowed_headers(headers, ["X-Request-Id", "X-Many", "X-Absent"]) == {"X-Request-Id": "r1", "X-Many": "a, b"}
    assert allowed_cookies(headers, ["sessionid", "theme", "absent"]) == {"sessionid": "abc", "theme": "dark"}
    assert allowed_cookies(headers, []) == {}
    bad = Headers()
    bad["Cookie"] = 'a="unterminated; ;;==; b; =c; c=1=2; d=""'
    assert allowed_cookies(bad, ["a", "b", "", "c", "d"]) == {"a": '"unterminated', "c": "1=2", "d": ""}
    assert bearer_token(headers, "/ws") == "tok"
    assert bearer_token(Headers(), "/ws?token=q&x=1") == "q"
    assert bearer_token(Headers(), "/ws") is None
    assert remote_address(("::1", 5, 0, 0)) == "[::1]:5"
    assert remote_address(("10.0.0.1", 80)) == "10.0.0.1:80"


def test_config_validation() -> None:
    ok = proxies_from_toml([
        {"kind": "connect", "endpoint": "http://127.0.0.1:8000/c", "headers": ["Authorization"], "cookies": ["sid"]},
        {"kind": "subscribe", "endpoint": "grpc://127.0.0.1:50051", "match": ["chat:*"], "timeout": 0.5},
    ])
    assert ok[0].name == "http://127.0.0.1:8000/c" and ok[1].grpc and ok[1].match == ("chat:*",)
    bad: list[tuple[Any, str]] = [
        ({"kind": "sub", "endpoint": "http://h/"}, "kind must be one of"),
        ({"kind": "connect", "endpoint": "ftp://h/"}, "http://, https:// or grpc://"),
        ({"kind": "connect", "endpoint": "grpc://h"}, "needs a port"),
        ({"kind": "connect", "endpoint": "http:///x"}, "names no host"),
        ({"kind": "rpc", "endpoint": "http://h/"}, "needs match"),
        ({"kind": "connect", "endpoint": "http://h/", "match": ["a"]}, "takes no match"),
        ({"kind": "publish", "endpoint": "http://h/", "match": ["a"], "headers": ["X"]}, "only a connect proxy"),
        ({"kind": "connect", "endpoint": "http://h/", "timeout": 0}, "timeout must be"),
        ({"kind": "connect", "endpoint": "http://h/", "timeout": "1"}, "expected"),
        ({"kind": "connect", "endpoint": "http://h/", "tmeout": 1}, "unknown option(s) in [[proxy]] #1: tmeout"),
        ({"endpoint": "http://h/"}, "kind is required"),
        ("x", "must be a table"),
    ]
    for table, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            proxies_from_toml([table])
    with pytest.raises(ValueError, match="a second connect proxy"):
        proxies_from_toml([{"kind": "connect", "endpoint": "http://h/"}] * 2)
    with pytest.raises(ValueError):
        ProxyConfig(kind="rpc", endpoint="http://h/", match=("a",), timeout=float("nan"))


def test_config_file_errors_name_the_line(tmp_path: Any) -> None:
    path = tmp_path / "juggler.toml"
    path.write_text('[server]\nport = 0\n\n[[proxy]]\nkind = "connect"\nendpoint = "http://127.0.0.1:1/c"\n\n'
                    '[[proxy]]\nkind = "subscribe"\nendpoint = "http://127.0.0.1:1/s"\n')
    with pytest.raises(ValueError, match=r"juggler.toml:8: \[\[proxy\]\] #2: kind = \"subscribe\" needs match"):
        load_config(str(path))
    path.write_text('[[proxy]]\nkind = "rpc"\nendpoint = "grpc://127.0.0.1:5"\nmatch = ["app.*"]\n')
    assert load_config(str(path)).proxy[0].match == ("app.*",)


def test_collector_exposes_counters() -> None:
    s = ProxyStats("subscribe", "chat")
    s.calls, s.refusals = 3, 1
    s.error("timeout")
    for seconds in (0.0005, 0.02, 20.0):
        s.observe(seconds)
    registry = CollectorRegistry()
    registry.register(ProxyCollector(lambda: [s]))
    text = generate_latest(registry).decode()
    assert 'juggler_proxy_calls_total{kind="subscribe",name="chat"} 3.0' in text
    assert 'juggler_proxy_refusals_total{kind="subscribe",name="chat"} 1.0' in text
    assert 'juggler_proxy_errors_total{error="timeout",kind="subscribe",name="chat"} 1.0' in text
    assert 'juggler_proxy_duration_seconds_bucket{kind="subscribe",le="0.001",name="chat"} 1.0' in text
    assert 'juggler_proxy_duration_seconds_bucket{kind="subscribe",le="0.025",name="chat"} 2.0' in text
    assert 'juggler_proxy_duration_seconds_bucket{kind="subscribe",le="+Inf",name="chat"} 3.0' in text
    assert 'juggler_proxy_duration_seconds_count{kind="subscribe",name="chat"} 3.0' in text


def test_grpc_messages_map_onto_the_json_objects() -> None:
    from juggler.proxy import proxy_pb2 as pb
    from juggler.proxy.grpc import answer_of, request_of

    q = connect_question("c", remote="1.2.3.4:5", headers={"A": "b"}, cookies={"s": "1"}, token="t", path="/ws")
    req = request_of("connect", q)
    assert (req.client, req.token, dict(req.headers), dict(req.cookies), req.remote) == ("c", "t", {"A": "b"},
                                                                                        {"s": "1"}, "1.2.3.4:5")
    assert not request_of("connect", {**q, "token": None}).HasField("token")
    assert request_of("publish", publish_question("c", "u", channel="ch", args=b'{"a":1}')).data == b'{"a":1}'
    assert not request_of("rpc", {"client": "c", "uri": "x", "data": None}).HasField("data")
    assert request_of("refresh", {"client": "c", "expire_at": None}).expire_at == 0

    ok = pb.ConnectResponse(result=pb.ConnectResult(user="u", expire_at=7, data=b'{"x":1}', channels=["a"]))
    assert parse_connect(answer_of(ok)) == ConnectResult(user="u", expire_at=7.0, data={"x": 1}, channels=("a",))
    assert parse_connect(answer_of(pb.ConnectResponse(result=pb.ConnectResult(user="u")))).expire_at is None
    assert parse_connect(answer_of(pb.ConnectResponse(error=pb.Error(code=401, reason="no")))) == Refusal(401, "no")
    with pytest.raises(ProxyBadAnswer):  # neither a result nor an error
        parse_subscribe(answer_of(pb.SubscribeResponse()))
    assert parse_publish(answer_of(pb.PublishResponse(result=pb.PublishResult()))) == PublishResult()
    assert parse_publish(answer_of(pb.PublishResponse(result=pb.PublishResult(data=b"null")))) == PublishResult(
        True, b"null")
    for bad in (b"\xff", b"{", b"NaN", b""):
        with pytest.raises(ProxyBadAnswer):
            answer_of(pb.RPCResponse(result=pb.RPCResult(data=bad)))
    with pytest.raises(ProxyBadAnswer):
        parse_subscribe(answer_of(pb.SubscribeResponse(error=pb.Error(code=0))))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40), max_size=3),
       st.lists(st.sampled_from(["a", "b", "sid", "", " a", "a b"]), max_size=4))
def test_cookie_allow_list_takes_any_header(values: list[str], allow: list[str]) -> None:
    """Any Cookie headers: a dict of allowed names only, never an exception."""
    headers = Headers()
    for v in values:
        headers["Cookie"] = v
    got = allowed_cookies(headers, allow)
    assert set(got) <= set(allow) and all(isinstance(v, str) for v in got.values())
