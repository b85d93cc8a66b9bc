"""The peer's step scheduler on real spans: batched decode steps of concurrent sessions equal their
solo runs bit for bit, and a long prefill is cut into chunks with other sessions' decode steps
served between them.

SmolLM2 (Q4_1: no repacked kernel, so every batch size is exact) as a 2-span chain and whole;
Qwen2.5 0.5B (Q4_K: repacked, batches capped where the probe finds them exact) whole; the synthetic
DeepSeek-V4 as a 3-span chain whose first two spans read each row's token id (every batch, chunk and
recorded step carries its rows' ids).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.errors import ExecutorError, ExecutorInterrupted
from swarm.ggml_bridge.executor import BatchStep, SpanExecutor
from swarm.models import resolve_model
from swarm.peer.exact_rows import exact_batch_cap
from swarm.peer.scheduler import StepScheduler
from swarm.peer.step_plan import ClientUsage
from tests.helpers.chains import open_chain
from tests.helpers.oracle import N_THREADS
from tests.helpers.synthetic import write_synthetic

N_SESSIONS = 8
N_STEPS = 12
BLOCK = 64  # the peers' n_batch: prefill chunks of one prefix block


def schedulers(chain: list[SpanExecutor], pool: ThreadPoolExecutor) -> list[StepScheduler]:
    out = []
    for ex in chain:
        sch = StepScheduler(lambda ex=ex: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)
        sch.max_batch_rows = exact_batch_cap(ex)
        out.append(sch)
    return out


async def greedy_session(scheds, embedder, seq_id, prompt, n_steps) -> np.ndarray:
    """Prefill then greedy decode through every span's scheduler; [1 + n_steps, n_vocab] logits.
    Every step carries its rows' token ids (spans that do not read them ignore them)."""

    async def through(pos0, ids):
        h = embedder.embed(ids)
        for sch in scheds:
            h = (await sch.step(seq_id, pos0, h, token_ids=np.asarray(ids, np.int32))).out
        return h[-1]

    rows = [await through(0, prompt)]
    for i in range(n_steps):
        rows.append(await through(len(prompt) + i, [int(np.argmax(rows[-1]))]))
    return np.stack(rows)


def solo_runs(chain, embedder, prompts, n_steps) -> list[np.ndarray]:
    """Each prompt alone on sequence 0, one session at a time (the cache emptied in between)."""
    out = []
    with ThreadPoolExecutor(1) as pool:
        for p in prompts:
            scheds = [StepScheduler(lambda ex=ex: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)
                      for ex in chain]
            out.append(asyncio.run(greedy_session(scheds, embedder, 0, p, n_steps)))
            for ex in chain:
                ex.clear(0)
    return out


def concurrent_runs(chain, embedder, prompts, n_steps):
    """All prompts at once, one session each (sequence i); returns (logits per session, schedulers)."""
    with ThreadPoolExecutor(1) as pool:
        scheds = schedulers(chain, pool)

        async def main():
            return await asyncio.gather(
                *(greedy_session(scheds, embedder, i, p, n_steps) for i, p in enumerate(prompts))
            )

        return asyncio.run(main()), scheds


@pytest.fixture(scope="module")
def smol():
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def prompts(oracle_for, smol):
    full = oracle_for(smol).prompt
    # Together at most 256 tokens with their decode steps: open_chain's KV cache.
    return [full[3 * i : 3 * i + 8 + 2 * i] for i in range(N_SESSIONS)]


