"""A test application answering juggler's proxies, over HTTP or gRPC.

    python -m tests.juggler.proxybackend http PORT
    python -m tests.juggler.proxybackend grpc PORT

One decision function for both transports, keyed by what is asked, so one
process covers the good, the refusing, the slow and the garbage-answering
backend: the token ``alice`` connects (and is told back the headers and
cookies it got), ``banned`` is refused 403, ``slow`` answers after
SLOW seconds, ``garbage`` answers something that is no answer, ``crash``
fails (HTTP 500, gRPC INTERNAL); channels and URIs the same by their
suffix (``chat:no``, ``chat:slow``, ``app.garbage``…).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

SLOW = 3.0


class Garbage(Exception):
    """Answer with something that is not an answer."""


class Crash(Exception):
    """Fail the request (HTTP 500, gRPC INTERNAL)."""


async def decide(kind: str, q: dict[str, Any]) -> dict[str, Any]:
    """The answer object to question `q` of `kind`."""
    key = {"connect": q.get("token") or "", "refresh": q.get("user", ""), "subscribe": q.get("channel", ""),
           "publish": q.get("channel", ""), "rpc": q.get("uri", "")}[kind]
    tail = key.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    if tail == "slow":
        await asyncio.sleep(SLOW)
    if tail == "garbage":
        raise Garbage
    if tail == "crash":
        raise Crash
    if tail == "badcode":
        return {"error": {"code": 999, "reason": "a code out of range"}}
    if tail in ("no", "banned"):
        return {"error": {"code": 403, "reason": f"{kind} refused for {key}"}}
    if tail == "e504":
        return {"error": {"code": 504, "reason": "upstream of the application timed out"}}
    if tail == "teapot":
        return {"error": {"code": 418, "reason": "short and stout"}}
    if kind == "connect":
        if not key:
            return {"error": {"code": 401, "reason": "who are you?"}}
        # "….short": credentials that expire in about two seconds
        ttl = 2 if tail == "short" else 3600
        return {"result": {"user": key, "expire_at": int(time.time()) + ttl, "channels": ["news", "user#" + key],
                           "data": {"headers": q.get("headers"), "cookies": q.get("cookies"),
                                    "remote": q.get("remote"), "path": q.get("path"), "client": q.get("client")}}}
    if kind == "refresh":
        if key.split(".")[0] == "gone":
            return {"result": {"expired": True}}
        return {"result": {"expire_at": 2_000_000_000, "data": {"refreshed": key, "had": q.get("data")}}}
    if kind == "publish" and tail == "replace":
        return {"result": {"data": {"replaced": q.get("data"), "by": q.get("user")}}}
    if kind == "rpc" and tail in ("big", "huge"):  # past what one read gives; past the limit
        return {"result": {"data": "x" * (300_000 if tail == "big" else (1 << 20) + 10)}}
    if kind == "rpc":
        return {"result": {"data": {"echo": q.get("data"), "user": q.get("user"), "uri": q.get("uri")}}}
    return {"result": {}}


# HTTP -------------------------------------------------------------------------------------


async def serve_http(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        q = await request.json()
        try:
            answer = await decide(kind, q)
        except Garbage:
            return web.Response(body=b'{"result": {"user": ', content_type="application/json")
        except Crash:
            return web.Response(status=500, text="Internal Server Error")
        if kind == "connect" and q.get("token") == "wrongtype":
            answer = {"result": {"user": 42}}
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/juggler/{kind}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


# gRPC -------------------------------------------------------------------------------------


async def serve_grpc(port: int) -> None:
    import grpc

    from juggler.proxy import proxy_pb2 as pb
    from juggler.proxy import proxy_pb2_grpc

    def question(request: Any) -> dict[str, Any]:
        q: dict[str, Any] = {}
        for desc in request.DESCRIPTOR.fields:
            value = getattr(request, desc.name)
            if desc.name == "data":
                q["data"] = json.loads(value) if request.HasField("data") else None
            elif desc.name == "token":
                q["token"] = value if request.HasField("token") else None
            elif desc.message_type is not None and desc.message_type.GetOptions().map_entry:
                q[desc.name] = dict(value)
            else:
                q[desc.name] = value
        return q

    def response(cls: Any, answer: dict[str, Any]) -> Any:
        if "error" in answer:
            return cls(error=pb.Error(code=answer["error"]["code"], reason=answer["error"]["reason"]))
        result_cls = type(cls().result)
        fields: dict[str, Any] = {}
        for k, v in answer.get("result", {}).items():
            fields[k] = json.dumps(v).encode() if k == "data" else v
        return cls(result=result_cls(**fields))

    def method(kind: str, cls: Any) -> Any:
        async def handler(request: Any, context: Any) -> Any:
            try:
                answer = await decide(kind, question(request))
            except Garbage:
                if kind == "subscribe":
                    return cls(error=pb.Error(code=999, reason="garbage"))
                return cls(result=type(cls().result)(data=b"\xff not json"))
            except Crash:
                await context.abort(grpc.StatusCode.INTERNAL, "crashed")
            return response(cls, answer)

        return handler

    class Servicer(proxy_pb2_grpc.JugglerProxyServicer):
        Connect = staticmethod(method("connect", pb.ConnectResponse))
        Refresh = staticmethod(method("refresh", pb.RefreshResponse))
        Subscribe = staticmethod(method("subscribe", pb.SubscribeResponse))
        Publish = staticmethod(method("publish", pb.PublishResponse))
        RPC = staticmethod(method("rpc", pb.RPCResponse))

    server = grpc.aio.server()
    proxy_pb2_grpc.add_JugglerProxyServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    transport, port = sys.argv[1], int(sys.argv[2])
    serve = serve_http if transport == "http" else serve_grpc
    try:
        asyncio.run(serve(port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
