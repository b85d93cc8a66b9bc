"""swarm: trackerless peer-to-peer serving of GGUF language models split by layer span.

Packages and modules (see docs/architecture.md for the data flow):
    client/       the public `Client` (generate, stream, chat), local backend, swarm route session
    api/          `swarm api`: OpenAI-compatible HTTP API and health page over one shared `Client`
    ggml_bridge/  span slicing, the C layer-span executor, exact token embedding
    kv/           KV-cache arithmetic, the session table of one span, prefix hashes and KV snapshots
    route/        pure route planning, chains, placement and failover policy over announced spans
    spec/         speculative decoding: drafts, and what a verify pass over the route accepts
    dht/          hivemind DHT wrapper: identity, signed announcement and prefix-holdings records
    peer/         `swarm serve`: composition root, stream handler, step scheduler, announcer
    relay/        relayed streams for peers behind NATs: the relay service, registration, sealed handshake
    artifacts/    model bytes over BitTorrent (libtorrent), verified per tensor
    cli/          the `swarm` command, one module per subcommand
    arch.py       one row of facts per GGUF architecture
    span_rules.py pure: a row's split rules on a model's metadata (legal starts, refused lengths)
    sizing.py     pure: paper sizing of a model card (weights, KV, bytes per hop, peers per route)
    manifest.py   GGUF → manifest and model_id
    models.py     registry of known models, fetch and verify
    gguf_split.py a split GGUF's shards found, checked and merged into one GGUF in the model cache
    localswarm.py a swarm of real peer processes on this machine (demo, tests, benchmarks)
    reference.py  PyTorch reference of llama-style blocks, for validating architectures
    p2p.py        framed persistent libp2p streams over hivemind's p2pd
    direct.py     direct TCP streams, set up over libp2p and sealed with ChaCha20-Poly1305
    dialing.py    a stream to a peer: direct raced against libp2p, no long wait on a dead endpoint
    reach.py      dial-back probes: whether other peers can dial this one, and its public address
    reach_rules.py pure: reachability from dial-back answers, addresses to announce, dial-back budget
    portmap.py    UPnP IGD port mapping on the home router (miniupnpc): discover, map, renew, delete
    portmap_rules.py pure: when to map, which ports, leases and renewal
    peerid.py     the libp2p peer id of an RSA public key (pure; shared by dht/ and kv/)
    netaddr.py    listen and advertised addresses: IPv4/IPv6 literals, multiaddrs, libtorrent strings
    eventloop.py  the event loop of peer processes and the client's loop thread (asyncio or uvloop)
    proctree.py   a process's descendants; children that die with their parent
    errors.py     exception types
    limits.py     product-wide limits, protocol ids, and bounds shared by frames and other checks
    numeric.py    the numeric contract: the ubatch grid every path computes prefills in
    sampling.py   logits → token, seeded per position
    wire.py       stream frames of the peer protocol
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so that `import swarm` does not load llama.cpp or hivemind.
    if name == "Client":
        from swarm.client.api import Client

        return Client
    if name == "Correction":
        from swarm.client.generate import Correction

        return Correction
    raise AttributeError(name)


__all__ = ["Client", "Correction", "__version__"]
