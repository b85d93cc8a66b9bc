"""The whole-model oracle of a multi-token-prediction (MTP) head: llama.cpp's target and MTP contexts
on the whole GGUF, driven as common/speculative.cpp drives them (csrc/mtp_oracle.cpp, built by
scripts/build_csrc.sh into tests/helpers/libswarm_mtp_oracle.so; llama-cpp-python has no MTP API).

Same numeric contract as `tests.helpers.oracle`: flash attention, the prompt in llama_decode calls
of UBATCH_TOKENS rows, one-token steps on 1 thread, multi-row ones on N_THREADS. This module does
not build spans.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm.arch import arch_row
from swarm.ggml_bridge.slicing import read_span_layers
from swarm.numeric import UBATCH_TOKENS
from tests.helpers.oracle import N_DECODE, N_THREADS

LIB_PATH = Path(__file__).with_name("libswarm_mtp_oracle.so")
_STATUS = {-1: "bad argument", -2: "cannot load the model", -3: "cannot create a context",
           -4: "llama_decode failed", -5: "the model has no MTP block"}


@dataclass(frozen=True)
class MtpOracle:
    """A whole-model run with its MTP head.

    Attributes:
        prefill_logits: [len(prompt), n_vocab] float32, target logits of every prompt token.
        tokens: the N_DECODE greedy tokens fed after the prompt.
        step_logits: [N_DECODE, n_vocab] float32; row i = target logits after feeding tokens[i].
        draft_logits: [N_DECODE + 1, n_vocab] float32 MTP logits: row 0 for tokens[0] fed after the
            prompt (drafting the token after it), row i + 1 for the greedy token after step i.
        chain_logits: [N_DECODE + 1, n_chain, n_vocab] float32: chain_logits[i, 0] is draft_logits[i],
            chain_logits[i, j + 1] the head's logits after the greedy token of chain_logits[i, j]
            (llama.cpp's chained drafts of one head).
    """

    prefill_logits: np.ndarray
    tokens: list[int]
    step_logits: np.ndarray
    draft_logits: np.ndarray
    chain_logits: np.ndarray


def run_mtp_oracle(model_path: Path, prompt: list[int], n_vocab: int, n_decode: int = N_DECODE,
                   n_chain: int = 3) -> MtpOracle:
    """Prompt, then `n_decode` greedy steps, with a chain of `n_chain` MTP drafts after the prompt and
    after each step.

    Raises:
        RuntimeError: the oracle library is missing (run scripts/build_csrc.sh) or llama.cpp failed.
    """
    if not LIB_PATH.exists():
        raise RuntimeError(f"{LIB_PATH} is missing: build it with scripts/build_csrc.sh")
    lib = ctypes.CDLL(str(LIB_PATH))
    fn = lib.swarm_mtp_oracle_run
    fn.restype = ctypes.c_int
    ptr = ctypes.c_void_p
    i32 = ctypes.c_int32
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ptr, i32, i32, i32, i32, i32, i32, ptr, ptr, ptr, ptr]
    ids = np.asarray(prompt, dtype=np.int32)
    prefill = np.zeros((len(ids), n_vocab), dtype=np.float32)
    steps = np.zeros((n_decode, n_vocab), dtype=np.float32)
    tokens = np.zeros(n_decode, dtype=np.int32)
    drafts = np.zeros((n_decode + 1, n_chain, n_vocab), dtype=np.float32)
    arch, n_layers = read_span_layers(model_path)
    row = arch_row(arch)
    # the tensor the head reads, as the span executor captures it (ArchRow.mtp_input)
    h_name = "h_nextn" if row.mtp_input == "h_nextn" else f"{row.capture_name}-{n_layers - 1}"
    rc = fn(str(model_path).encode(), h_name.encode(), ids.ctypes.data, len(ids), n_decode, UBATCH_TOKENS,
            N_THREADS, n_vocab, n_chain, prefill.ctypes.data, steps.ctypes.data, tokens.ctypes.data,
            drafts.ctypes.data)
    if rc != 0:
        raise RuntimeError(f"MTP oracle on {model_path}: {_STATUS.get(rc, rc)}")
    return MtpOracle(prefill_logits=prefill, tokens=[int(t) for t in tokens], step_logits=steps,
                     draft_logits=drafts[:, 0], chain_logits=drafts)


def kept_by_chain(chain: tuple[int, ...], pos: int, tokens_at: dict[int, int]) -> int:
    """How many guesses of `chain` (filed at `pos`: its first guesses the token at pos) a verify pass
    can keep: its leading guesses equal to the tokens at pos, pos + 1, ...."""
    n = 0
    while n < len(chain) and chain[n] == tokens_at.get(pos + n):
        n += 1
    return n
