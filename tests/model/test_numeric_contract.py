"""The numeric contract (swarm/numeric.py): the local backend gives llama.cpp's whole model token for token.

Prompts of 200, 300, 600 and 1,100 tokens cut from one fixed text (tests/data/contract_prompt.txt,
a copy of an early docs/architecture.md), SmolLM2, 48 new tokens, greedy and seeded (T 0.8, seed
1): the local backend (`Client(local=True)`, a context per session, the prompt on 2 threads, each
new token on 1) must give the token ids of llama.cpp's whole model run with n_ubatch =
UBATCH_TOKENS and decode steps on 1 thread (tests/helpers/oracle.py, `contract_tokens`), alone and
as two interleaved streams; Gemma-3 270M too at 600 and 1,100 tokens, past its 512-token sliding
window. Before the grid was one, a 300-token prompt gave a different first token locally
(llama.cpp's default 512-row ubatch) than on the swarm. The swarm's side:
tests/integration/test_numeric_contract_swarm.py.

A prefill chunk off the grid is refused before the client joins anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm import Client
from swarm.errors import RequestError

from tests.helpers.oracle import contract_tokens

TEXT = Path(__file__).resolve().parents[1] / "data" / "contract_prompt.txt"
LENGTHS = (200, 300, 600, 1100)
GEMMA_LENGTHS = (600, 1100)  # past Gemma-3 270M's 512-token sliding window
N_NEW = 48
SAMPLINGS = {"greedy": (0.0, 0), "seeded": (0.8, 1)}  # (temperature, seed); greedy runs first


@pytest.fixture(scope="module")
def local(smollm2_path):
    client = Client(str(smollm2_path), local=True, n_ctx=2048, n_threads=2)
    yield client
    client.close()


@pytest.fixture(scope="module")
def prompt_ids(local) -> dict[int, list[int]]:
    ids = local.tokenizer.encode(TEXT.read_text())
    assert len(ids) > max(LENGTHS)
    return {n: ids[:n] for n in LENGTHS}


def _tokens(client: Client, ids: list[int], temperature: float, seed: int):
    result = client.stream_tokens(ids, max_new_tokens=N_NEW, temperature=temperature, seed=seed).run()
    return result.tokens, result.telemetry


@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("n", LENGTHS)
def test_local_backend_equals_the_whole_model(n, sampling, local, prompt_ids, smollm2_path):
    temperature, seed = SAMPLINGS[sampling]
    ids = prompt_ids[n]
    want = contract_tokens(smollm2_path, ids, N_NEW, temperature, seed)
    assert len(want) == N_NEW  # no early end: every case compares 48 tokens
    got, _ = _tokens(local, ids, temperature, seed)
    assert got == want, f"local backend, {n}-token prompt, {sampling}"


@pytest.fixture(scope="module")
def gemma_local(gemma_path):
    client = Client(str(gemma_path), local=True, n_ctx=2048, n_threads=2)
    yield client
    client.close()


@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("n", GEMMA_LENGTHS)
def test_gemma_local_backend_equals_the_whole_model_across_its_window(n, sampling, gemma_local, gemma_path):
    temperature, seed = SAMPLINGS[sampling]
    ids = gemma_local.tokenizer.encode(TEXT.read_text())[:n]
    want = contract_tokens(gemma_path, ids, N_NEW, temperature, seed)
    got, _ = _tokens(gemma_local, ids, temperature, seed)
    assert got == want, f"Gemma-3 local backend, {n}-token prompt, {sampling}"


def test_a_prefill_chunk_off_the_grid_is_refused(smollm2_path):
    with pytest.raises(RequestError, match="prefill_chunk_tokens must be a multiple of 64 .* use 64 or 128"):
        Client(str(smollm2_path), initial_peers=["/ip4/127.0.0.1/tcp/9/p2p/QmUnused"], prefill_chunk_tokens=100)


def test_two_interleaved_streams_on_one_local_client_each_equal_the_whole_model(local, prompt_ids,
                                                                                smollm2_path):
    # one step of each in turn: each stream has a llama.cpp context of its own, neither sees the other
    temperature, seed = SAMPLINGS["seeded"]
    lengths = (600, 300)
    want = [contract_tokens(smollm2_path, prompt_ids[n], N_NEW, temperature, seed) for n in lengths]
    streams = [local.stream_tokens(prompt_ids[n], max_new_tokens=N_NEW, temperature=temperature, seed=seed)
               for n in lengths]
    live = list(streams)
    while live:
        for s in list(live):
            try:
                next(s)
            except StopIteration:
                live.remove(s)
    assert [s.result.tokens for s in streams] == want
