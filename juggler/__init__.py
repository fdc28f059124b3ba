"""juggler: websocket RPC and pub-sub over Redis, speaking juggler.0.

- protocol.py     message model over rustext's juggler codec
- server.py       websocket server; conn.py one connection
- broker/         base.py interfaces · memory.py embedded · redis.py Redis (+ cluster)
- callee.py       callee runtime; client.py asyncio client
- errors.py       exception tree
"""
