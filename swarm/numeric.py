"""The numeric contract: the one ubatch grid in which every path computes a generation's rows.

llama.cpp's CPU kernels round a row differently depending on how many rows share its ubatch (a
matmul over 64 rows is not a matmul over 512 rows cut into pieces), so two paths that group a
prompt's rows differently give different logits, and after a few tokens different text (measured:
SmolLM2, a 300-token prompt, ubatches of 64 vs llama.cpp's default 512: the first generated token
already differs). So every path groups rows alike:

- a prompt's rows are computed in ubatches of `UBATCH_TOKENS` rows at positions [k·G, (k+1)·G)
  (G = UBATCH_TOKENS; the last ubatch holds the rest), each ubatch one sequence's rows alone;
- every generated token is computed as a one-row step on 1 thread (several sessions' one-row steps
  may share a llama_decode only where the peer measured that sharing changes no row:
  swarm/peer/scheduler.py); multi-row ubatches run on any number of threads.

Why 1 thread for a one-row step: ggml's CPU flash attention splits a single query row's KV cells
across the threads once the attention view holds 512 cells or more (llama.cpp pads the view to a
multiple of 256, so past 256 cached tokens) and adds the per-thread partial sums, so the sum's
rounding, and the logits, depend on the thread count (measured, 2-thread against 1-thread decode
steps after 300-1,100-token prompts: up to 1.33 logits on SmolLM2, 0.47 on Qwen2.5-0.5B, 1.31 on
Gemma-3-270M; scripts/numeric_threads.py, docs/benchmarks.md "Decode threads"). A multi-row ubatch
is split across threads by rows, each row summed whole by one thread, so prefill is
thread-independent. llama.cpp runs a ubatch of one token on its `n_threads` and a longer one on
`n_threads_batch`: every path sets n_threads = 1 and n_threads_batch to its configured count.
Switching flash attention off instead removes the split, but a trial of it (issue 27) broke the
exact row groups of speculative decoding's verify passes (swarm/peer/exact_rows.py; 7 failures in
tests/integration/test_speculative.py), so it stays on.

The local backend (swarm/client/local.py) sets llama.cpp's n_ubatch to G and n_threads to 1 and
feeds the prompt in batches of a multiple of G from position 0; a peer's executor (csrc/swarm_span.c,
also n_threads 1) runs ubatches of G rows and cuts a multi-row step into chunks of G from the step's
start; the client starts every prefill frame at a multiple of G (`check_chunk_tokens`); prefix restores happen at multiples of G
(swarm/kv/prefix.py: the hash block is G), and a failover replay re-sends each recorded step as it
was first sent (swarm/route/replay.py). Each session's KV cells start at cell 0 of a KV stream of
its own (llama.cpp `kv_unified = false`), as in a whole model holding one sequence. The output is
then, token for token and logit for logit, llama.cpp's whole model run on one sequence with
`n_ubatch = G`, flash attention on, the prompt evaluated from position 0 and each generated token
decoded alone on 1 thread (`n_threads = 1`, `n_threads_batch` any).

Why 64: scripts/bench_ubatch.py (docs/benchmarks.md, "The ubatch grid") measured whole-model prefill
on 2 cores at 64 rows within about 10% of 128, 256 and 512 (which are within noise of each other),
while 64 keeps the granularity of prefix reuse at 64 tokens and the delay one prefill chunk adds to
other sessions' decode steps on a peer at one 64-row chunk.

This module is pure: it holds the grid and its checks, nothing else.
"""

from __future__ import annotations

from swarm.errors import RequestError

UBATCH_TOKENS = 64
"""Rows per ubatch of every prefill on every path: the grid of the numeric contract."""


def check_chunk_tokens(chunk_tokens: int, what: str = "prefill_chunk_tokens") -> int:
    """Check that prompt chunks of `chunk_tokens` rows keep every ubatch on the grid.

    A chunk that is not a multiple of UBATCH_TOKENS would start the next chunk off the grid, and the
    rows after it would be grouped into other ubatches than on every other path: the output would
    differ from the contract's (measured: `prefill_chunk_tokens=100` matched neither the local
    backend nor llama.cpp). Refused rather than rounded: a silently changed setting would hide that
    the caller asked for something the contract cannot give.

    Args:
        chunk_tokens: rows per prefill chunk (frame, llama_decode call).
        what: the setting's name, for the message.
    Returns:
        chunk_tokens.
    Raises:
        RequestError: not a positive integer multiple of UBATCH_TOKENS; the message names the
            nearest valid values.
    """
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise RequestError(f"{what} must be a positive multiple of {UBATCH_TOKENS}, got {chunk_tokens!r:.40}")
    if chunk_tokens % UBATCH_TOKENS:
        below = chunk_tokens // UBATCH_TOKENS * UBATCH_TOKENS
        above = below + UBATCH_TOKENS
        nearest = f"{below} or {above}" if below else f"{above}"
        raise RequestError(
            f"{what} must be a multiple of {UBATCH_TOKENS} (the ubatch grid every path computes in, so "
            f"that the output equals llama.cpp's whole model); got {chunk_tokens}, use {nearest}"
        )
    return chunk_tokens
