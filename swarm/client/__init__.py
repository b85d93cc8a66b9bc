"""The client side of swarm.

api.py        `Client`: generate / stream / chat on the swarm or locally
generate.py   the generation loop shared by both backends: limits, deltas, stop, telemetry
local.py      whole-model llama.cpp engine (local=True)
remote.py     route session over the swarm: one sticky stream per hop
tokenizer.py  llama.cpp vocabulary and the GGUF chat template
text.py       UTF-8-safe streaming deltas and stop strings
telemetry.py  Generation Telemetry records
"""