@pytest.mark.parametrize("cuts", [(), (15,)], ids=["whole", "chain"])
def test_eight_concurrent_sessions_equal_their_solo_runs(smol, prompts, span_cache, cuts):
    embedder = TokenEmbedder(smol)
    chain = open_chain(smol, cuts, span_cache, n_seq_max=N_SESSIONS, n_batch=BLOCK)
    try:
        solo = solo_runs(chain, embedder, prompts, N_STEPS)
        together, scheds = concurrent_runs(chain, embedder, prompts, N_STEPS)
    finally:
        for ex in chain:
            ex.close()
    for i in range(N_SESSIONS):
        assert np.array_equal(together[i], solo[i]), (i, float(np.abs(together[i] - solo[i]).max()))
    assert len({tuple(np.argmax(s, axis=1)) for s in solo}) == N_SESSIONS  # eight different generations
    for sch in scheds:
        assert sch.max_batch_rows == N_SESSIONS
    biggest = [max(rows for kind, _, rows in sch.units if kind == "batch") for sch in scheds]
    if not cuts:
        # One span: sessions staggered by their prefills merge into one batch of all eight.
        assert biggest == [N_SESSIONS]
    else:
        # A chain pipelines: sessions alternate between the spans in groups, each batched.
        assert min(biggest) >= 2


def test_concurrent_deepseek4_sessions_with_their_token_ids_equal_their_solo_runs(span_cache, tmp_path):
    path = write_synthetic("deepseek4", tmp_path / "deepseek4.gguf")
    embedder = TokenEmbedder(path)
    n = 4
    prompts = [[1] + [(7 * i + 13 * j) % 250 + 4 for j in range(10 + 3 * i)] for i in range(n)]
    chain = open_chain(path, (1, 2), span_cache, n_seq_max=n, n_batch=BLOCK)
    try:
        assert [ex.needs_token_ids for ex in chain] == [True, True, False]
        # its compressed cache cannot drop a stopped step's positions: never stopped (interrupt ignored)
        assert [ex.interruptible for ex in chain] == [False, False, False]
        chain[0].interrupt()
        solo = solo_runs(chain, embedder, prompts, N_STEPS)
        together, scheds = concurrent_runs(chain, embedder, prompts, N_STEPS)
    finally:
        for ex in chain:
            ex.close()
    for i in range(n):
        assert np.array_equal(together[i], solo[i]), (i, float(np.abs(together[i] - solo[i]).max()))
    assert len({tuple(np.argmax(s, axis=1)) for s in solo}) == n
    # measured: no deepseek4 span of the synthetic model computes a batch of sessions bit for bit as
    # their solo steps, so the probe caps batches at one session (each step runs alone, with its ids)
    assert [sch.max_batch_rows for sch in scheds] == [1, 1, 1]


def test_deepseek4_recorded_steps_carry_each_steps_token_ids(span_cache, tmp_path):
    """A replay (wire.Forward.steps) through a span that reads token ids: each recorded step gets its
    own rows' ids, and the outputs equal the steps sent one by one."""
    path = write_synthetic("deepseek4", tmp_path / "deepseek4.gguf")
    embedder = TokenEmbedder(path)
    ids = [1] + [(11 * j) % 250 + 4 for j in range(20)] + [40, 41, 42, 43, 44, 45]
    steps = (21,) + (1,) * 6
    rows = embedder.embed(ids)
    ex = SpanExecutor.for_span(path, 1, 2, n_ctx_tokens=256, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    try:
        tok = np.asarray(ids, np.int32)
        with ThreadPoolExecutor(1) as pool:
            sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)

            async def main():
                outs, a = [], 0
                for k in steps:
                    outs.append((await sch.step(0, a, rows[a : a + k], token_ids=tok[a : a + k])).out)
                    a += k
                replayed = await sch.step(1, 0, rows, steps=steps, token_ids=tok)
                return np.concatenate(outs), replayed.out

            one_by_one, replayed = asyncio.run(main())
            shifted = np.roll(tok, 1)  # the same rows with other ids: other experts, other outputs

            async def other():
                await sch.call(ex.clear, 1)
                return (await sch.step(1, 0, rows, steps=steps, token_ids=shifted)).out

            moved = asyncio.run(other())
    finally:
        ex.close()
    assert np.array_equal(replayed, one_by_one)
    assert not np.array_equal(moved, one_by_one)


