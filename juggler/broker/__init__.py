"""juggler/broker: where calls, results and events go between server and callees.

- base.py     the interfaces (CallerBroker, CalleeBroker, PubSubBroker) and records
- memory.py   one process, Redis semantics (the embedded default of `juggler up`)
- redis/      Redis with upstream's exact keys and scripts (keys, config, pushes, pops,
              results, pubsub, broker); resp.py its RESP client; cluster.py the
              Redis Cluster router (slots, redirections, retries)
- glob.py     Redis glob pattern matching (pattern subscriptions in memory)
"""
