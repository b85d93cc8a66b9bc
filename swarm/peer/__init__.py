"""A serving peer: `swarm serve`.

Files:
    server.py    composition root: model → manifest → DHT → span → executor → handler → announcer
    handler.py   one client stream: the session loop of the span protocol (swarm/wire.py)
    announce.py  the span's DHT announcement: periodic refresh, withdrawal on shutdown
"""
