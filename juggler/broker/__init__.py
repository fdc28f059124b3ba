"""juggler/broker: where calls, results and events go between server and callees.

- base.py     the interfaces (CallerBroker, CalleeBroker, PubSubBroker) and records
- memory.py   one process, Redis semantics (the embedded default of `juggler up`)
- redis.py    Redis with upstream's exact keys and scripts; resp.py its RESP client
- glob.py     Redis glob pattern matching (pattern subscriptions in memory)
"""
