"""Model artifacts over BitTorrent (libtorrent): publish, seed, fetch only a span's bytes, verify.

Files:
- plan.py: pure byte arithmetic: span -> byte ranges -> pieces -> tensors covered.
- torrent.py: make/parse the hybrid v1+v2 torrent of one GGUF, content-named by its model_id.
- session.py: `ArtifactSession`, the one owner of a libtorrent session: seed, fetch (piece
  priorities, resume, bad-peer handling, per-tensor sha256 check), metadata by info-hash.
- events.py: libtorrent alerts -> per-fetch bookkeeping (bytes per peer, bad pieces, bans).
- verify.py: sha256 of the header and each fetched tensor of a local file vs the manifest.
- records.py: encode/decode of the manifest and seeder DHT records (bounded, validated).
- distribute.py: the records under the model_id in our DHT; `publish` (seed a whole file) and
  `acquire` (find manifest and seeders, fetch a span's or a client's bytes, verified).
- publisher.py: `swarm publish`, a foreground seeder.

Flow: manifest (swarm.manifest) -> torrent.py -> records.py -> DHT (distribute.py); a fetcher reads
the records, plans ranges with plan.py and calls `ArtifactSession.fetch`. Executors only read local
files. Only distribute.py and publisher.py talk to the DHT; nothing here runs a model.
"""
