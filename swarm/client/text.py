"""Turning generated tokens into text deltas that are always valid UTF-8, and stop strings.

A token's bytes can end in the middle of a multi-byte character (CJK, emoji); the incremental
decoder from `codecs` holds such a tail back until the character is complete, so every delta the
user sees decodes on its own and the deltas concatenate to the final text.

This module does not tokenize; it receives token bytes from a tokenizer.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class DeltaDecoder:
    """Incremental UTF-8 decoding of token bytes, with stop strings held back until decided.

    Text that could still be the start of a stop string is not emitted until the next token shows
    whether the stop string completes; once one completes, the text before it is final.

    Args:
        stop: strings that end generation when they appear in the output (not included in it).
    """

    def __init__(self, stop: Sequence[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._text = ""
        self._emitted = 0
        self.stopped = False

    @property
    def text(self) -> str:
        """Text emitted so far (the final text once generation ended)."""
        return self._text[: self._emitted]

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the new delta (possibly empty)."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(piece)
        return self._advance(final=False)

    def finish(self) -> str:
        """Flush at the end of generation: an incomplete character becomes U+FFFD."""
        if not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        for s in self._stop:
            at = self._text.find(s, max(0, self._emitted - len(s)))
            if at != -1:
                self._text = self._text[:at]
                self.stopped = True
                final = True
        safe = len(self._text) if final else len(self._text) - self._held_back()
        if safe <= self._emitted:
            return ""
        delta = self._text[self._emitted : safe]
        self._emitted = safe
        return delta

    def _held_back(self) -> int:
        # Longest suffix of the text that is a proper prefix of some stop string.
        longest = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._text)), longest, -1):
                if self._text.endswith(s[:k]):
                    longest = k
                    break
        return longest
