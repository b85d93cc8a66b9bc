"""The client side of swarm.

api.py        `Client`: generate / stream / chat on the swarm or locally
generate.py   the generation loop shared by both backends: limits, deltas, stop, telemetry
local.py      whole-model llama.cpp engine (local=True)
session.py    one generation's route: sticky hops, failover by replay (transport and clock injected)
remote.py     the swarm engine: DHT directory, libp2p links, the loop thread
tokenizer.py  llama.cpp vocabulary and the GGUF chat template
text.py       UTF-8-safe streaming deltas and stop strings
telemetry.py  Generation Telemetry records
"""
