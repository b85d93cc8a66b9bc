"""Per-architecture facts, one frozen row per GGUF `general.architecture`.

Everything that differs between model families and matters to slicing, span execution or client
embedding lives here, so the rest of the code asks a row (`row.capture_name`, `row.embedding_scale`)
and never compares architecture names. A new architecture is one row plus one parity case.

This module does no I/O and knows nothing about files, peers or llama.cpp handles.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.errors import UnsupportedArchitecture


@dataclass(frozen=True)
class SwaPattern:
    """How llama.cpp derives a per-layer sliding-window flag when the GGUF does not list it.

    llama.cpp's `set_swa_pattern(n_pattern, dense_first)`: layer `il` uses sliding-window attention
    iff `n_pattern == 0 or il % n_pattern < n_pattern - 1` (or `il % n_pattern != 0` when
    `dense_first`). The pattern depends on the layer's index in the file, so a span that does not
    start at a multiple of `n_pattern` must carry the flags explicitly.

    Attributes:
        key_suffix: metadata key after `<arch>.`; holds either a period (uint) or a bool array.
        default_period: period llama.cpp assumes when the key is absent.
        dense_first: the dense (global-attention) layer opens each period instead of closing it.
        window_key_suffix: the pattern applies only if `<arch>.<this>` is present and > 0.
        reason: why the row needs this.
    """

    key_suffix: str
    default_period: int
    dense_first: bool
    window_key_suffix: str
    reason: str

    def flags(self, n_layers: int, period: int) -> list[bool]:
        """Per-layer sliding-window flags for a whole model of `n_layers` blocks.

        Returns:
            list of `n_layers` bools, True where the layer uses the sliding window.
        """
        if period == 0:
            return [True] * n_layers
        if self.dense_first:
            return [il % period != 0 for il in range(n_layers)]
        return [il % period < period - 1 for il in range(n_layers)]


@dataclass(frozen=True)
class ArchRow:
    """Facts about one GGUF architecture.

    Attributes:
        name: the GGUF `general.architecture` string.
        capture_name: graph tensor name of a block's output residual; the span's boundary tensor is
            `<capture_name>-<n_layers_in_span - 1>`.
        per_layer_keys: metadata key suffixes (after `<arch>.`) known to hold one value per layer;
            slicing also cuts any other `<arch>.*` array whose length equals the block count.
        embedding_scale: None, or "sqrt_hidden": llama.cpp's graph multiplies token embeddings by
            `sqrtf(n_embd)` (f32) only when fed token ids, so whoever embeds tokens applies it.
        tied_head_fallback: the output head may be absent, in which case llama.cpp uses
            `token_embd.weight` as the head.
        state_kind: "kv" (attention KV cache; rollback by position is exact).
        swa_pattern: None, or how llama.cpp derives per-layer sliding-window flags implicitly.
        final_tensors: non-block tensor names the final span needs besides the head.
        torch_reference: `swarm.reference` implements this block (llama-style: RMSNorm, rotary
            attention with grouped KV heads, optional q/k/v bias, SwiGLU).
        rope_neox: rotary embedding rotates the two halves of each head (NEOX) rather than adjacent
            pairs (llama.cpp's `LLAMA_ROPE_TYPE_NEOX` vs `_NORM` for the architecture).
    """

    name: str
    capture_name: str = "l_out"
    per_layer_keys: tuple[str, ...] = ()
    embedding_scale: str | None = None
    tied_head_fallback: bool = True
    state_kind: str = "kv"
    swa_pattern: SwaPattern | None = None
    final_tensors: tuple[str, ...] = ("output_norm.weight",)
    torch_reference: bool = False
    rope_neox: bool = False


_GEMMA_SWA = SwaPattern(
    key_suffix="attention.sliding_window_pattern",
    default_period=6,
    dense_first=False,
    window_key_suffix="attention.sliding_window",
    reason="llama.cpp derives sliding-window layers from the index in the file (il % 6 < 5); "
           "a span starting elsewhere must list the flags explicitly",
)

_ROWS: dict[str, ArchRow] = {
    row.name: row
    for row in (
        ArchRow(name="llama", torch_reference=True),
        ArchRow(name="qwen2", torch_reference=True, rope_neox=True),
        ArchRow(
            name="gemma3",
            per_layer_keys=("attention.sliding_window_pattern",),
            embedding_scale="sqrt_hidden",
            swa_pattern=_GEMMA_SWA,
        ),
    )
}


def arch_row(arch: str) -> ArchRow:
    """The row for a GGUF `general.architecture` value.

    Raises:
        UnsupportedArchitecture: no row for `arch`; the message names it and the supported ones.
    """
    row = _ROWS.get(arch)
    if row is None:
        known = ", ".join(sorted(_ROWS))
        raise UnsupportedArchitecture(f"architecture {arch!r} is not supported (supported: {known})")
    return row


def supported_architectures() -> tuple[str, ...]:
    """Names of every architecture with a row, sorted."""
    return tuple(sorted(_ROWS))
