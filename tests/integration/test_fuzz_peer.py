"""A live fuzz of a serving peer (tests/helpers/fuzzpeer.py, run longer by scripts/fuzz_peer.py): a few
hundred random and mutated frames over libp2p and direct streams, inside valid sessions and on push
streams, while a normal client generates through it. The peer stays up and the client's text stays
equal to llama.cpp's whole model.

It fuzzes the first peer (0:10) of the shared read-only `smol_swarm`: every fuzz stream is closed
at the end, so the peer holds nothing of it afterwards.
"""

from __future__ import annotations

import asyncio

from swarm import Client
from swarm.manifest import build_manifest

from tests.helpers.fuzzpeer import KINDS, Target, fuzz_peer
from tests.helpers.oracle import oracle
from tests.helpers.peers import RawClient, wait_for

PROMPT = "The three most useful things to know about a hash table are"
N_TOKENS = 12
N_FRAMES = 400


def test_a_live_fuzz_leaves_the_peer_up_and_the_normal_clients_text_identical(smol_swarm, smollm2_path,
                                                                               tmp_path):
    peer = smol_swarm.started[0]
    manifest = build_manifest(smollm2_path)
    expected = oracle(smollm2_path, PROMPT, N_TOKENS)
    assert expected.strip()  # something to compare
    fuzzer = RawClient(peer, manifest.model_id, tmp_path, span=(0, 10))
    try:
        (ann,) = wait_for(lambda: [a for a in fuzzer.loop.run(fuzzer.dht.get_announcements(manifest.model_id), 30)
                                   if a.peer_id == peer.peer_id], "the peer's announcement")
        target = Target(ann.peer_id, ann.addrs, ann.direct_addrs, manifest.model_id, ann.start, ann.end,
                        manifest.n_embd)
        assert target.direct  # the direct-stream episodes have somewhere to go
        with Client(str(smollm2_path), initial_peers=peer.maddrs) as client:
            run = asyncio.run_coroutine_threadsafe(fuzz_peer(fuzzer.dht.transport, target, N_FRAMES, seed=1),
                                                   fuzzer.loop.loop)
            texts = []
            while not run.done():
                texts.append(client.generate(PROMPT, max_new_tokens=N_TOKENS).text)
            report = run.result()
            texts.append(client.generate(PROMPT, max_new_tokens=N_TOKENS).text)
    finally:
        fuzzer.close()
    assert peer.proc.poll() is None, peer.stderr_text()[-3000:]
    assert report.frames >= N_FRAMES and set(report.by_kind) == set(KINDS), report
    assert texts == [expected] * len(texts)
