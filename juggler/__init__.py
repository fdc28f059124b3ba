"""juggler: websocket RPC and pub-sub over Redis, speaking juggler.0.

- protocol.py     message model over rustext's juggler codec (args stay raw JSON)
- server.py       websocket server: lifecycle, results routing, handler chain, the
                  connections' lifecycle listener
- conn.py         one connection's asyncio driver: in-order processing, limits, timers;
                  ConnContext / ConnListener, all it knows of the server
- wsproto.py      the websocket protocol of a connection, sans-I/O: handshake, frames
                  in and out (rustext), closing handshake, its states
- keepalive.py    keepalive rules, sans-I/O: when to ping, when a peer (or, for a client,
                  its server) counts as gone; the opt-in and the KEEPALIVE extension message
- pending.py      calls waiting for their result, expiring on rustext's deadline heap
- http.py         plain HTTP on the websocket port: /healthz
- static_files.py plain HTTP on the websocket port: /juggler.js, the demo page, /stats.json
- debugvars.py    plain HTTP on the websocket port: /debug/vars, the original's counters page
- auth.py         JWT authentication at the handshake, per-message authorization rules
- limits.py       per-connection limits (the message-rate token bucket, refusal reasons)
- config.py       typed options (ServerConfig, AppConfig) and the TOML loader
- metrics.py      server counters and their Prometheus exposition
- runner.py       a server process: broker + server (+ callees) + metrics until a signal
- api.py          the server HTTP API for backends (publish, disconnect, channels, info, …)
- control.py      the control plane between servers sharing a Redis: heartbeats, requests
                  run on every server (sharded pub-sub)
- static/         juggler.js (the browser client, ES module) + juggler.d.ts, the demo page
- broker/         base.py interfaces · memory.py embedded · redis/ Redis (+ cluster.py)
                  · resp.py the RESP client · glob.py Redis glob patterns
- presence/       who is subscribed to a channel (in memory or Redis) and join/leave notices
- proxy/          the application's backend decides connects, subscribes, publishes and
                  answers RPCs, over HTTP or gRPC (the [[proxy]] tables)
- callee.py       callee runtime; client.py asyncio client; repl.py the REPL; load.py load tool
- tracing.py      OpenTelemetry spans of CALLs: server middleware, callee spans, the context
                  carried in the call payload (the otel extra; imported only when tracing)
- errors.py       exception tree
"""
