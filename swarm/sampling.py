"""Logits → token: greedy, or top-k → top-p → temperature with a per-position seeded draw.

The last span of a route calls `sample` on the logits of the last token of each step and sends
only the token id (plus top log-probs) back to the client. The draw for a position comes from
`np.random.default_rng([seed, position])`, so replaying a position after a rollback or a
failover draws the same token. The order of the filters follows llama.cpp's default sampler
chain (top_k, then top_p on the raw-logit softmax, then temperature, then the draw).

This module does not: touch the executor, hold state between calls, or use the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from swarm.errors import RequestError

MAX_TOP_LOGPROBS = 20
"""Most top log-probs a request may ask for per token (as OpenAI-style APIs allow)."""

_MAX_SEED = 2**64 - 1


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


@dataclass(frozen=True)
class SamplingParams:
    """How the last span turns logits into a token.

    Attributes:
        temperature: 0 means greedy (argmax, ties → lowest id); > 0 scales logits by 1/temperature.
            Any finite positive value is valid: one so small that 1/temperature overflows
            (e.g. 1e-310) draws greedily, never from NaN probabilities.
        top_p: nucleus mass in (0, 1]; 1 keeps every token.
        top_k: keep the k most likely tokens; 0 (or any k >= n_vocab) keeps every token.
        seed: 0..2**64-1; with the position it seeds the draw.
        n_top_logprobs: 0..MAX_TOP_LOGPROBS highest log-probs to return per token.
        logprobs: also return the sampled token's log-prob. It costs a log-softmax over the whole
            vocabulary on every token (~0.6 ms at 152k tokens on one core of the reference machine,
            docs/benchmarks.md), so it is computed only when asked (or when n_top_logprobs > 0).
    Raises:
        RequestError: a field has the wrong type or is out of range.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    n_top_logprobs: int = 0
    logprobs: bool = False

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not _is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED:
            raise RequestError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not _is_int(self.n_top_logprobs) or not 0 <= self.n_top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"n_top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.n_top_logprobs!r}"
            )
        if not isinstance(self.logprobs, bool):
            raise RequestError(f"logprobs must be a boolean, got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        """True when sampling is a plain argmax (temperature 0)."""
        return self.temperature == 0


@dataclass(frozen=True)
class SampleResult:
    """One sampled token.

    Attributes:
        token: the chosen token id.
        logprob: natural-log probability of `token` under the raw logits (log_softmax, no filters);
            None unless the params asked for log-probs.
        top: up to n_top_logprobs (token id, logprob) pairs, most likely first, ties → lowest id.
    """

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]


def _check_logits(logits: np.ndarray) -> np.ndarray:
    _check_form(logits)
    _check_top(np.max(logits))  # NaN propagates through max: one pass finds NaN, +inf, all -inf
    return logits


def _check_form(logits: np.ndarray) -> None:
    if not isinstance(logits, np.ndarray) or logits.ndim != 1 or logits.size == 0:
        raise RequestError("logits must be a non-empty 1-D array [n_vocab]")
    if not np.issubdtype(logits.dtype, np.floating):
        raise RequestError(f"logits must be floating point, got {logits.dtype}")


def _check_top(top: np.floating) -> None:
    """Refuse logits whose maximum (NaN when any is NaN) is `top`, in their own dtype (a long double
    past float64's range is refused later, by name)."""
    if np.isnan(top) or top == np.inf:
        raise RequestError("logits contain NaN or +inf")
    if top == -np.inf:
        raise RequestError("every logit is -inf")


def _top_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values of x, largest first, ties → lowest id. `[min(k, n)]` int64."""
    if k >= x.size:
        return np.argsort(-x, kind="stable")
    threshold = np.partition(x, x.size - k)[x.size - k]
    cand = np.flatnonzero(x >= threshold)  # ascending ids, includes every tie at the threshold
    return cand[np.argsort(-x[cand], kind="stable")][:k]


def _logsumexp(x: np.ndarray) -> float:
    """log(sum(exp(x))) of a finite-max float array, summed in float64."""
    m = float(np.max(x))
    return m + math.log(float(np.sum(np.exp(x - x.dtype.type(m)), dtype=np.float64)))


def _tempered_softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(x / temperature) of a `[m]` float64 array with a finite max, for any temperature > 0.

    The max is subtracted before dividing: (x - max) / T is <= 0 and the max's own entry is exactly
    0, so no temperature overflows to +inf or NaN. A temperature so small that every other entry's
    weight underflows (1e-310, or any T < ~1e-300 on real logits) leaves all the mass on the maxima:
    the draw is then greedy (among exact ties, uniform).
    """
    with np.errstate(over="ignore", under="ignore"):  # (x - max) / tiny T -> -inf -> weight 0: intended
        e = np.exp((x - np.max(x)) / temperature)
    return e / e.sum()


def _nucleus_ids(x: np.ndarray, top_p: float) -> np.ndarray:
    """Ids of the smallest most-likely-first prefix of softmax(x) whose mass reaches top_p.

    Grows a top-k candidate set instead of sorting the whole vocabulary: the nucleus is usually
    far smaller than n_vocab. `x`: `[n]` float64; returns `[m]` int64, m >= 1.
    """
    m = np.max(x)
    z = np.sum(np.exp(x - m))
    k = 64
    while True:
        ids = _top_ids(x, k)
        cum = np.cumsum(np.exp(x[ids] - m)) / z
        if cum[-1] >= top_p or k >= x.size:
            break
        k *= 4
    keep = int(np.searchsorted(cum, top_p, side="left")) + 1
    return ids[: max(1, min(keep, ids.size))]


def distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The distribution a non-greedy draw samples from, after top-k, top-p and temperature.

    Args:
        logits: `[n_vocab]` float, raw logits of one token (may hold -inf, not NaN or +inf).
        params: sampling parameters with temperature > 0.
    Returns:
        (ids, probs): `[m]` int64 candidate ids and their `[m]` float64 probabilities summing to 1,
        m >= 1; ids are most likely first (ties → lowest id) after top-k or top-p, and in id order
        when no filter applies (top_k 0 or >= n_vocab, top_p 1).
    Raises:
        RequestError: logits malformed or temperature == 0 (greedy has no distribution).
    """
    logits = _check_logits(logits)
    if params.greedy:
        raise RequestError("greedy sampling (temperature 0) has no distribution")
    with np.errstate(over="ignore"):
        x = logits.astype(np.float64)
    if np.isposinf(x).any():  # a wider float (float128) can overflow float64
        raise RequestError("logits overflow float64")
    if 0 < params.top_k < x.size:  # top_k >= n_vocab keeps every token: the same draw as top_k 0
        ids = _top_ids(x, params.top_k)
        if params.top_p < 1:
            ids = ids[_nucleus_ids(x[ids], params.top_p)]
    elif params.top_p < 1:
        ids = _nucleus_ids(x, params.top_p)
    else:
        ids = np.arange(x.size)
    probs = _tempered_softmax(x[ids], params.temperature)
    if not np.isfinite(probs).all():  # cannot happen with a finite max; never let NaN reach a draw
        raise RequestError(f"sampling distribution is not finite at temperature {params.temperature!r}")
    return ids, probs


def sample(logits: np.ndarray, params: SamplingParams, position: int) -> SampleResult:
    """Choose the token for one position.

    Args:
        logits: `[n_vocab]` float32 (any float dtype), raw logits of the token at `position`.
        params: sampling parameters.
        position: 0-based position in the session of the token being produced; seeds the draw.
    Returns:
        SampleResult: token id, its log-prob under the raw logits (when asked), top log-probs.
    Raises:
        RequestError: logits malformed (not 1-D, empty, NaN, +inf, all -inf) or position < 0.
    """
    if not _is_int(position) or position < 0:
        raise RequestError(f"position must be an integer >= 0, got {position!r}")
    if params.greedy:
        _check_form(logits)
        token = int(np.argmax(logits))
        # argmax lands on the first NaN, else on +inf, else on -inf only when every logit is -inf:
        # the logit it chose checks them all, in its one pass over the vocabulary
        _check_top(logits[token])
    else:
        logits = _check_logits(logits)
        ids, probs = distribution(logits, params)
        u = np.random.default_rng([params.seed, position]).random()
        i = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
        token = int(ids[min(i, ids.size - 1)])
    if not (params.logprobs or params.n_top_logprobs):
        return SampleResult(token=token, logprob=None, top=())
    lse = _logsumexp(logits)
    top: tuple[tuple[int, float], ...] = ()
    if params.n_top_logprobs:
        top = tuple((int(i), float(logits[i]) - lse) for i in _top_ids(logits, params.n_top_logprobs))
    return SampleResult(token=token, logprob=float(logits[token]) - lse, top=top)
