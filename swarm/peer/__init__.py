"""A serving peer: `swarm serve`.

Files:
    server.py    composition root: config → ports → DHT → span → stream handlers → announcer →
                 rebalancer; shutdown
    config.py    `ServeConfig`, the options of `swarm serve`, and the check that refuses unusable ones
    build.py     opening the span: model file → manifest → layers → executor → measured `Span`;
                 moving it
    span.py      the served span: executor, session table, scheduler, drain, prefix service, and the
                 operations that keep the table and the executor's KV cache in step
    rules.py     pure decisions shared with sim/: Open refusals, pushed steps, rewinds, truncate and
                 restore preconditions, the announced record
    handler.py   one client stream: the session loop of the span protocol (swarm/wire.py)
    quotas.py    pure limits per remote client (streams, frame bytes in flight) and the peer's caps
    push.py      server push: a chained session's stream to its next hop, push streams from the previous
    scheduler.py a span's executor work: decode steps of many sessions batched, prefills cut into
                 chunks, inline or threaded by measured cost
    step_plan.py pure: which unit runs next (cost-weighted fair share across clients, batches that
                 stay cheap for a light client) and when to hold one back for a light client's step
    exact_rows.py the verify group of a span: rows of one session's step computed exactly as one-row
                 steps, probed at load (speculative decoding)
    checkpoints.py rollback of a verify pass's rows on a span whose cache cannot truncate (recurrent
                 or compressed state): the state exported before the pass, the rows after it
    announce.py  the span's DHT announcement: periodic refresh, withdrawal on shutdown
    metrics.py   `--metrics-port`: Prometheus metrics of the span (sessions, frames, reply latency)
    rebalance.py a peer's periodic re-evaluation of its span: drain, then move, when placement says so
    snapshots.py prefix KV snapshots: keep, restore, announce, serve to and fetch from other peers
    testlie.py   TEST ONLY (`SWARM_TEST_LIE`): a peer that lies about its hidden states, or serves a
                 lower quantization, so spot checks can be tested on real peers
"""
