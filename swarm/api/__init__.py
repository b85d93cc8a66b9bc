"""`swarm api`: an OpenAI-compatible HTTP API and a live health page for one model on the swarm.

Files:
    server.py         composition root of `swarm api`: binds the port, builds the client, monitor and app,
                      runs uvicorn until SIGINT/SIGTERM
    app.py            the routes (FastAPI): /v1/models, /v1/chat/completions, /v1/completions (streamed as
                      server-sent events or whole), /, /v1/swarm/status, /metrics; OpenAI-style errors
    openai_schema.py  request and response bodies (pydantic), `ApiError`
    service.py        the served model: requests → token streams of one shared `swarm.Client`, each on a
                      worker thread; swarm errors → HTTP statuses (400, 413, 503 + Retry-After, 502)
    health.py         `HealthMonitor`: `swarm status`'s report refreshed every few seconds; the page's JSON
    health.html       the health page: plain HTML and a script polling /v1/swarm/status
    metrics.py        Prometheus metrics: per request, per peer, and the monitor's last report

Flow: HTTP request → app.py → service.py → swarm.client (route, sessions on peers) → deltas → app.py.
This package does not route, sample or talk to peers itself: `swarm.client` does.
"""
