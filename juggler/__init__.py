"""juggler: websocket RPC and pub-sub over Redis, speaking juggler.0.

- protocol.py     message model over rustext's juggler codec (args stay raw JSON)
- server.py       websocket server: results routing, handler chain, lifecycle
- conn.py         one connection: handshake, frames, in-order processing, limits
- config.py       typed options (ServerConfig, AppConfig) and the TOML loader
- metrics.py      server counters and their Prometheus exposition
- runner.py       a server process: broker + server (+ callees) + metrics until a signal
- static_files.py plain HTTP on the websocket port: /juggler.js, the demo page, /stats.json
- static/         juggler.js (the browser client, ES module) + juggler.d.ts, the demo page
- broker/         base.py interfaces · memory.py embedded · redis.py Redis (+ cluster)
                  · glob.py Redis glob patterns
- callee.py       callee runtime; client.py asyncio client; repl.py the REPL; load.py load tool
- errors.py       exception tree
"""