@pytest.mark.slow
def test_repacked_weights_batch_only_as_far_as_exact(oracle_for, span_cache):
    qwen = resolve_model("qwen2.5-coder-0.5b")
    embedder = TokenEmbedder(qwen)
    full = oracle_for(smol_path := resolve_model("smollm2-135m")).prompt  # any real token ids < 49152
    del smol_path
    prompts = [full[4 * i : 4 * i + 16 + 3 * i] for i in range(N_SESSIONS)]
    ex = SpanExecutor.for_span(qwen, 0, 24, n_ctx_tokens=1024, n_seq_max=N_SESSIONS, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    try:
        solo = solo_runs([ex], embedder, prompts, 4)
        together, (sch,) = concurrent_runs([ex], embedder, prompts, 4)
    finally:
        ex.close()
    assert 1 < sch.max_batch_rows < N_SESSIONS
    assert max(rows for kind, _, rows in sch.units if kind == "batch") == sch.max_batch_rows
    for i in range(N_SESSIONS):
        assert np.array_equal(together[i], solo[i]), (i, float(np.abs(together[i] - solo[i]).max()))


def test_decode_steps_run_between_the_chunks_of_a_long_prefill(smol, prompts, span_cache):
    """Ordering only: with one unified KV cache, session 1's cells between the prefill's chunks
    change llama.cpp's rounding for both sessions (a sequence's results depend on its KV cell
    layout, see docs/benchmarks.md), so outputs are compared with solo runs elsewhere."""
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 30, n_ctx_tokens=1024, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    rng = np.random.default_rng(0)
    long_rows = embedder.embed(list(rng.integers(100, 40_000, size=5 * BLOCK)))
    b_prompt = prompts[0]
    try:
        with ThreadPoolExecutor(1) as pool:
            sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)

            async def main():
                b_last = (await sch.step(1, 0, embedder.embed(b_prompt))).out[-1]
                prefill = asyncio.ensure_future(sch.step(0, 0, long_rows, all_logits=True))
                during = 0
                for i in range(12):
                    x = embedder.embed([int(np.argmax(b_last))])
                    b_last = (await sch.step(1, len(b_prompt) + i, x)).out[0]
                    during += not prefill.done()
                return (await prefill).out, during

            long_out, during = asyncio.run(main())
            positions = [ex.pos_max(0), ex.pos_max(1)]
    finally:
        ex.close()
    assert long_out.shape == (5 * BLOCK, ex.n_vocab)  # every row's logits, chunk outputs joined
    assert positions == [5 * BLOCK - 1, len(b_prompt) + 11]
    kinds = [(kind, seqs, rows) for kind, seqs, rows in sch.units]
    chunks = [i for i, (kind, seqs, _) in enumerate(kinds) if kind == "chunk" and seqs == (0,)]
    assert [kinds[i][2] for i in chunks] == [BLOCK] * 5  # cut on the 64-row grid
    # Between every two chunks of the prefill, session 1's decode step ran.
    for a, b in zip(chunks, chunks[1:]):
        assert ("batch", (1,), 1) in kinds[a + 1 : b]
    assert during >= 4



