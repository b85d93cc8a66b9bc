"""The client side of swarm.

api.py         `Client`: generate / stream / chat on the swarm or locally
generate.py    the generation loop shared by both backends: limits, deltas, stop, telemetry, and the
               repair after a caught peer (`Rewind` in, `Correction` out)
engine.py      the interfaces both backends implement (Engine, EngineSession), `StepResult`, `Rewind`
local.py       whole-model llama.cpp engine (local=True)
draftmodel.py  draft models of speculative decoding: a GGUF with the target's tokenizer (or the
               target requantized lower, made once into the cache) run greedily on llama.cpp
session.py     one generation's route: sticky hops, push chaining, failover by replay (links, clock injected)
checks.py      spot checks of a route's hops: a hop's recorded steps replayed on another peer, compared
               within the band; caught peers excluded, priced, reported
link.py        the link protocol a route session drives (send / recv), its directory, Error frames
               as exceptions
remote.py      the swarm engine (a RouteSession per generation) and `connect_swarm` (joining for a model)
remote_session.py  one generation on the swarm engine: prompt chunks, decode steps (the next one sent
               from the loop thread as soon as its token is back), verify passes
loop.py        the client's asyncio loop in a background thread, for synchronous callers
connection.py  the client's DHT node (client mode) on that loop
directory.py   `DHTDirectory`: the model's announcements from the DHT, RTTs by ping
streams.py     `P2PTransport`, `P2PLink`: span streams to peers, direct TCP or libp2p
status.py      `swarm status`: the swarm's peers and coverage of a model
tokenizer.py   llama.cpp vocabulary and the GGUF chat template
text.py        UTF-8-safe streaming deltas and stop strings
telemetry.py   Generation Telemetry records

No module here imports swarm.peer; the route session's decisions are pure functions in swarm.route.
"""
