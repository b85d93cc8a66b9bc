"""swarm: trackerless peer-to-peer serving of GGUF language models split by layer span.

Packages and modules (see docs/architecture.md for the data flow):
    client/       the public `Client` (generate, stream, chat), local backend, swarm route session
    ggml_bridge/  span slicing, the C layer-span executor, exact token embedding
    kv/           KV-cache arithmetic and the session table of one span
    route/        pure route planning over announced spans
    dht/          hivemind DHT wrapper: identity, signed announcement records
    peer/         `swarm serve`: composition root, stream handler, announcer
    artifacts/    model bytes over BitTorrent (libtorrent), verified per tensor
    arch.py       one row of facts per GGUF architecture
    manifest.py   GGUF → manifest and model_id
    models.py     registry of known models, fetch and verify
    localswarm.py a swarm of real peer processes on this machine (demo, tests, benchmarks)
    reference.py  PyTorch reference of llama-style blocks, for validating architectures
    p2p.py        framed persistent libp2p streams over hivemind's p2pd
    netaddr.py    listen and advertised addresses: IPv4/IPv6 literals, multiaddrs, libtorrent strings
    errors.py     exception types; limits.py product-wide limits
    sampling.py   logits → token, seeded per position
    wire.py       stream frames of the peer protocol
    cli.py        the `swarm` command
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so that `import swarm` does not load llama.cpp or hivemind.
    if name == "Client":
        from swarm.client.api import Client

        return Client
    raise AttributeError(name)


__all__ = ["Client", "__version__"]
