"""A real grpcio backend for the balancer's gRPC tests (run as a subprocess).

    python grpc_backend.py [HOST:]PORT NAME [CERT KEY]   prints "ready" once serving (TLS with CERT KEY);
                                                        SIGTERM stops it gracefully (GOAWAY, calls
                                                        finish) and prints "stopping"

A generic service ``test.Echo`` on raw bytes (no generated code):

Unary          ``NAME:request``; trailing metadata ``x-backend: NAME`` and every
               ``x-*`` request metadata echoed as initial metadata
Fail           aborts with NOT_FOUND, ``no such thing: request``
Slow           sleeps ``float(request)`` seconds, then ``NAME``
MaxInFlight    the most ``Slow`` calls it ever had in flight at once (ASCII)

``GRPC_MAX_STREAMS=N`` in the environment sets the server's
``SETTINGS_MAX_CONCURRENT_STREAMS`` (grpcio's ``grpc.max_concurrent_streams``).
ServerStream   ``int(request)`` messages ``NAME:i``, each flushed as it is made
ClientStream   ``NAME:`` and every request joined by ``,``
Bidi           each request back as ``NAME:request``, as it comes
SetHealth      ``SERVICE=STATUS`` (e.g. ``=2``, ``test.Echo=1``): what the health service answers
HealthChecks   ``CHECKS,CONNECTIONS``: the health checks answered, and from how many client connections

``grpc.health.v1.Health/Check`` as grpcio-health-checking serves it (messages
encoded by hand): the status set for the service asked about (``""`` and
``test.Echo`` start SERVING), NOT_FOUND for any other service.
``GRPC_HEALTH=off`` leaves the health service out (calls get UNIMPLEMENTED).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "test.Echo"


def handlers(name: str) -> tuple[grpc.GenericRpcHandler, grpc.GenericRpcHandler]:
    tag = name.encode()
    lock = threading.Lock()
    in_flight = [0, 0]  # now, most

    def unary(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        echoed = tuple((k, v) for k, v in ctx.invocation_metadata() if k.startswith("x-"))
        if echoed:
            ctx.send_initial_metadata(echoed)
        ctx.set_trailing_metadata((("x-backend", name),))
        return tag + b":" + req

    def fail(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing: " + req.decode())
        raise AssertionError("abort raises")

    def slow(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        time.sleep(float(req))
        with lock:
            in_flight[0] -= 1
        return tag

    def max_in_flight(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        return str(in_flight[1]).encode()

    def server_stream(req: bytes, ctx: grpc.ServicerContext):
        for i in range(int(req)):
            yield tag + b":%d" % i

    def client_stream(reqs, ctx: grpc.ServicerContext) -> bytes:
        return tag + b":" + b",".join(reqs)

    health = {"": 1, SERVICE: 1}  # HealthCheckResponse.ServingStatus by service; 1 = SERVING

    def set_health(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        service, _, status = req.decode().partition("=")
        health[service] = int(status)
        return b""

    checked: list[str] = []  # the peer (client address and port) of each check

    def health_checks(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        return b"%d,%d" % (len(checked), len(set(checked)))

    def check(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        checked.append(ctx.peer())
        service = req[2:2 + req[1]].decode() if req else ""  # HealthCheckRequest{string service = 1}
        if service not in health:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return b"\x08" + bytes([health[service]]) if health[service] else b""  # HealthCheckResponse{status = 1}

    def bidi(reqs, ctx: grpc.ServicerContext):
        for r in reqs:
            yield tag + b":" + r

    return grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "MaxInFlight": grpc.unary_unary_rpc_method_handler(max_in_flight),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "SetHealth": grpc.unary_unary_rpc_method_handler(set_health),
        "HealthChecks": grpc.unary_unary_rpc_method_handler(health_checks),
    }), grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(check),
    })


def main() -> None:
    addr, name = sys.argv[1], sys.argv[2]
    if ":" not in addr:
        addr = f"127.0.0.1:{addr}"
    options = []
    if "GRPC_MAX_STREAMS" in os.environ:
        options.append(("grpc.max_concurrent_streams", int(os.environ["GRPC_MAX_STREAMS"])))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options)
    echo, health = handlers(name)
    server.add_generic_rpc_handlers((echo,) if os.environ.get("GRPC_HEALTH") == "off" else (echo, health))
    if len(sys.argv) > 4:
        with open(sys.argv[3], "rb") as c, open(sys.argv[4], "rb") as k:
            creds = grpc.ssl_server_credentials(((k.read(), c.read()),))
        port = server.add_secure_port(addr, creds)
    else:
        port = server.add_insecure_port(addr)
    if port == 0:
        sys.exit(f"cannot listen on {addr}")
    server.start()
    # SIGTERM: a graceful stop (GOAWAY; calls in flight finish within 5 s), as servers are restarted
    def stop(*_: object) -> None:
        server.stop(grace=5)
        print("stopping", flush=True)

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