def test_a_heavy_clients_prefill_is_held_for_a_light_clients_due_decode_steps(smol, prompts, span_cache):
    """Issue 24: a client that prefills without pause must not put a whole chunk (~100-250 ms) before
    each token of a light client. Holds alone here (no chunk is stopped): the chunks they keep out of
    the light client's gaps are never started, so nothing is thrown away. The light client comes
    back GAP_S after each answer (its round trip; the sleep stands for the network, it synchronises
    nothing): once its gap is measured and
    a chunk's cost known, the scheduler holds the greedy chunks for it, so no chunk runs between its
    decode steps while the greedy prefill still has chunks left."""
    gap_s = 0.01
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 30, n_ctx_tokens=1024, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    rng = np.random.default_rng(1)
    long_rows = embedder.embed(list(rng.integers(100, 40_000, size=8 * BLOCK)))
    prompt = prompts[0]
    try:
        with ThreadPoolExecutor(1) as pool:
            sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK, preemptible=False)

            async def main():
                last = (await sch.step(1, 0, embedder.embed(prompt), client="modest")).out[-1]
                sch.usage.charge("greedy", 5000.0, time.monotonic())  # it has kept the peer busy for seconds
                prefill = asyncio.ensure_future(sch.step(0, 0, long_rows, client="greedy"))
                for i in range(12):
                    await asyncio.sleep(gap_s)
                    x = embedder.embed([int(np.argmax(last))])
                    last = (await sch.step(1, len(prompt) + i, x, client="modest")).out[0]
                await prefill

            asyncio.run(main())
    finally:
        ex.close()
    units = list(sch.units)
    modest = [i for i, u in enumerate(units) if u == ("batch", (1,), 1)]
    chunks = [i for i, u in enumerate(units) if u[0] == "chunk" and u[1] == (0,)]
    assert len(modest) == 12 and len(chunks) == 8
    # From the third step on (a gap measured, a chunk's cost known) the greedy chunks wait, all 6
    # left of 8; without holds one runs in each gap. A loaded machine may overrun one gap.
    during = sum(modest[2] < c < modest[-1] for c in chunks)
    assert during <= 1, units
    assert sch.holds >= 12 - 3 - 1

def test_an_interrupted_step_leaves_its_sequence_as_it_was_and_reruns_bit_for_bit(smol, span_cache):
    """SpanExecutor.interrupt: a forward asked to stop raises, its sequence keeps what it held (the
    stopped rows' positions dropped by llama.cpp), the rerun equals an uninterrupted run, and only
    forward stops: a batch runs through a pending request."""
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 15, n_ctx_tokens=512, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    rows = embedder.embed(list(np.random.default_rng(2).integers(100, 40_000, size=2 * BLOCK)))
    try:
        assert ex.interruptible  # a plain KV cache drops positions exactly
        ref = ex.forward(0, 0, rows)
        ex.forward(1, 0, rows[:BLOCK])
        ex.interrupt()
        with pytest.raises(ExecutorInterrupted, match="interrupted"):
            ex.forward(1, BLOCK, rows[BLOCK:])
        assert ex.pos_max(1) == BLOCK - 1
        x = embedder.embed([42])
        (batch_out,) = ex.forward_batch([BatchStep(0, 2 * BLOCK, x)])  # not stopped by the request
        ex.interrupt(False)
        assert np.array_equal(ex.forward(1, BLOCK, rows[BLOCK:]), ref[BLOCK:])
        assert np.array_equal(ex.forward(1, 2 * BLOCK, x), batch_out)  # the cells after it agree too
    finally:
        ex.close()


