"""TEST ONLY: a peer that lies about its computation, so spot checks can be tested on real peers.

Reachable only through the environment variable `SWARM_TEST_LIE` (never a CLI option); a peer
started with it prints a loud warning on stderr. Modes:

- `noise`: every step's output rows get Gaussian noise of `NOISE_SCALE` (5%) of each row's RMS;
- `noise:N`: only about one step in N (a step whose start position hashes to 0 mod N with the seed
  `SWARM_TEST_LIE_SEED`, so a lie falls on the same positions in every session and test runs are
  repeatable);
- `transit`: the hidden states pushed to the next hop get that noise, the client's copy not (a
  peer altering activations between pushing peers);
- `lazy:TYPE`: the span is served from a lower quantization of the same weights (TYPE a llama.cpp
  ftype name such as `Q3_K_M` or `Q2_K`), requantized with llama.cpp's own quantizer into
  `$SWARM_HOME/lazy/` (`requantize`). On the last span the noise modes put `LOGIT_NOISE_SCALE`
  noise on the logits before sampling, so it answers wrong tokens.

A lying peer wants traffic: it announces `BOAST` (10) times its measured speed, so routes take it
over honest peers of its span (which then serve the checks).

This module does not: decide whether a peer lies anywhere but here (the handler asks `corrupt`,
the span loader asks `lazy_type`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm.peer.rules import Throughput

ENV = "SWARM_TEST_LIE"
SEED_ENV = "SWARM_TEST_LIE_SEED"
"""Seeds which positions a `noise:N` liar lies at, and its noise (default 0)."""
NOISE_SCALE = 0.05
"""Noise standard deviation as a fraction of each output row's RMS."""
LOGIT_NOISE_SCALE = 1.0
"""On the last span the noise goes on the logits before sampling, at this fraction of each row's
RMS: the sampled token then differs at most steps (5% would seldom move an argmax)."""
BOAST = 10.0
"""A lying peer announces this many times its measured speed."""


@dataclass(frozen=True)
class Liar:
    """One test lying mode: `every` > 0 for noise on one step in `every`, `transit` for noise on
    pushed rows only, or `lazy` a quant type."""

    every: int = 0
    lazy: str = ""
    transit: bool = False
    seed: int = 0

    def boast(self, measured: Throughput) -> Throughput:
        """The speed a lying peer announces: `BOAST` times what it measured."""
        return Throughput(measured.decode_steps_per_s * BOAST, measured.prefill_tokens_per_s * BOAST)

    def lies_at(self, pos: int) -> bool:
        """Whether the noise mode lies on the step that starts at position `pos`."""
        if self.every <= 0:
            return False
        return self.every == 1 or int(np.random.default_rng([self.seed, pos]).integers(self.every)) == 0

    def in_transit(self, out: np.ndarray) -> np.ndarray:
        """The rows a `transit` liar pushes to the next hop instead of `out` (its client gets `out`)."""
        if not self.transit:
            return out
        return Liar(every=1, seed=self.seed + 1).corrupt(out, 0, ())

    def corrupt(self, out: np.ndarray, pos0: int, steps: tuple[int, ...], scale: float = NOISE_SCALE) -> np.ndarray:
        """The rows a lying peer answers instead of `out` ([rows, hidden] float32 of the steps
        starting at pos0, of row counts `steps`, or one step when empty), with noise of `scale`
        times each row's RMS (the last span: `LOGIT_NOISE_SCALE` on its logits)."""
        bounds = np.cumsum((0,) + (steps or (out.shape[0],)))
        lied = None
        for a, b in zip(bounds[:-1], bounds[1:]):
            if not self.lies_at(pos0 + int(a)):
                continue
            lied = np.array(out, dtype=np.float32) if lied is None else lied
            block = lied[a:b]
            rms = np.sqrt((block.astype(np.float64) ** 2).mean(axis=1, keepdims=True))
            noise = np.random.default_rng([self.seed, pos0 + int(a), 1]).standard_normal(block.shape)
            lied[a:b] = block + (scale * rms * noise).astype(np.float32)
        return out if lied is None else lied


def from_env(environ=os.environ) -> Liar | None:
    """The lying mode `SWARM_TEST_LIE` asks for, or None; prints a warning when there is one.

    Raises:
        ValueError: the variable names no known mode.
    """
    spec = environ.get(ENV, "").strip()
    if not spec:
        return None
    kind, _, arg = spec.partition(":")
    seed = int(environ.get(SEED_ENV, "0"))
    if kind == "noise":
        liar = Liar(every=int(arg or 1), seed=seed)
        if liar.every < 1:
            raise ValueError(f"{ENV}={spec}: noise:N needs N >= 1")
    elif kind == "transit" and not arg:
        liar = Liar(transit=True, seed=seed)
    elif kind == "lazy" and arg:
        liar = Liar(lazy=arg.upper())
    else:
        raise ValueError(f"{ENV}={spec}: expected noise, noise:N, transit or lazy:TYPE")
    print(f"swarm: WARNING: TEST MODE {ENV}={spec}: this peer returns WRONG hidden states on purpose; "
          "never use it outside tests", file=sys.stderr, flush=True)
    return liar


def requantize(src: Path, quant: str, out_dir: Path) -> Path:
    """`src` requantized to `quant` with llama.cpp's quantizer (cached in `out_dir`).

    Tensors whose rows do not fit the type's block size get llama.cpp's own fallback type.
    Raises:
        ValueError: `quant` is not a llama.cpp file type.
        RuntimeError: llama.cpp failed.
    """
    import ctypes

    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}", None)
    if ftype is None:
        raise ValueError(f"unknown llama.cpp quantization type {quant!r}")
    out = out_dir / f"{src.stem}.{quant}.gguf"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not requantize {src} to {quant} (status {rc})")
    tmp.rename(out)
    return out
