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

REACH_PROTOCOL = "/swarm/reach/1"
"""A peer asks another to dial it back at the address it was seen at (swarm/reach.py)."""

SNAPSHOT_PROTOCOL = "/swarm/kvsnap/1"
"""Fetches a prefix KV snapshot from the peer that holds it (swarm/peer/snapshots.py)."""

MAX_FORWARD_TOKENS = 2048
"""Most rows one Forward frame may carry (our client sends 256 by default): a bigger prefill must come
in several frames, so one frame's compute stays bounded and its chunks queue fairly."""

MAX_VERIFY_ROWS = 64
"""Most rows one verify pass may carry (`Forward.verify`): the last accepted token and up to 63
drafted tokens; the last span answers one sampled token per row (`Token.tokens`)."""

MTP_MAX_DRAFTS = 8
"""The most drafts a last span's multi-token-prediction head chains per answer (`Token.draft`;
csrc/swarm_span.h SWARM_MTP_MAX_DRAFTS, which must equal it)."""

MTP_TRUNCATE_ROWS = 2 * MAX_VERIFY_ROWS
"""How far back a last span with a multi-token-prediction head on a cache that truncates exactly
can cut a sequence: a verify pass and one sent ahead of its answer roll back together
(`SpanExecutor.truncate_depth`; csrc/swarm_span.h SWARM_MTP_TRUNCATE_ROWS, which must equal it)."""

# ---- bounds the stream protocol (swarm/wire.py) shares with other checks ----------------------------

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Largest frame body either side accepts (header + tensor): the stream transports (swarm/p2p.py,
swarm/direct.py) refuse a longer length prefix, swarm/wire.py a longer body; clients chunk bigger
prefills."""

MAX_LAYERS = 4096
"""Largest global layer index + 1 a span or a model (swarm/manifest.py) may name."""

MAX_HIDDEN = 65_536
"""Largest hidden size (n_embd) of a model, and tensor columns of a hidden-state frame: a row is
n_embd x the arch row's `boundary_width` wide (deepseek4: 4 residual streams), which must fit too."""

MAX_VOCAB = 1 << 20
"""Largest vocabulary: tensor columns of a logits tensor, and a model's n_vocab."""

MAX_ADDR_CHARS = 256
"""Longest multiaddr, in an announcement (swarm/dht/records.py) or a `Chain` frame."""

MAX_PREFIX_OFFERS = 64
"""Most (n_tokens, hash) prefix offers one Open may carry (~38 B each in msgpack, under wire's
MAX_HEADER_BYTES): swarm/kv/prefix.py makes at most this many, swarm/wire.py refuses more."""

PREFIX_HASH_BYTES = 32
"""Bytes of one prefix's chain hash (sha256, swarm/kv/prefix.py)."""

# ---- DHT records (swarm/dht) -----------------------------------------------------------------------

EXPIRY_PERIODS = 2.5
"""A peer's announcement lives this many of its refresh periods (swarm/peer/announce.py), so one lost
refresh does not drop the peer."""

MAX_RECORD_TTL_S = 600.0
"""Longest a DHT record may live past now, seconds: every node's storage (swarm/dht/storage.py) refuses
a later expiration. Covers an announcement (2.5 announce periods: 75 s at the default 30 s period, so
periods up to 240 s) and the 300 s manifest and seeder blobs, while a stranger's record vanishes within
10 minutes."""

MAX_RECORD_BYTES = 68 * 1024
"""Largest DHT record a node stores, bytes of subkey plus signed value: a 64 KiB blob with its name,
owner marker and signature fits."""

MAX_SUBKEYS_PER_KEY = 4096
"""Most subkeys a node stores, and a reader accepts, under one DHT key; more are dropped (storage:
the biggest signer's first; reader: with a log line)."""

MAX_SUBKEYS_PER_OWNER = 128
"""Most subkeys one signing key may hold under one DHT key, in a node's storage and in what a reader
accepts (a publisher writes up to 48 manifest parts; a peer one announcement)."""

MAX_KEY_BYTES = 3 * 1024 * 1024
"""Most bytes (subkeys plus signed values) a node stores under one DHT key: what a reader downloads
from it for one key stays under hivemind's 4 MiB message limit, past which the key could not be read
at all."""
