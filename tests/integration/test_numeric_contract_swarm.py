"""The numeric contract (swarm/numeric.py) on the swarm: every prefill chunk size gives llama.cpp's
whole model token for token.

`smol_swarm` (SmolLM2 as 0:10, 10:20, 20:30, 1 thread per peer). Prompts of 200, 300, 600 and 1,100
tokens cut from tests/data/contract_prompt.txt, 48 new tokens, greedy and seeded (T 0.8, seed 1):
a client at prefill chunk 64, 256 and 512 (prefix reuse off, so every row is computed) must give
the token ids of llama.cpp's whole model run under the contract (tests/helpers/oracle.py,
`contract_tokens`: n_ubatch 64, decode steps on 1 thread), which the local backend also gives
(tests/model/test_numeric_contract.py). Then a prompt that restores a cached prefix on every hop
gives them too. Before decode steps ran on 1 thread everywhere, the oracle and the local backend
decoded on 2 threads and this route parted from them at token 4-8 of the 300-1,100-token prompts.

Gemma-3 270M across its 512-token sliding window: two peers (0:9 on 1 thread, 9:18 on 2: a peer's
`--threads` serves only its multi-row steps) of this module, prompts of 600 and 1,100 tokens,
chunks 64 and 512, greedy and seeded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from swarm import Client
from swarm.localswarm import PeerSet

from tests.helpers.oracle import contract_tokens
from tests.helpers.peers import serve_args

TEXT = Path(__file__).resolve().parents[1] / "data" / "contract_prompt.txt"
LENGTHS = (200, 300, 600, 1100)
CHUNKS = (64, 256, 512)
GEMMA_LENGTHS = (600, 1100)  # past Gemma-3 270M's 512-token sliding window
GEMMA_CHUNKS = (64, 512)
N_NEW = 48
SAMPLINGS = {"greedy": (0.0, 0), "seeded": (0.8, 1)}  # (temperature, seed)


@contextmanager
def chunk_clients(model: Path, initial_peers: list[str], chunks: tuple[int, ...]) -> Iterator[dict[int, Client]]:
    """One client per prefill chunk size in `chunks`, prefix reuse off (every row is computed)."""
    out: dict[int, Client] = {}
    try:
        for chunk in chunks:
            client = Client(str(model), initial_peers=initial_peers, prefill_chunk_tokens=chunk)
            client._engine.reuse_prefixes = False  # noqa: SLF001 - the engine's documented switch
            out[chunk] = client
        yield out
    finally:
        for client in out.values():
            client.close()


@pytest.fixture(scope="module")
def clients(smol_swarm, smollm2_path):
    """One client per prefill chunk size in CHUNKS, prefix reuse off."""
    with chunk_clients(smollm2_path, smol_swarm.started[0].maddrs, CHUNKS) as out:
        yield out


@pytest.fixture(scope="module")
def prompt_ids(clients) -> dict[int, list[int]]:
    ids = clients[CHUNKS[0]].tokenizer.encode(TEXT.read_text())
    assert len(ids) > max(LENGTHS)
    return {n: ids[:n] for n in LENGTHS}


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("n", LENGTHS)
def test_swarm_at_every_chunk_size_equals_the_whole_model(n, sampling, chunk, clients, prompt_ids, smollm2_path):
    temperature, seed = SAMPLINGS[sampling]
    want = contract_tokens(smollm2_path, prompt_ids[n], N_NEW, temperature, seed)
    assert len(want) == N_NEW  # no early end: every case compares 48 tokens
    got = clients[chunk].stream_tokens(prompt_ids[n], max_new_tokens=N_NEW, temperature=temperature,
                                       seed=seed).run()
    assert got.telemetry.reused_tokens == 0  # every row computed at this chunk size
    assert got.tokens == want, f"swarm, chunk {chunk}, {n}-token prompt, {sampling}"


def test_a_restored_prefix_gives_the_whole_model_too(smol_swarm, smollm2_path, prompt_ids):
    # 600 tokens first (the peers keep snapshots of its 64-token blocks), then 1,100: every hop
    # restores the shared blocks and computes only the rest, on the same grid
    temperature, seed = SAMPLINGS["seeded"]
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        client.stream_tokens(prompt_ids[600], max_new_tokens=1).run()
        got = client.stream_tokens(prompt_ids[1100], max_new_tokens=N_NEW, temperature=temperature,
                                   seed=seed).run()
    assert got.telemetry.reused_tokens > 0
    assert got.telemetry.reused_tokens % 64 == 0
    assert got.tokens == contract_tokens(smollm2_path, prompt_ids[1100], N_NEW, temperature, seed)


@pytest.fixture(scope="module")
def gemma_clients(gemma_path, tmp_path_factory):
    """Gemma-3 270M as 0:9 (1 thread) and 9:18 (2 threads); one client per chunk in GEMMA_CHUNKS,
    prefix reuse off."""
    ps = PeerSet(tmp_path_factory.mktemp("gemma_swarm"))
    try:
        first = ps.start("g0", *serve_args(gemma_path, "0:9", "--new-swarm"))
        ps.start("g1", *serve_args(gemma_path, "9:18", "--initial-peers", first.maddrs[0], "--threads", "2"))
        with chunk_clients(gemma_path, first.maddrs, GEMMA_CHUNKS) as out:
            yield out
    finally:
        ps.stop_all()


@pytest.mark.parametrize("chunk", GEMMA_CHUNKS)
@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("n", GEMMA_LENGTHS)
def test_gemma_swarm_across_its_window_equals_the_whole_model(n, sampling, chunk, gemma_clients, gemma_path):
    temperature, seed = SAMPLINGS[sampling]
    client = gemma_clients[chunk]
    ids = client.tokenizer.encode(TEXT.read_text())[:n]
    want = contract_tokens(gemma_path, ids, N_NEW, temperature, seed)
    got = client.stream_tokens(ids, max_new_tokens=N_NEW, temperature=temperature, seed=seed).run()
    assert got.tokens == want, f"Gemma-3 swarm, chunk {chunk}, {n}-token prompt, {sampling}"