def test_an_interrupted_chunk_past_gemmas_sliding_window_reruns_bit_for_bit(gemma_path, span_cache):
    """The same past Gemma-3's 512-position sliding window (its window layers mask positions the chunk
    no longer sees; llama.cpp keeps their cells, `swa_full`): a stopped chunk at positions 704-767
    reruns exactly."""
    embedder = TokenEmbedder(gemma_path)
    ex = SpanExecutor.for_span(gemma_path, 0, 9, n_ctx_tokens=2048, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    rows = embedder.embed(list(np.random.default_rng(4).integers(100, 20_000, size=12 * BLOCK)))
    try:
        assert ex.interruptible
        ref = ex.forward(0, 0, rows)
        ex.forward(1, 0, rows[: 11 * BLOCK])
        ex.interrupt()
        with pytest.raises(ExecutorInterrupted):
            ex.forward(1, 11 * BLOCK, rows[11 * BLOCK :])
        ex.interrupt(False)
        assert ex.pos_max(1) == 11 * BLOCK - 1
        assert np.array_equal(ex.forward(1, 11 * BLOCK, rows[11 * BLOCK :]), ref[11 * BLOCK :])
    finally:
        ex.close()


def test_a_light_clients_arrival_stops_a_heavy_chunk_which_then_reruns_exactly(smol, prompts, span_cache):
    """Issue 24: a newcomer's first step must not wait for the whole chunk of a client that prefills
    without pause. It arrives while the greedy client's first chunk runs on the executor thread: the
    chunk is stopped, the newcomer's prompt runs, then the greedy prefill goes on from that chunk, and
    both outputs equal their solo runs bit for bit. The stopped compute is charged to the newcomer."""
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 30, n_ctx_tokens=1024, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    long_rows = embedder.embed(list(np.random.default_rng(3).integers(100, 40_000, size=4 * BLOCK)))
    prompt = embedder.embed(prompts[0])
    try:
        long_solo = ex.forward(0, 0, long_rows, all_logits=True)
        light_solo = ex.forward(1, 0, prompt)
        ex.clear(0)
        ex.clear(1)
        with ThreadPoolExecutor(1) as pool:
            sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)
            sch.usage = ClientUsage(half_life_s=1e9)  # no decay: the charges add up exactly

            async def main():
                sch.usage.charge("greedy", 5000.0, time.monotonic())  # it has kept the peer busy for seconds
                prefill = asyncio.ensure_future(sch.step(0, 0, long_rows, all_logits=True, client="greedy"))
                while not sch.units:  # until its first chunk is on the executor thread
                    await asyncio.sleep(0)
                light = await sch.step(1, 0, prompt, client="newcomer")
                return (await prefill).out, light.out, light.compute_ms

            long_out, light_out, light_ms = asyncio.run(main())
    finally:
        ex.close()
    assert sch.preemptions == 1 and sch.preempted_ms > 0.0
    # the stopped chunk, the newcomer's prompt, then all four greedy chunks
    assert sch.units == [("stopped", (0,), BLOCK), ("chunk", (1,), len(prompts[0])),
                         *[("chunk", (0,), BLOCK)] * 4]
    assert np.array_equal(long_out, long_solo)
    assert np.array_equal(light_out, light_solo)
    now = time.monotonic()
    assert sch.usage.value("newcomer", now) == pytest.approx(light_ms + sch.preempted_ms)
    assert sch.usage.value("greedy", now) == pytest.approx(5000.0 + sum(sch.unit_ms[2:]))


def test_a_refused_batch_leaves_every_sequence_as_it_was(smol, span_cache):
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 15, n_ctx_tokens=256, n_seq_max=4, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    try:
        for s, n in enumerate((5, 7, 9)):
            ex.forward(s, 0, embedder.embed(list(range(100, 100 + n))))
        x = embedder.embed([42])
        good = [BatchStep(0, 5, x), BatchStep(1, 7, x)]
        with pytest.raises(ExecutorError, match="position"):  # sequence 2 is at 9, not 3
            ex.forward_batch([*good, BatchStep(2, 3, x)])
        with pytest.raises(ExecutorError, match="one step per sequence"):
            ex.forward_batch([*good, BatchStep(0, 5, x)])
        with pytest.raises(ExecutorError, match=f"at most {BLOCK} rows"):
            ex.forward_batch([*good, BatchStep(3, 0, embedder.embed([7] * (BLOCK - 1)))])
        assert [ex.pos_max(s) for s in range(4)] == [4, 6, 8, -1]
        outs = ex.forward_batch(good)  # the same batch, now valid, runs
        assert [o.shape for o in outs] == [(1, ex.n_embd)] * 2
        assert [ex.pos_max(s) for s in range(4)] == [5, 7, 8, -1]
    finally:
        ex.close()


