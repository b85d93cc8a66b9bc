"""Text in and out of the tokenizer: input that must be UTF-8, output deltas that always are.

Input: `check_utf8` refuses text that cannot be encoded as UTF-8 (a lone surrogate such as
"\\ud83d", or bytes that were not UTF-8 in argv or stdin, which Python decodes to U+DC80..U+DCFF);
the tokenizer calls it on every prompt and chat message, so such text is a `RequestError`, never
a UnicodeEncodeError from deep inside.

Output: a token's bytes can end in the middle of a multi-byte character (CJK, emoji); the incremental
decoder from `codecs` holds such a tail back until the character is complete, so every delta the
user sees decodes on its own and the deltas concatenate to the final text.

This module does not tokenize; it receives token bytes from a tokenizer.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from swarm.errors import RequestError


def check_utf8(text: object, what: str) -> str:
    """Return `text` if it is a str that encodes as UTF-8.

    Args:
        text: the user's text (prompt, chat message content, stop string).
        what: what it is, for the message ("prompt", "message 2 content", ...).
    Returns:
        `text` unchanged.
    Raises:
        RequestError: not a str, or it holds a surrogate code point: either a byte that was not
            UTF-8 (argv and stdin decode it to U+DC80..U+DCFF, named here as the original byte) or
            a lone UTF-16 surrogate (half of a pair, e.g. "\\ud83d").
    """
    if not isinstance(text, str):
        raise RequestError(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        cp = ord(text[e.start])
        if 0xDC80 <= cp <= 0xDCFF:
            detail = f"byte 0x{cp - 0xDC00:02x} at character {e.start} (is the terminal's encoding UTF-8?)"
        else:
            detail = f"lone surrogate U+{cp:04X} at character {e.start} (half of a UTF-16 pair)"
        raise RequestError(f"{what} is not valid UTF-8 text: {detail}") from None
    return text


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
