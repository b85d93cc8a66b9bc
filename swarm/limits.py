"""Product-wide limits, in one place so that every check quotes the same number."""

MAX_CONTEXT_TOKENS = 131_072
"""Hard cap on tokens per session (prompt + generated), whatever the model supports."""