def test_a_prefill_failing_in_a_later_chunk_is_rolled_back_whole(smol, span_cache):
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 15, n_ctx_tokens=256, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    try:
        ex.forward(1, 0, embedder.embed([5, 6, 7]))  # another session, in a KV stream of its own
        assert ex.n_ctx_seq_tokens == 4 * BLOCK  # one sequence's stream: 256 cells (llama.cpp's least)
        rows = embedder.embed(list(range(100, 100 + 4 * BLOCK + 3)))  # 256 + 3 rows > the 256 cells

        async def main():
            with ThreadPoolExecutor(1) as pool:
                sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)
                with pytest.raises(ExecutorError, match="KV cache full"):
                    await sch.step(0, 0, rows)
                return [k for k, _, _ in sch.units]

        kinds = asyncio.run(main())
        assert kinds == ["chunk"] * 5  # four chunks went in before the fifth found no cells
        assert [ex.pos_max(0), ex.pos_max(1)] == [-1, 2]  # the step is gone whole; the other stays
        assert ex.forward(0, 0, rows[:BLOCK]).shape == (BLOCK, ex.n_embd)  # and the cells are free
    finally:
        ex.close()


@pytest.mark.slow
def test_recorded_steps_in_one_call_equal_them_sent_one_by_one(oracle_for, smol, span_cache):
    """A failover's replay (wire.Forward.steps): a prompt step and 40 decode steps given in one call
    compute exactly as they did one by one. Qwen2.5's repacked Q4_K kernels make this the hard case:
    the same rows regrouped into 64-row chunks differ (0.36 logits measured, docs/benchmarks.md)."""
    qwen = resolve_model("qwen2.5-coder-0.5b")
    embedder = TokenEmbedder(qwen)
    prompt = oracle_for(smol).prompt[:38]  # real token ids < 49152
    ex = SpanExecutor.for_span(qwen, 0, 24, n_ctx_tokens=1024, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    try:
        with ThreadPoolExecutor(1) as pool:
            sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)

            async def main():
                rows, outs = [embedder.embed(prompt)], []
                outs.append((await sch.step(0, 0, rows[0], all_logits=True)).out)
                for i in range(40):
                    rows.append(embedder.embed([int(np.argmax(outs[-1][-1]))]))
                    outs.append((await sch.step(0, len(prompt) + i, rows[-1], all_logits=True)).out)
                steps = tuple(r.shape[0] for r in rows)
                replayed = await sch.step(1, 0, np.concatenate(rows), all_logits=True, steps=steps)
                last_only = await sch.step(1, len(prompt) + 40, rows[-1])  # the session goes on
                return np.concatenate(outs), replayed, last_only, steps

            one_by_one, replayed, last_only, steps = asyncio.run(main())
    finally:
        ex.close()
    assert steps == (38,) + (1,) * 40
    assert replayed.out.shape == one_by_one.shape == (78, ex.n_vocab)
    assert np.array_equal(replayed.out, one_by_one), float(np.abs(replayed.out - one_by_one).max())
    assert last_only.out.shape == (1, ex.n_vocab)


def test_recorded_steps_failing_part_way_are_rolled_back_whole(smol, span_cache):
    embedder = TokenEmbedder(smol)
    ex = SpanExecutor.for_span(smol, 0, 15, n_ctx_tokens=256, n_seq_max=2, n_threads=N_THREADS,
                               cache_dir=span_cache, n_batch=BLOCK)
    try:
        ex.forward(1, 0, embedder.embed([5, 6, 7]))
        rows = embedder.embed(list(range(100, 100 + 4 * BLOCK + 3)))  # 259 rows > the 256 cells
        steps = (4 * BLOCK - 6,) + (1,) * 9

        async def main():
            with ThreadPoolExecutor(1) as pool:
                sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)
                with pytest.raises(ExecutorError, match="KV cache full"):
                    await sch.step(0, 0, rows, steps=steps)
                return await sch.call(ex.pos_max, 0), [(k, n) for k, _, n in sch.units]

        pos_max, units = asyncio.run(main())
        # four prefill chunks, six decode steps, a seventh (the 257th row) finds no cell, the rollback
        assert units == (
            [("chunk", BLOCK)] * 3 + [("chunk", BLOCK - 6)] + [("batch", 1)] * 7 + [("call", 0)] * 2
        )
        assert [pos_max, ex.pos_max(1)] == [-1, 2]  # the frame is gone whole; the other session stays
    finally:
        ex.close()
