"""Every architecture with a synthetic model: chains of 2 and 3 spans through every legal cut equal
llama.cpp's whole model bit for bit (prefill logits of every prompt token, 32 greedy decode steps).

No download: the models come from `tests/helpers/synthetic.py` (tiny, random weights, byte vocab),
written once per session. The runner is `tests/helpers/chains.py`, as in `test_chain_parity.py`; the
oracle is `tests.helpers.oracle.run_oracle` (llama.cpp's whole model fed token ids, flash attention on).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from swarm.arch import arch_row
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.gguf_header import scan
from swarm.ggml_bridge.slicing import arch_metadata, build_span, legal_starts
from swarm.kv.budget import SpanBudget
from swarm.manifest import build_manifest
from swarm.route.placement import choose_span
from swarm.route.plan import PeerSpan
from swarm.span_rules import has_split_rules, span_refusal
from tests.helpers.oracle import N_DECODE
from gguf import GGUFReader, GGUFValueType

from swarm.errors import ExecutorError, ModelError, RequestError
from tests.helpers.synthetic import N_EMBD, N_VOCAB, SPECS, write_synthetic
from tests.helpers.chains import chain_forward, open_chain

# byte-level vocab: one token per byte (+ BOS); 96 tokens, longer than gemma3's window (8) and the
# DSA indexer's top_k (16), so both really select
SYNTH_PROMPT = (
    "def fibonacci(n):\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
    "print(fib(10))\n"
)

# every legal cut: glm-dsa spans start only at full-indexer layers (`CutConstraint`); qwen35 spans
# hold both recurrent and attention layers (`MixedSpan`: with the pattern R A R A R A, >= 2 layers)
SYNTH_LEGAL_STARTS = {"glm-dsa": (1, 3)}
MIN_SPAN = {"qwen35": 2, "qwen35moe": 2}


def _legal(arch: str, cuts: tuple[int, ...]) -> bool:
    bounds = [0, *cuts, SPECS[arch]().n_layers]
    return all(b - a >= MIN_SPAN.get(arch, 1) for a, b in zip(bounds, bounds[1:]))


CASES = [(arch, cuts) for arch in SPECS for k in (1, 2)
         for cuts in itertools.combinations(SYNTH_LEGAL_STARTS.get(arch, range(1, SPECS[arch]().n_layers)), k)
         if _legal(arch, cuts)]


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory):
    """Function arch -> path of its synthetic GGUF, written once per session."""
    root = tmp_path_factory.mktemp("synthetic")
    paths: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in paths:
            paths[arch] = write_synthetic(arch, root / f"{arch}.gguf")
        return paths[arch]

    return get


@pytest.mark.parametrize("arch,cuts", CASES,
                         ids=[f"synthetic-{a}-{'-'.join(map(str, c))}" for a, c in CASES])
def test_synthetic_chain_matches_whole_model(arch, cuts, synthetic_model, span_cache, oracle_for):
    path = synthetic_model(arch)
    oracle = oracle_for(path, SYNTH_PROMPT)
    assert len(oracle.prompt) == len(SYNTH_PROMPT) + 1
    embedder = TokenEmbedder(path)
    chain = open_chain(path, cuts, span_cache)
    try:
        # spans before the last carry no vocabulary, unless they read token ids (deepseek4's hash layers)
        assert all(ex.n_vocab == (N_VOCAB if ex.needs_token_ids else 1) for ex in chain[:-1])
        prefill = chain_forward(chain, embedder, 0, 0, oracle.prompt, all_logits=True)
        assert prefill.shape == oracle.prefill_logits.shape
        # random weights: logits spread over several units, so 0.0 is a real check
        assert float(oracle.prefill_logits.std()) > 0.1
        assert np.abs(prefill - oracle.prefill_logits).max() == 0.0

        pos = len(oracle.prompt)
        nxt = int(np.argmax(prefill[-1]))
        got_tokens, max_diff = [], 0.0
        for i in range(N_DECODE):
            got_tokens.append(nxt)
            logits = chain_forward(chain, embedder, 0, pos, [nxt])
            max_diff = max(max_diff, float(np.abs(logits[0] - oracle.step_logits[i]).max()))
            pos += 1
            nxt = int(np.argmax(logits[0]))
        assert got_tokens == oracle.tokens
        assert max_diff == 0.0
        assert [ex.pos_max(0) for ex in chain] == [pos - 1] * len(chain)
    finally:
        for ex in chain:
            ex.close()


def test_synthetic_rows_exist_for_every_model(synthetic_model):
    for arch in SPECS:
        assert arch_row(arch).name == arch
        n_layers = SPECS[arch]().n_layers
        expected = SYNTH_LEGAL_STARTS.get(arch, range(1, n_layers))
        assert legal_starts(synthetic_model(arch))[1:] == list(expected)


def test_synthetic_glm_dsa_refuses_a_span_starting_at_a_shared_indexer_layer(synthetic_model, tmp_path):
    path = synthetic_model("glm-dsa")
    with pytest.raises(ValueError, match="cannot start at layer 2: a layer with a shared indexer"):
        build_span(path, 2, 5, cache_dir=tmp_path)
    assert build_span(path, 3, 5, cache_dir=tmp_path).exists()


@pytest.mark.parametrize("start,end", [(0, 1), (1, 2), (2, 3)], ids=lambda v: str(v))
def test_synthetic_qwen35_refuses_a_span_of_one_layer_kind(start, end, synthetic_model, tmp_path):
    with pytest.raises(ValueError, match="holds layers of one kind only"):
        build_span(synthetic_model("qwen35"), start, end, cache_dir=tmp_path)


def test_synthetic_qwen35_span_cannot_truncate_but_snapshots_are_exact(synthetic_model, span_cache):
    """Hybrid state: rollback by position is refused by llama.cpp (recurrent state keeps only the
    latest position); a whole-sequence export/import at the end is exact."""
    path = synthetic_model("qwen35")
    assert not arch_row("qwen35").rollback_exact and arch_row("qwen35").state_kind == "hybrid"
    embedder = TokenEmbedder(path)
    chain = open_chain(path, (2,), span_cache)
    try:
        ids = list(range(4, 40))
        first = chain[0].forward(0, 0, embedder.embed(ids))
        with pytest.raises(ExecutorError):
            chain[0].truncate(0, 10)
        assert chain[0].pos_max(0) == len(ids) - 1  # a refused truncate leaves the sequence as it was
        blob = chain[0].export_seq(0)
        chain[0].import_seq(1, blob)
        a = chain[0].forward(0, len(ids), embedder.embed([7]))
        b = chain[0].forward(1, len(ids), embedder.embed([7]))
        assert first.shape == (len(ids), 64)
        assert np.array_equal(a, b)
    finally:
        for ex in chain:
            ex.close()


def test_synthetic_deepseek4_spans_take_the_residual_and_the_token_ids(synthetic_model, span_cache):
    """DeepSeek-V4 spans run on the project's llama.cpp patch (`<arch>.residual_input`): every span
    takes the 4 x n_embd hyper-connection state; a span holding a hash-routed layer keeps the
    vocabulary and refuses a step without token ids (llama.cpp would index its routing table with
    garbage), a span behind them needs none; only the last span has the head."""
    path = synthetic_model("deepseek4")
    row = arch_row("deepseek4")
    assert row.residual_input and row.boundary_width == 4 and not row.rollback_exact
    chain = open_chain(path, (1, 2), span_cache)
    try:
        assert [ex.needs_token_ids for ex in chain] == [True, True, False]
        assert [ex.n_embd for ex in chain] == [4 * N_EMBD] * 3
        assert [ex.n_vocab for ex in chain] == [N_VOCAB, N_VOCAB, N_VOCAB]
        for a, b in ((0, 1), (1, 2), (2, 4)):
            assert scan(build_span(path, a, b, cache_dir=span_cache)).scalars["deepseek4.residual_input"] is True
        x = TokenEmbedder(path).embed([5, 6, 7])
        assert x.shape == (3, 4 * N_EMBD) and np.array_equal(x[:, :N_EMBD], x[:, 3 * N_EMBD:])
        with pytest.raises(ExecutorError, match="reads token ids"):
            chain[1].forward(0, 0, x)
        with pytest.raises(ExecutorError, match=r"token ids must lie in \[0, "):
            chain[1].forward(0, 0, x, token_ids=np.array([5, 6, N_VOCAB]))
        assert chain[1].pos_max(0) == -1
        out = chain[1].forward(0, 0, x, token_ids=np.array([5, 6, 7]))
        assert out.shape == (3, 4 * N_EMBD) and chain[2].forward(0, 0, out).shape == (1, N_VOCAB)
        with pytest.raises(ExecutorError):
            chain[2].truncate(0, 1)  # compressed KV: no rollback into the sequence
    finally:
        for ex in chain:
            ex.close()


def test_synthetic_deepseek2_lite_spans_equal_the_whole_model(tmp_path, span_cache):
    """A lite DeepSeek-V2 (no query compression, no `q_lora_rank` key) of 5 blocks: llama.cpp reads
    q_lora_rank unless the block count is 26 or 27, so neither the file nor a plain slice of it
    loads; every span gets `q_lora_rank = 0` written (ArchRow.default_keys). Oracle: the same
    weights with the key in the file, whole, token input."""
    from tests.helpers.oracle import run_oracle
    from tests.helpers.synthetic import deepseek2_lite, with_layers

    lite = deepseek2_lite()
    path = write_synthetic("deepseek2", tmp_path / "lite.gguf", spec=lite)
    keyed = with_layers(lite, lite.n_layers, (("attention.q_lora_rank", 0, GGUFValueType.UINT32, None),))
    oracle = run_oracle(write_synthetic("deepseek2", tmp_path / "lite-keyed.gguf", spec=keyed), SYNTH_PROMPT)
    embedder = TokenEmbedder(path)
    for cuts in ((2,), (1, 3)):
        chain = open_chain(path, cuts, span_cache)
        try:
            got = chain_forward(chain, embedder, 0, 0, oracle.prompt, all_logits=True)
            assert np.abs(got - oracle.prefill_logits).max() == 0.0
        finally:
            for ex in chain:
                ex.close()


def test_synthetic_deepseek2_refuses_lengths_llama_cpp_takes_for_lite_and_unserved_mtp_files(tmp_path):
    from tests.helpers.synthetic import SPECS as specs
    from tests.helpers.synthetic import with_layers

    path = write_synthetic("deepseek2", tmp_path / "ds28.gguf", spec=with_layers(specs["deepseek2"](), 28))
    with pytest.raises(ValueError, match="of 27 layers: llama.cpp takes a deepseek2 file of 26, 27 or 48"):
        build_span(path, 0, 27, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="of 26 layers"):
        build_span(path, 2, 28, cache_dir=tmp_path)
    assert build_span(path, 0, 25, cache_dir=tmp_path).exists()
    # llama.cpp has no MTP graph for llama: a file claiming a block is refused, not served half
    mtp = with_layers(specs["llama"](), 5, (("nextn_predict_layers", 1, GGUFValueType.UINT32, None),))
    path = write_synthetic("llama", tmp_path / "mtp.gguf", spec=mtp)
    with pytest.raises(ModelError, match="1 multi-token-prediction block.*no MTP head for llama"):
        build_span(path, 0, 2, cache_dir=tmp_path)


def test_synthetic_glm_dsa_without_indexer_types_uses_llama_cpps_table_by_global_index(tmp_path, span_cache):
    """No `attention.indexer.types` and a 1M context: llama.cpp takes GLM-5.2's built-in table by the
    index in the file (1, 1, 1, 0, 0 for 5 layers). Spans may start only at 0, 1 or 2, and a span
    file lists its layers' types explicitly, so the chain equals the whole model."""
    from tests.helpers.oracle import run_oracle
    from tests.helpers.synthetic import SPECS as specs
    from tests.helpers.synthetic import with_layers

    base = specs["glm-dsa"]()
    spec = with_layers(base, base.n_layers, (("context_length", 1048576, GGUFValueType.UINT32, None),),
                       drop=("attention.indexer.types",))
    path = write_synthetic("glm-dsa", tmp_path / "glm-table.gguf", spec=spec)
    assert legal_starts(path) == [0, 1, 2]
    span = build_span(path, 2, 5, cache_dir=tmp_path)
    assert list(GGUFReader(span).fields["glm-dsa.attention.indexer.types"].contents()) == [1, 0, 0]
    oracle = run_oracle(path, SYNTH_PROMPT)
    embedder = TokenEmbedder(path)
    chain = open_chain(path, (2,), span_cache)
    try:
        got = chain_forward(chain, embedder, 0, 0, oracle.prompt, all_logits=True)
        assert np.abs(got - oracle.prefill_logits).max() == 0.0
    finally:
        for ex in chain:
            ex.close()


