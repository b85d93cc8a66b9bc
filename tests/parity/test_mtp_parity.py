"""A model's multi-token-prediction (MTP) head, served on the last span, equals the whole model's.

The models are the synthetic ones with one MTP block of every architecture whose head is served
(`tests.helpers.synthetic.MTP_SPECS`: deepseek4, whose head reads the last block's hyper-connection
residual, and deepseek2, glm-dsa, qwen35, qwen35moe, whose heads read llama.cpp's output-normed
`h_nextn`). The reference is `tests.helpers.mtp_oracle` (llama.cpp's target and MTP contexts on the
whole file, driven as common/speculative.cpp drives them); the chain runner is
`tests.helpers.chains`. Drafts are the head's logits for the token after the one fed next: after the
prompt and after each of N_DECODE greedy steps. The tests of the head's bookkeeping (export, import,
truncation, batches, a failed step) run on deepseek4.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from swarm.arch import arch_row
from swarm.artifacts.distribute import span_ranges
from swarm.errors import ExecutorError, ModelError
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.executor import BatchStep, SpanExecutor
from swarm.ggml_bridge.gguf_header import scan
from swarm.ggml_bridge.slicing import (build_span, legal_starts, mtp_layers, read_span_layers, span_has_mtp,
                                       span_reads_token_ids)
from swarm.kv.budget import span_budget
from swarm.kv.sessions import SessionTable
from swarm.limits import MTP_MAX_DRAFTS, MTP_TRUNCATE_ROWS
from swarm.manifest import Manifest, build_manifest
from swarm.peer.rules import Throughput
from swarm.peer.span import Span
from tests.helpers.chains import chain_forward, open_chain
from tests.helpers.mtp_oracle import run_mtp_oracle
from tests.helpers.oracle import N_DECODE, N_THREADS
from tests.helpers.synthetic import MTP_SPECS, N_VOCAB, deepseek4_mtp, with_layers, write_synthetic
from tests.parity.test_synthetic_parity import SYNTH_PROMPT

N_TRUNK = 4  # the synthetic model's layers; its MTP block is block 4
N_CHAIN = 3  # drafts chained per call in the whole-model comparison


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory) -> Path:
    return write_synthetic("deepseek4", tmp_path_factory.mktemp("mtp") / "ds4-mtp.gguf", spec=deepseek4_mtp())


@pytest.fixture(scope="module")
def prompt(mtp_model, oracle_for) -> list[int]:
    return oracle_for(mtp_model, SYNTH_PROMPT).prompt


@pytest.fixture(scope="module")
def mtp_oracle(mtp_model, prompt):
    return run_mtp_oracle(mtp_model, prompt, N_VOCAB)


def _close(chain: list[SpanExecutor]) -> None:
    for ex in chain:
        ex.close()


# legal cuts of each model (glm-dsa's spans start at full-indexer layers, every qwen35 span holds both
# layer kinds); two spans and three
_CUTS = [("deepseek4", (1,)), ("deepseek4", (2,)), ("deepseek4", (1, 3)), ("deepseek2", (2,)),
         ("deepseek2", (1, 3)), ("glm-dsa", (3,)), ("glm-dsa", (1, 3)), ("qwen35", (2,)), ("qwen35", (2, 4)),
         ("qwen35moe", (4,))]


@pytest.fixture(scope="module")
def mtp_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp-all")
    return {arch: write_synthetic(arch, root / f"{arch}-mtp.gguf", spec=spec())
            for arch, spec in MTP_SPECS.items()}


def test_every_architecture_with_an_mtp_graph_serves_it():
    """A row is served iff it has a synthetic MTP model proving it (this file), and each row's head
    reads the tensor llama.cpp's MTP driver gives it."""
    served = {name for name in ("llama", "qwen2", "gemma3", "qwen3moe", "deepseek2", "glm-dsa", "qwen35",
                                "qwen35moe", "deepseek4") if arch_row(name).mtp_head}
    assert served == set(MTP_SPECS)
    assert {name: arch_row(name).mtp_input for name in served} == {
        "deepseek4": "residual", "deepseek2": "h_nextn", "glm-dsa": "h_nextn", "qwen35": "h_nextn",
        "qwen35moe": "h_nextn"}


