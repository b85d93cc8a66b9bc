"""Drafts: guesses of the next tokens that one verify pass over the route checks at once.

A draft is only a guess: the last span samples every drafted row as it would have sampled it one
token at a time, and the client keeps the drafted tokens up to the first that differs
(swarm/spec/verify.py). A bad draft therefore costs time, never changes the text.

`PromptLookup` (prompt lookup decoding, as llama.cpp's `ngram` speculative mode and the `transformers`
`prompt_lookup_num_tokens` option do it) needs no model: it finds the latest earlier occurrence of the
text's last n tokens and proposes the tokens that followed it. It pays on text that copies its
context (editing code, quoting a document) and proposes nothing on novel text. A draft model (a
GGUF with the target's tokenizer, e.g. the target requantized lower) guesses novel text too; it runs
on llama.cpp, so it lives with the client's other I/O: swarm/client/draftmodel.py. `HeadDrafts`
proposes the guess of the model's own multi-token-prediction head, which the route's last span
answers beside each kept token (`Token.draft`): no model in the client, one token per pass.

This module does not: verify, sample, or touch a network or a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Draft(Protocol):
    """A source of drafted tokens for one generation. A draft holding resources (a draft model's
    context: swarm/client/draftmodel.py) also has `close()`, which the generation calls at its end;
    one that reads the route's answers (`HeadDrafts`) has `attach(telemetry)`, which the generation
    calls with its `GenerationTelemetry` before the first proposal."""

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Guess up to `k` tokens that follow `tokens` (the prompt and every token generated so far).

        Returns:
            0..k token ids; [] when the draft has no guess (the client then decodes one token).
        """


class PromptLookup:
    """Drafts copied from the context: after the latest earlier match of the last n tokens.

    Args:
        max_ngram: longest suffix matched first (tried down to `min_ngram`).
        min_ngram: shortest suffix matched (>= 1).
    Raises:
        ValueError: min_ngram < 1 or max_ngram < min_ngram.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """The up to `k` tokens after the latest earlier occurrence of the longest matching suffix
        (n from max_ngram down to min_ngram); [] when no suffix recurs or k < 1."""
        if k < 1:
            return []
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_ngram, arr.size - 1), self.min_ngram - 1, -1):
            # windows that start early enough to be followed by at least one token
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start : start + k].tolist()
        return []


class HeadDrafts:
    """Drafts of the model's multi-token-prediction (MTP, nextn) head, served on the route's last
    span: with `RemoteEngine.mtp_drafts` set, the answer to each kept token carries up to that many
    greedy guesses of the tokens after it (`Token.draft`), the head's drafts chained as llama.cpp's
    MTP driver chains one head (each from the guess before and the head's own hidden state), which
    the route session files by position in `GenerationTelemetry.mtp_drafts`. This draft proposes
    the guesses from the next position on, so each pass verifies up to `RemoteEngine.mtp_drafts`
    (at most MTP_MAX_DRAFTS, 8). A pass whose guesses are rejected brings the head's guesses after
    the token that replaces them (the last span drafts from the accepted rows: `Token.draft`), so
    every pass carries guesses; where the head no longer holds that position the answer has none
    and the next step decodes plainly.
    """

    def __init__(self) -> None:
        self._by_position: dict[int, tuple[int, ...]] = {}

    def attach(self, telemetry) -> None:
        """Read the guesses of the generation whose `GenerationTelemetry` is `telemetry`."""
        self._by_position = telemetry.mtp_drafts

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """The head's guesses of the tokens at positions len(tokens).. (the token after the last
        one), at most `k`; [] when the route has not answered one for that position."""
        if k < 1:
            return []
        return list(self._by_position.get(len(tokens), ()))[:k]
