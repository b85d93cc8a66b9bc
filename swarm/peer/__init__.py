"""A serving peer: `swarm serve`.

Files:
    server.py    composition root: model → manifest → DHT → span → executor → handler → announcer
    handler.py   one client stream: the session loop of the span protocol (swarm/wire.py)
    scheduler.py a span's executor work: decode steps of many sessions batched, prefills cut into
                 fair chunks, inline or threaded by measured cost
    announce.py  the span's DHT announcement: periodic refresh, withdrawal on shutdown
    metrics.py   `--metrics-port`: Prometheus metrics of the span (sessions, frames, reply latency)
"""
