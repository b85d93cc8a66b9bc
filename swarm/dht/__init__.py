"""The DHT: hivemind wrapped once, with signed and schema-checked swarm records.

Files:
    identity.py    data directory and the persistent RSA key that is both the libp2p identity and the
                   record-signing key (stable peer id per data directory)
    records.py     Announcement dataclass, its bounded forward-compatible codec (pydantic schema), DHT keys
                   and subkey tags; pure
    validation.py  hivemind record validator: store- and read-time checks of announcements and blobs
                   (schema, size, peer id bound to the signing key)
    prefix_records.py  a span's prefix holdings record: which prompt prefixes a peer holds KV snapshots
                   of, and where to fetch them; bounded, forward-compatible codec; pure
    storage.py     hivemind's local storage with bounds per key (count, bytes, lifetime, fair among
                   signers), swapped into every swarm DHT node
    clock.py       swarm time: a node's clock offset from ping exchanges (Cristian), median, skew in
                   words; pure
    clockwatch.py  probes other nodes' clocks and sets a node's swarm-time offset, logging a skew
    node.py        SwarmDHT (start, announce, withdraw, get_announcements, store_blob/get_blob, shutdown)
                   and run_dht_only for `swarm dht`

The framed stream transport on the same p2pd lives in swarm/p2p.py (`SwarmDHT.transport`).
This package makes no routing decisions.
"""