@pytest.mark.parametrize("arch,cuts", _CUTS, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_mtp_head_on_the_last_span_drafts_what_the_whole_model_drafts(arch, cuts, mtp_models, oracle_for,
                                                                      span_cache):
    mtp_model = mtp_models[arch]
    assert legal_starts(mtp_model)[1:] == sorted(set(legal_starts(mtp_model)[1:]))
    assert set(cuts) <= set(legal_starts(mtp_model))
    prompt = oracle_for(mtp_model, SYNTH_PROMPT).prompt
    mtp_oracle = run_mtp_oracle(mtp_model, prompt, N_VOCAB, n_chain=N_CHAIN)
    # loading the MTP block leaves the whole model's own logits as llama-cpp-python's
    plain = oracle_for(mtp_model, SYNTH_PROMPT)
    assert np.abs(mtp_oracle.prefill_logits - plain.prefill_logits).max() == 0.0
    assert mtp_oracle.tokens == plain.tokens
    # random weights: the head's logits spread over units and its drafts vary, so 0.0 is a real check
    assert float(mtp_oracle.draft_logits.std()) > 0.1
    assert len(set(np.argmax(mtp_oracle.draft_logits, axis=1).tolist())) > 5
    # a chained draft reads the head's own h and the draft before it: not the first draft again
    assert np.abs(mtp_oracle.chain_logits[:, 1:] - mtp_oracle.chain_logits[:, :1]).max() > 1.0

    embedder = TokenEmbedder(mtp_model)
    chain = open_chain(mtp_model, cuts, span_cache)
    try:
        assert [ex.has_mtp for ex in chain] == [False] * len(cuts) + [True]
        prefill = chain_forward(chain, embedder, 0, 0, prompt, all_logits=True)
        assert np.abs(prefill - mtp_oracle.prefill_logits).max() == 0.0
        pos, nxt = len(prompt), int(np.argmax(prefill[-1]))
        drafts = [chain[-1].mtp_drafts(0, nxt, N_CHAIN)]
        for _ in range(N_DECODE):
            step = chain_forward(chain, embedder, 0, pos, [nxt])
            pos, nxt = pos + 1, int(np.argmax(step[0]))
            drafts.append(chain[-1].mtp_drafts(0, nxt, N_CHAIN))
        got = np.stack(drafts)
        assert np.abs(got - mtp_oracle.chain_logits).max() == 0.0
        assert np.argmax(got, axis=2).tolist() == np.argmax(mtp_oracle.chain_logits, axis=2).tolist()
        assert np.array_equal(chain[-1].mtp_draft(0, nxt), got[-1, 0])  # one draft: the chain's first
        assert [ex.pos_max(0) for ex in chain] == [pos - 1] * len(chain)  # drafts add no position
        # a prefill asking only its last row's logits (as peers do) still feeds the head every row
        # (the head's h rows come before the output head, whose one-row product may round apart)
        last_only = chain_forward(chain, embedder, 1, 0, prompt)
        assert int(np.argmax(last_only[0])) == mtp_oracle.tokens[0]
        assert np.abs(chain[-1].mtp_draft(1, mtp_oracle.tokens[0]) - mtp_oracle.draft_logits[0]).max() == 0.0
    finally:
        _close(chain)


def test_mtp_blocks_travel_only_with_the_last_span(mtp_model, span_cache):
    """The model has 4 layers (block_count 5 less nextn_predict_layers 1). The last span's file keeps
    the MTP block renumbered after its own blocks, with the key, its compress ratio and token_embd
    (the head embeds its tokens with it); other spans drop them. Manifest, fetch plan and memory
    budget count the head on the last span."""
    assert read_span_layers(mtp_model) == ("deepseek4", N_TRUNK) and mtp_layers(mtp_model) == 1
    assert legal_starts(mtp_model) == [0, 1, 2, 3]
    source = GGUFReader(mtp_model)
    src = {t.name: t for t in source.tensors}
    for start, end in ((0, 1), (1, 3), (3, 4)):
        span = build_span(mtp_model, start, end, cache_dir=span_cache)
        header, reader = scan(span), GGUFReader(span)
        names = {t.name for t in reader.tensors}
        ratios = list(reader.fields["deepseek4.attention.compress_ratios"].contents())
        last = end == N_TRUNK
        assert span_has_mtp(span) == last
        assert read_span_layers(span) == ("deepseek4", end - start)
        assert header.scalars["deepseek4.block_count"] == end - start + last
        assert ("deepseek4.nextn_predict_layers" in header.scalars) == last
        assert ratios == [0, 4, 128, 4][start:end] + [0] * last
        assert (f"blk.{end - start}.nextn.eh_proj.weight" in names) == last
        assert ("token_embd.weight" in names) == last
        if last:
            got = {t.name: t for t in reader.tensors}
            for name in ("blk.1.nextn.eh_proj.weight", "blk.1.attn_kv.weight", "token_embd.weight"):
                origin = name.replace("blk.1.", "blk.4.")
                assert np.array_equal(got[name].data, src[origin].data)
            assert float(np.abs(got["token_embd.weight"].data).max()) > 0.0  # real rows, not zeros

    manifest = build_manifest(mtp_model)
    assert Manifest.from_bytes(manifest.to_bytes(), manifest.model_id) == manifest
    assert (manifest.n_layers, manifest.n_mtp_layers) == (N_TRUNK, 1)
    head = {t.name for t in manifest.mtp_tensors()}
    assert head and all(n.startswith("blk.4.") for n in head)

    def covered(ranges, name):
        t = manifest.tensor(name)
        return any(off <= t.offset and t.offset + t.nbytes <= off + n for off, n in ranges)

    for start, end in ((1, 3), (3, 4)):
        ranges = span_ranges(manifest, start, end)
        wanted = end == N_TRUNK
        assert all(covered(ranges, n) == wanted for n in (*head, "token_embd.weight"))
    budget = span_budget(manifest, 1 << 30, 0)
    head_bytes = sum(t.nbytes for t in manifest.tensors
                     if t.name in head | {"token_embd.weight", "output.weight", "output_norm.weight"})
    assert budget.head_bytes == head_bytes


def test_mtp_head_stays_in_step_with_the_sequence(mtp_model, prompt, span_cache):
    """Drafts leave the sequence as it was; export/import carries the head's cache and last h;
    truncation into the sequence, bad tokens, empty sequences and spans without a head are refused."""
    embedder = TokenEmbedder(mtp_model)
    chain = open_chain(mtp_model, (2,), span_cache)
    last = chain[-1]
    ids, tok = prompt[:40], 7
    try:
        # the last span holds no hash-routed layer: only its head reads the token ids
        assert last.needs_token_ids and not span_reads_token_ids(build_span(mtp_model, 2, 4, span_cache))
        with pytest.raises(ExecutorError, match="is empty"):
            last.mtp_draft(0, tok)
        h = chain[0].forward(0, 0, embedder.embed(ids), token_ids=np.array(ids))
        with pytest.raises(ExecutorError, match="reads token ids"):
            last.forward(0, 0, h)
        assert last.pos_max(0) == -1
        last.forward(0, 0, h, token_ids=np.array(ids))
        draft = last.mtp_draft(0, tok)
        assert np.array_equal(last.mtp_draft(0, tok), draft)  # asking again changes nothing
        # the longest chain the C side takes is the one the wire's peers draft (MTP_MAX_DRAFTS)
        longest = last.mtp_drafts(0, tok, MTP_MAX_DRAFTS)
        assert longest.shape == (MTP_MAX_DRAFTS, N_VOCAB) and np.array_equal(longest[0], draft)
        with pytest.raises(ExecutorError, match=r"drafts must be an int in \[1, 8\]"):
            last.mtp_drafts(0, tok, MTP_MAX_DRAFTS + 1)
        assert last.pos_max(0) == 39 and np.array_equal(last.mtp_draft(0, tok), draft)  # chains add none
        with pytest.raises(ExecutorError, match=r"token must be an int in \[0, "):
            last.mtp_draft(0, N_VOCAB)
        with pytest.raises(ExecutorError, match="no multi-token-prediction head"):
            chain[0].mtp_draft(0, tok)
        with pytest.raises(ExecutorError, match="truncate 0 at 20 failed"):
            last.truncate(0, 20)
        last.truncate(0, 40)  # nothing to drop
        assert last.pos_max(0) == 39 and np.array_equal(last.mtp_draft(0, tok), draft)

        blobs = [ex.export_seq(0) for ex in chain]
        for ex, blob in zip(chain, blobs):
            ex.import_seq(1, blob)
        assert np.array_equal(last.mtp_draft(1, tok), draft)
        steps = [chain_forward(chain, embedder, seq, 40, [tok]) for seq in (0, 1)]
        assert np.array_equal(steps[0], steps[1])
        assert np.array_equal(last.mtp_draft(0, 9), last.mtp_draft(1, 9))

        for ex in chain:
            ex.clear(1)
        bad = b"XXXXXXXX" + blobs[1][8:]
        with pytest.raises(ExecutorError, match="import into 1 failed"):
            last.import_seq(1, bad)
        assert last.pos_max(1) == -1

        last.truncate(0, 0)  # a clear: the head's cache and its h go too
        chain[0].clear(0)
        with pytest.raises(ExecutorError, match="is empty"):
            last.mtp_draft(0, tok)
        chain_forward(chain, embedder, 0, 0, ids)
        assert np.array_equal(last.mtp_draft(0, tok), draft)  # position 0 again paired with zeros
    finally:
        _close(chain)


def test_a_draft_from_inside_the_sequence_is_the_draft_of_the_sequence_ending_there(mtp_model, prompt,
                                                                                   span_cache):
    """`mtp_draft(seq, t, pos)` with pos inside the sequence (a verify pass whose rows from pos on
    are rejected) drafts as a sequence ending at pos - 1 does, bit for bit, and leaves the head
    holding every position; positions it no longer remembers (more than MTP_RING back, or before a
    state import) are refused and the sequence stays as it was."""
    embedder = TokenEmbedder(mtp_model)
    chain = open_chain(mtp_model, (2,), span_cache)
    last = chain[-1]
    ids, more, n = prompt[:30], [7, 9, 11], len(prompt[:30])
    try:
        for seq in (0, 1):
            chain_forward(chain, embedder, seq, 0, ids)
        chain_forward(chain, embedder, 0, n, more[:1])  # sequence 0 ends at n
        want = last.mtp_draft(0, 42)
        for i, t in enumerate(more):  # sequence 1 goes on to n + 2, one row at a time
            chain_forward(chain, embedder, 1, n + i, [t])
        before = last.mtp_draft(1, 5)
        assert np.abs(want - before).max() > 1.0  # the later rows change the head's draft
        assert np.array_equal(last.mtp_draft(1, 42, n + 1), want)
        assert np.array_equal(last.mtp_drafts(1, 42, 3, n + 1), last.mtp_drafts(0, 42, 3))  # chained too
        assert [ex.pos_max(1) for ex in chain] == [n + 2] * 2
        # the head holds n + 1 and n + 2 again, re-fed as one batch of two rows: within its rounding
        after = last.mtp_draft(1, 5)
        assert np.abs(after - before).max() < 1e-3 and int(np.argmax(after)) == int(np.argmax(before))
        assert np.array_equal(last.mtp_draft(1, 5, n + 3), after)  # pos_max + 1 is the plain draft

        for i in range(8):  # n + 1 falls out of what the head remembers
            chain_forward(chain, embedder, 1, n + 3 + i, [13 + i])
        with pytest.raises(ExecutorError, match=f"sequence 1 at {n + 1} failed: the MTP head no longer"):
            last.mtp_draft(1, 42, n + 1)
        assert last.pos_max(1) == n + 10
        with pytest.raises(ExecutorError, match=r"draft position must be an int in \[1, "):
            last.mtp_draft(1, 42, n + 12)
        last.mtp_draft(1, 42, n + 4)  # 7 rows back: remembered

        blobs = [ex.export_seq(1) for ex in chain]
        for ex, blob in zip(chain, blobs):
            ex.clear(0)
            ex.import_seq(0, blob)
        with pytest.raises(ExecutorError, match=f"sequence 0 at {n + 10} failed: the MTP head no longer"):
            last.mtp_draft(0, 42, n + 10)  # an imported state carries the last h only
        assert np.array_equal(last.mtp_draft(0, 5), last.mtp_draft(1, 5))
    finally:
        _close(chain)


@pytest.mark.parametrize("arch", ["deepseek2", "glm-dsa"])
def test_a_head_on_a_cache_that_truncates_is_cut_back_exactly(arch, mtp_models, oracle_for, span_cache):
    """deepseek2 and glm-dsa cut their KV cache exactly, so their last span with a head truncates too,
    as far back as the head remembers what it was fed (MTP_TRUNCATE_ROWS: two verify passes): cut
    inside a pass, the next step's logits and the head's chained drafts equal those of a sequence
    that never computed the cut rows, bit for bit. Deeper, or after a state import (which carries
    the last h only), the cut is refused and the sequence stays as it was. A head on a cache that
    cannot truncate (qwen35's recurrent state) still refuses any cut into the sequence."""
    model = mtp_models[arch]
    cuts = next(c for a, c in _CUTS if a == arch)
    prompt = oracle_for(model, SYNTH_PROMPT).prompt[:30]
    embedder = TokenEmbedder(model)
    chain = open_chain(model, cuts, span_cache)
    last, n, rows = chain[-1], len(prompt), [7, 9, 11, 13, 15]
    try:
        assert [ex.truncate_depth for ex in chain] == [None] * len(cuts) + [MTP_TRUNCATE_ROWS]
        for seq in (0, 1):
            chain_forward(chain, embedder, seq, 0, prompt)
        for i, t in enumerate(rows):  # sequence 0: a verify pass of five rows (one-row groups)
            chain_forward(chain, embedder, 0, n + i, [t])
        for i, t in enumerate(rows[:2]):  # sequence 1: only the two rows the pass keeps
            chain_forward(chain, embedder, 1, n + i, [t])
        before = last.mtp_drafts(0, 42, 3)
        for ex in chain:
            ex.truncate(0, n + 2)
        assert [ex.pos_max(0) for ex in chain] == [n + 1] * len(chain)
        after = last.mtp_drafts(0, 42, 3)
        assert np.abs(after - before).max() > 1.0  # the cut rows changed the head's drafts
        assert np.array_equal(after, last.mtp_drafts(1, 42, 3))
        steps = [chain_forward(chain, embedder, seq, n + 2, [42]) for seq in (0, 1)]
        assert np.array_equal(steps[0], steps[1])
        assert np.array_equal(last.mtp_drafts(0, 5, 3), last.mtp_drafts(1, 5, 3))
    finally:
        _close(chain)

    chain = open_chain(model, cuts, span_cache, n_seq_max=1)  # 256 cells: deeper than the head remembers
    last = chain[-1]
    try:
        ids = (prompt * 6)[: MTP_TRUNCATE_ROWS + 40]
        chain_forward(chain, embedder, 0, 0, ids)
        end = len(ids)
        deeper = end - MTP_TRUNCATE_ROWS - 1
        with pytest.raises(ExecutorError, match=f"truncate 0 at {deeper} failed: the MTP head no longer"):
            last.truncate(0, deeper)
        assert last.pos_max(0) == end - 1
        last.truncate(0, end - MTP_TRUNCATE_ROWS)  # as far back as it remembers
        assert last.pos_max(0) == end - MTP_TRUNCATE_ROWS - 1
        blob = last.export_seq(0)
        last.clear(0)
        last.import_seq(0, blob)
        with pytest.raises(ExecutorError, match="the MTP head no longer holds"):
            last.truncate(0, end - MTP_TRUNCATE_ROWS - 2)
    finally:
        _close(chain)

    hybrid = open_chain(mtp_models["qwen35"], (2,), span_cache)
    try:
        assert hybrid[-1].truncate_depth == 0
        chain_forward(hybrid, TokenEmbedder(mtp_models["qwen35"]), 0, 0, prompt[:8])
        with pytest.raises(ExecutorError, match="truncate 0 at 4 failed"):
            hybrid[-1].truncate(0, 4)
    finally:
        _close(hybrid)


def test_a_failed_step_on_a_head_span_that_truncates_leaves_the_session_where_its_table_says(mtp_models,
                                                                                             span_cache):
    """On a deepseek2 last span with a head (it truncates as far back as the head remembers), a verify
    pass whose last one-row group finds no KV cell is undone to its start, and the session goes on
    from there; a 230-row step whose last chunk fails, computed 192 rows past its start (deeper than
    the head remembers), empties the session instead of leaving its cache ahead of its table."""
    model = mtp_models["deepseek2"]
    _, n_layers = read_span_layers(model)
    embedder = TokenEmbedder(model)
    first, last = (SpanExecutor.for_span(model, a, b, n_ctx_tokens=cells, n_seq_max=1, n_threads=N_THREADS,
                                         cache_dir=span_cache, n_batch=64)
                   for a, b, cells in ((0, 2, 1024), (2, n_layers, 256)))  # only the last span runs out

    def rows(pos0: int, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        tok = np.array(ids, np.int32)
        first.truncate(0, pos0)
        return first.forward(0, pos0, embedder.embed(ids), token_ids=tok), tok

    async def main() -> None:
        # a table of more tokens than the span's 256 cells, so that steps reach llama.cpp's KV-full
        span = Span("ab" * 32, 2, n_layers, last, SessionTable(1, 1024, idle_timeout_s=600.0), prefixes=None,
                    inline_max_ms=0.0, measure=lambda ex: Throughput(1.0, 2.0))
        slot = await span.admit(b"s" * 16, "client", 1000, 0.0)
        ids = [4 + i % 200 for i in range(253)]
        h, tok = rows(0, ids)
        await span.forward(slot, 0, h, all_logits=False, steps=(), finish=lambda r: r, token_ids=tok)
        h, tok = rows(253, [7, 8, 9, 10])  # three cells left: the fourth row fails
        with pytest.raises(ExecutorError, match="KV cache full"):
            await span.forward(slot, 253, h, all_logits=True, steps=(1, 1, 1, 1), finish=lambda r: r,
                               token_ids=tok, verify=True)
        assert (slot.pos, last.pos_max(0)) == (253, 252)
        await span.forward(slot, 253, h[:1], all_logits=False, steps=(), finish=lambda r: r,
                           token_ids=tok[:1])

        await span.truncate(slot, 0)
        h, tok = rows(0, ids[:40])
        await span.forward(slot, 0, h, all_logits=False, steps=(), finish=lambda r: r, token_ids=tok)
        h, tok = rows(40, [4 + i % 200 for i in range(230)])  # chunks of 64: the fourth passes cell 255
        with pytest.raises(ExecutorError, match="KV cache full"):
            await span.forward(slot, 40, h, all_logits=False, steps=(), finish=lambda r: r, token_ids=tok)
        assert (slot.pos, last.pos_max(0)) == (0, -1)  # emptied, in step
        h, tok = rows(0, ids[:5])
        await span.forward(slot, 0, h, all_logits=False, steps=(), finish=lambda r: r, token_ids=tok)
        assert (slot.pos, last.pos_max(0)) == (5, 4)

    try:
        asyncio.run(main())
    finally:
        _close([first, last])


def test_mtp_head_of_batched_steps_follows_each_sequence(mtp_model, prompt, span_cache):
    """One decode step of two sequences in one batch feeds each its own rows: drafts equal the
    sequences' solo drafts within what the batch itself moves the logits (llama.cpp's kernels round
    a 2-row ubatch differently from a 1-row one: ~1e-3 here); a row paired with the other sequence's
    h would move them by units."""
    embedder = TokenEmbedder(mtp_model)
    chain = open_chain(mtp_model, (2,), span_cache)
    a, b = prompt[:30], prompt[30:50]
    try:
        def prefill():
            return [int(np.argmax(chain_forward(chain, embedder, s, 0, p))) for s, p in ((0, a), (1, b))]

        firsts = prefill()
        solo_logits = [chain_forward(chain, embedder, s, len(p), [t])[0]
                       for s, p, t in zip((0, 1), (a, b), firsts)]
        nexts = [int(np.argmax(lg)) for lg in solo_logits]
        solo = [chain[-1].mtp_draft(s, t) for s, t in zip((0, 1), nexts)]
        assert np.abs(solo[0] - solo[1]).max() > 1.0  # the sequences' drafts tell them apart
        for ex in chain:
            ex.clear(0)
            ex.clear(1)
        assert prefill() == firsts
        tok = np.array(firsts, dtype=np.int32)
        rows = list(embedder.embed(firsts)[:, None, :])
        for ex in chain:
            rows = ex.forward_batch([BatchStep(s, len(p), rows[s], token_ids=tok[s:s + 1])
                                     for s, p in ((0, a), (1, b))])
        for s in (0, 1):
            assert np.abs(rows[s][0] - solo_logits[s]).max() < 1e-2
            draft = chain[-1].mtp_draft(s, nexts[s])
            assert np.abs(draft - solo[s]).max() < 1e-2
            assert int(np.argmax(draft)) == int(np.argmax(solo[s]))
    finally:
        _close(chain)


def test_a_failed_step_leaves_the_head_in_step(mtp_model, span_cache):
    """A step that fills the last span's KV stream half-way fails; deepseek4's compressed cache cannot
    drop the rows it already took, so the sequence is emptied in both caches rather than left
    half-advanced with the head behind it."""
    embedder = TokenEmbedder(mtp_model)

    def open_span(start, end, n_ctx):
        return SpanExecutor.for_span(mtp_model, start, end, n_ctx_tokens=n_ctx, n_seq_max=1,
                                     n_threads=N_THREADS, cache_dir=span_cache, n_batch=64)

    first, last = open_span(0, 2, 1024), open_span(2, 4, 256)
    try:
        ids = [4 + i % 200 for i in range(last.n_ctx_seq_tokens - 100)]
        chain_forward([first, last], embedder, 0, 0, ids)
        more = list(range(4, 124))  # 64 rows fit, the next 56 do not
        h = first.forward(0, len(ids), embedder.embed(more), token_ids=np.array(more))
        with pytest.raises(ExecutorError, match="KV cache full"):
            last.forward(0, len(ids), h, token_ids=np.array(more))
        assert last.pos_max(0) == -1
        with pytest.raises(ExecutorError, match="is empty"):
            last.mtp_draft(0, 7)
    finally:
        _close([first, last])


def test_mtp_files_the_head_cannot_run_are_refused(tmp_path):
    base = deepseek4_mtp()
    ratio4 = with_layers(base, base.n_layers, (("attention.compress_ratios", [0, 4, 128, 4, 4],
                                                GGUFValueType.ARRAY, GGUFValueType.UINT32),))
    path = write_synthetic("deepseek4", tmp_path / "ratio4.gguf", spec=ratio4)
    with pytest.raises(ModelError, match=r"compress_ratios is \[4\] for the multi-token-prediction"):
        build_span(path, 2, 4, cache_dir=tmp_path)
    bad = with_layers(base, base.n_layers, (("nextn_predict_layers", 5, GGUFValueType.UINT32, None),))
    path = write_synthetic("deepseek4", tmp_path / "all-mtp.gguf", spec=bad)
    with pytest.raises(ModelError, match="does not leave a layer"):
        read_span_layers(path)