@pytest.mark.parametrize("arch", [a for a in SPECS if has_split_rules(arch_row(a))])
def test_synthetic_split_rules_read_from_the_manifest_match_the_file(arch, synthetic_model):
    """A peer choosing its span has only the manifest: the rules it reads there must be the rules
    slicing reads from the file."""
    path = synthetic_model(arch)
    manifest = build_manifest(path)
    row, n = arch_row(arch), manifest.n_layers
    file_meta = arch_metadata(scan(path), arch)
    spans = [(s, e) for s in range(n) for e in range(s + 1, n + 1)]
    assert [span_refusal(row, manifest.hparams, s, e, n) for s, e in spans] == [
        span_refusal(row, file_meta, s, e, n) for s, e in spans
    ]


@pytest.mark.parametrize("arch", ["glm-dsa", "qwen35", "qwen35moe"])
def test_synthetic_placement_never_picks_a_span_slicing_refuses(arch, synthetic_model):
    """Peers of every memory size join one after another: with the row's rules, none is given a span
    slicing would refuse (the same joins without the rules are)."""
    manifest = build_manifest(synthetic_model(arch))
    row, n = arch_row(arch), manifest.n_layers

    def allowed(s, e):
        return span_refusal(row, manifest.hparams, s, e, n) is None

    chosen, naive = [], []
    for fits in [1] * n + [*range(2, n + 1)] * 2:  # smallest peers first: they meet the rules most
        budget = SpanBudget(fits, (1,) * n, 0, 0, 0)
        for picks, rule in ((chosen, allowed), (naive, None)):
            peers = [PeerSpan(f"p{i}", s, e, 10.0, 100.0, 100, 4) for i, (s, e) in enumerate(picks)]
            try:
                p = choose_span(peers, budget, 10.0, rule)
            except RequestError:  # no span this model can be cut to fits: the peer is refused
                continue
            picks.append((p.start, p.end))
    assert all(allowed(s, e) for s, e in chosen)
    assert not all(allowed(s, e) for s, e in naive)  # without the rules placement picks refused spans
