"""Product-wide limits and protocol ids, in one place so that every check quotes the same number and
every stream the same name (the frames themselves are defined in swarm/wire.py)."""

MAX_CONTEXT_TOKENS = 131_072
"""Hard cap on tokens per session (prompt + generated), whatever the model supports."""

MAX_GGUF_KV = 4096
"""Most metadata keys a GGUF header may hold (real models have 30-60)."""

MAX_GGUF_TENSORS = 65_536
"""Most tensors a GGUF may hold (a 61-layer mixture of experts has about 1,100)."""

MAX_GGUF_ARRAY_LEN = 1 << 22
"""Most elements of one GGUF metadata array (vocabularies and merge lists have up to ~300,000)."""

MAX_GGUF_TENSOR_DIMS = 4
"""ggml's GGML_MAX_DIMS."""

SPAN_PROTOCOL = "/swarm/span/1"
"""libp2p protocol name of the span stream: one client session on one peer (swarm/peer/handler.py)."""

PUSH_PROTOCOL = "/swarm/push/1"
"""Protocol of a push stream: one peer sends a chained session's outputs to the next hop's peer."""

PING_PROTOCOL = "/swarm/ping/1"
"""Echo protocol every swarm node serves (swarm/p2p.py): `swarm status` and route planning ping it."""

DIRECT_PROTOCOL = "/swarm/direct/1"
"""Sets up a direct TCP stream to a peer over an authenticated libp2p stream (swarm/direct.py)."""

SNAPSHOT_PROTOCOL = "/swarm/kvsnap/1"
"""Fetches a prefix KV snapshot from the peer that holds it (swarm/peer/snapshots.py)."""

MAX_FORWARD_TOKENS = 2048
"""Most rows one Forward frame may carry (our client sends 256 by default): a bigger prefill must come
in several frames, so one frame's compute stays bounded and its chunks queue fairly."""
