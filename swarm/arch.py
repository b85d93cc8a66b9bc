"""Per-architecture facts, one frozen row per GGUF `general.architecture`.

Everything that differs between model families and matters to slicing, span execution or client
embedding lives here, so the rest of the code asks a row (`row.capture_name`, `row.embedding_scale`)
and never compares architecture names. A new architecture is one row plus one parity case.

This module does no I/O and knows nothing about files, peers or llama.cpp handles. It stays one
file past the house's ~400 lines: it is one table, and its rows read best side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.errors import UnsupportedArchitecture


@dataclass(frozen=True)
class SwaPattern:
    """How llama.cpp derives a per-layer flag from a period when the GGUF does not list the flags.

    Sliding-window attention (llama.cpp's `set_swa_pattern(n_pattern, dense_first)`): layer `il`
    uses the window iff `n_pattern == 0 or il % n_pattern < n_pattern - 1` (or
    `il % n_pattern != 0` when `dense_first`). Recurrent layers of hybrid models follow the same
    rule (`(il + 1) % full_attention_interval != 0`). The flag depends on the layer's index in the
    file, so a span that does not start at a multiple of the period must carry the flags explicitly.

    Attributes:
        key_suffix: metadata key after `<arch>.` holding the period (uint), or the bool array itself
            when `array_key_suffix` is None.
        default_period: period llama.cpp assumes when the key is absent.
        dense_first: the dense (global-attention) layer opens each period instead of closing it.
        window_key_suffix: None, or the pattern applies only if `<arch>.<this>` is present and > 0.
        reason: why the row needs this.
        array_key_suffix: None, or the separate key llama.cpp reads as the per-layer flag array
            (written by slicing; it takes precedence over the period in llama.cpp's loader).
    """

    key_suffix: str
    default_period: int
    dense_first: bool
    window_key_suffix: str | None
    reason: str
    array_key_suffix: str | None = None

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
class LayerTable:
    """A per-layer array llama.cpp fills from a built-in table when the GGUF does not list it.

    Attributes:
        key_suffix: the per-layer array key after `<arch>.` (written explicitly by slicing).
        table: llama.cpp's default values by global layer index, used when the model's
            `<arch>.context_length` >= `min_context_length`; otherwise every layer gets `otherwise`.
        min_context_length: see `table`.
        otherwise: the value of every layer below that context length.
        reason: why the row needs this.
    """

    key_suffix: str
    table: tuple[int, ...]
    min_context_length: int
    otherwise: int
    reason: str

    def values(self, n_layers: int, context_length: int) -> list[int]:
        """llama.cpp's default values for a whole model of `n_layers` blocks."""
        if context_length >= self.min_context_length:
            return list(self.table[:n_layers])
        return [self.otherwise] * n_layers


@dataclass(frozen=True)
class CutConstraint:
    """Where a span may start: only at a layer whose per-layer value of a key is nonzero.

    Attributes:
        key_suffix: the per-layer array key after `<arch>.` (its default from `derived_layer_keys`).
        reason: why a span cannot start elsewhere.
    """

    key_suffix: str
    reason: str


@dataclass(frozen=True)
class MixedSpan:
    """Every span must hold at least one layer with a per-layer flag set and one with it clear.

    Attributes:
        pattern: the `SwaPattern` (in `derived_layer_keys`) whose flags are checked.
        reason: why.
    """

    pattern: SwaPattern
    reason: str


@dataclass(frozen=True)
class Sideband:
    """Something besides the residual stream that must cross a hop (a typed part of the Forward frame).

    Attributes:
        name: the field's name in the frame.
        version: bumped when its encoding changes.
        dtype: numpy dtype string of one element.
        per_token: elements per token.
        reason: why the boundary needs it.
        when_key: None (every span reads it), or a leading-count key suffix of the row: only a span
            whose file has `<arch>.<when_key>` > 0 reads it (the layers that need it lie in front).
    """

    name: str
    version: int
    dtype: str
    per_token: int
    reason: str
    when_key: str | None = None


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
        state_kind: "kv" (attention KV cache; rollback by position is exact), "hybrid" (KV for the
            attention layers plus a per-sequence recurrent state for the others: the state holds only
            the latest position, so a sequence cannot be truncated to an earlier position; a span
            keeps its own layers' state, so it can still be split, and a whole-sequence snapshot
            (export/import at the sequence's end) stays exact) or "compressed" (deepseek4: besides a
            raw window, the cache keeps entries compressed over groups of 4 and 128 positions, which
            llama.cpp cannot cut back to an earlier position; snapshots at the end stay exact).
        swa_pattern: None, or how llama.cpp derives per-layer sliding-window flags implicitly.
        derived_layer_keys: more per-layer arrays llama.cpp derives from the index in the file
            when absent (`SwaPattern` with `array_key_suffix`, or `LayerTable`); slicing writes
            them explicitly.
        leading_count_keys: scalar keys counting the model's first layers of a kind (e.g. leading
            dense blocks before the MoE ones): a span [a, b) stores `clamp(v - a, 0, b - a)`.
        mtp_head: the model's multi-token-prediction (MTP) blocks, which llama.cpp stores after the
            last layer and counts in `<arch>.block_count` (`MTP_LAYERS_KEY` of them, read for
            every architecture), are served: the final span's file keeps them (renumbered after
            its layers) and its executor runs them beside the span (csrc/swarm_span.h,
            `SpanExecutor.mtp_draft`); other spans drop them. False: slicing refuses a GGUF that
            has MTP blocks (llama.cpp has no MTP graph for the architecture).
        mtp_input: the graph tensor whose rows are the head's h input, captured for every row of
            a step on the final span: "h_nextn" (llama.cpp's output-normed residual, `cb(cur,
            "h_nextn", -1)`, with the context's unmasked nextn output on, as common/speculative.cpp
            runs a target that feeds an MTP head) or "residual" (the last block's output named by
            `capture_name`, deepseek4's hyper-connection state l_last).
        mtp_zero_keys: per-layer key suffixes whose MTP-block entries must be 0, because llama.cpp
            asserts it while building the head's graph (a file breaking it would abort the peer).
        default_keys: `(key suffix, uint)` written into a span when the source lacks the key,
            because llama.cpp requires it for some block counts and not others.
        refused_span_lengths: span lengths (blocks) llama.cpp would mistake for another model
            variant when the source has every `default_keys` key; slicing refuses them with
            `span_length_reason`.
        sidebands: what besides the hidden state must cross each hop, typed and versioned.
        boundary_width: residual-stream rows per token per hop, in units of `n_embd` float32.
        residual_input: span files say `<arch>.residual_input = true`: with the project's llama.cpp
            patch (patches/llama.cpp, docs/layer-range.md) a span's input rows are the residual
            stream entering its first block (`boundary_width` x n_embd), its token ids come beside
            them, and only the final span has the head. The client builds the first span's input.
        cut_constraint: None, or where spans may start (`swarm.ggml_bridge.slicing.legal_starts`).
        mixed_span: None, or every span must hold layers of both kinds of a per-layer flag.
        pos_per_token: positions llama.cpp reads per token of an embedding batch (M-RoPE: 4, section-
            major `pos[j * n_tokens + i]`, where a token batch's position p becomes (p, p, p, 0)).
            The C executor derives it from the model's rope type and fills it so; recorded here for
            sizing and as the reason (measured: with one position per token, logits off by ~3).
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
    derived_layer_keys: tuple[SwaPattern | LayerTable, ...] = ()
    leading_count_keys: tuple[str, ...] = ()
    mtp_head: bool = False
    mtp_input: str = "h_nextn"
    mtp_zero_keys: tuple[str, ...] = ()
    default_keys: tuple[tuple[str, int], ...] = ()
    refused_span_lengths: tuple[int, ...] = ()
    span_length_reason: str = ""
    sidebands: tuple[Sideband, ...] = ()
    boundary_width: int = 1
    residual_input: bool = False
    cut_constraint: CutConstraint | None = None
    mixed_span: MixedSpan | None = None
    pos_per_token: int = 1

    @property
    def rollback_exact(self) -> bool:
        """Truncating a sequence to an earlier position is exact (no recurrent state)."""
        return self.state_kind == "kv"

    def boundary_bytes_per_token(self, n_embd: int) -> int:
        """Bytes of residual stream per token crossing a hop (float32), sidebands excluded."""
        return 4 * n_embd * self.boundary_width


_GEMMA_SWA = SwaPattern(
    key_suffix="attention.sliding_window_pattern",
    default_period=6,
    dense_first=False,
    window_key_suffix="attention.sliding_window",
    reason="llama.cpp derives sliding-window layers from the index in the file (il % 6 < 5); "
           "a span starting elsewhere must list the flags explicitly",
)

_RECURRENT_PATTERN = SwaPattern(
    key_suffix="full_attention_interval",
    array_key_suffix="attention.recurrent_layers",
    default_period=4,
    dense_first=False,
    window_key_suffix=None,
    reason="llama.cpp marks layer il recurrent iff (il + 1) % full_attention_interval != 0, counted in "
           "the file; a span starting off the period must list the recurrent layers explicitly",
)

_HYBRID_MIXED = MixedSpan(
    pattern=_RECURRENT_PATTERN,
    reason="llama.cpp's hybrid memory sets the inputs of both caches (attention mask and recurrent "
           "state copy) on every batch; in a span without layers of one kind that input is pruned "
           "from the graph and has no buffer (measured: GGML_ASSERT(buffer) in "
           "llm_graph_input_mem_hybrid::set_input), so every span holds both recurrent and "
           "attention layers",
)

# llama.cpp 0c1e57098 src/models/glm-dsa.cpp GLM_5_2_DEFAULT_INDEXER_TYPES (zai-org/GLM-5.2 config.json)
_GLM52_INDEXER_TYPES = (1, 1) + (1, 0, 0, 0) * 19
_GLM_INDEXER = LayerTable(
    key_suffix="attention.indexer.types",
    table=_GLM52_INDEXER_TYPES,
    min_context_length=1048576,
    otherwise=1,
    reason="without indexer types llama.cpp uses GLM-5.2's table by global layer index (1M context) or "
           "full indexers everywhere; a span must list its layers' types explicitly",
)

_DENSE_LEAD = ("leading_dense_block_count",)
# llama.cpp's LLM_KV_NEXTN_PREDICT_LAYERS: read for every architecture (llama-model.cpp load_hparams)
MTP_LAYERS_KEY = "nextn_predict_layers"

# DeepSeek-V4: the residual stream is `hyper_connection.count` (4) copies of n_embd per token
# (llama.cpp builds [n_embd, hc, n_tokens] from the embedding with ggml_repeat), the first
# `hash_layer_count` layers route experts by token id (ffn_gate_tid2eid), and unpatched llama.cpp
# takes a batch given as embeddings for media (exp_probs_b_vl, no hash routing). The project's
# patch (patches/llama.cpp) adds `<arch>.residual_input`: the span takes the [hc, n_embd] state and
# the token ids, and routes as for text.

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
        ArchRow(name="qwen3moe", rope_neox=True),
        # MLA: the KV cache holds the compressed latent (kv_lora_rank + rope dims) per token, one
        # head; attn_kv_a_mqa / attn_k_b / attn_v_b are per-layer tensors like any other.
        # llama.cpp guesses a "lite" DeepSeek-V2 from the block count (26 or 27 layers, or 48 with a
        # 128,256 vocabulary) and then skips q_lora_rank: a lite model's span of another length
        # needs q_lora_rank = 0 written, and a full model's span of those lengths would load as lite
        ArchRow(name="deepseek2", leading_count_keys=_DENSE_LEAD, mtp_head=True,
                default_keys=(("attention.q_lora_rank", 0),),
                refused_span_lengths=(26, 27, 48),
                span_length_reason="llama.cpp takes a deepseek2 file of 26, 27 or 48 blocks for a "
                                   "'lite' model and ignores its q_lora_rank, so the span would not load"),
        # DSA: as deepseek2, plus per-layer indexer tensors and an indexer key cache per layer.
        ArchRow(name="glm-dsa", leading_count_keys=_DENSE_LEAD, mtp_head=True,
                derived_layer_keys=(_GLM_INDEXER,),
                cut_constraint=CutConstraint(
                    key_suffix="attention.indexer.types",
                    reason="a layer with a shared indexer (type 0) reuses the top-k token selection of "
                           "the previous full-indexer layer inside the same graph; a span starting at "
                           "it would have none (measured: llama.cpp aborts), so spans start only at "
                           "full-indexer layers")),
        ArchRow(name="qwen35", rope_neox=True, state_kind="hybrid", mtp_head=True,
                derived_layer_keys=(_RECURRENT_PATTERN,), mixed_span=_HYBRID_MIXED,
                pos_per_token=4),
        ArchRow(name="qwen35moe", rope_neox=True, state_kind="hybrid", mtp_head=True,
                derived_layer_keys=(_RECURRENT_PATTERN,), mixed_span=_HYBRID_MIXED,
                pos_per_token=4),
        ArchRow(
            name="deepseek4",
            capture_name="l_last",
            leading_count_keys=("hash_layer_count",),
            # the head reads the last layer's hyper-connection state l_last (captured like a
            # boundary) and is window-only: llama.cpp asserts a compress ratio of 0 for it
            mtp_head=True,
            mtp_input="residual",
            mtp_zero_keys=("attention.compress_ratios",),
            boundary_width=4,
            residual_input=True,
            state_kind="compressed",
            sidebands=(Sideband(name="token_ids", version=1, dtype="<i4", per_token=1,
                                reason="hash-routed MoE layers pick experts by token id",
                                when_key="hash_layer_count"),),
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


@dataclass(frozen=True)
class ModelCard:
    """A published model's configuration, for sizing and the simulator (no weights involved).

    Shapes follow the vendored llama.cpp loader of `arch` (tensor by tensor, see `swarm.sizing`).

    Attributes:
        name: the model's name.
        arch: GGUF architecture (a row of this table).
        n_layers, n_embd, n_head, head_dim, n_vocab: depth, hidden size, attention heads, head size,
            vocabulary.
        q_lora_rank, o_lora_rank, o_groups: low-rank query and grouped low-rank output projections.
        n_expert, n_expert_used, n_expert_shared, n_ff_exp: routed experts, experts per token,
            shared experts, expert hidden size.
        n_hash_layers: leading layers whose experts are picked by token id.
        hc_mult: hyper-connection streams of the residual (1 = a plain residual stream).
        compress_ratios: per layer KV compression (0: sliding window only; 4: compressed + indexer;
            128: heavily compressed).
        sliding_window: tokens of raw KV each layer keeps.
        indexer_n_head, indexer_head_dim: the sparse-attention indexer of ratio-4 layers.
        context_length: trained context.
        total_params, active_params: as published (checked against `swarm.sizing`).
        sources: where the figures come from.
    """

    name: str
    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    head_dim: int
    n_vocab: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_ff_exp: int
    n_hash_layers: int
    hc_mult: int
    compress_ratios: tuple[int, ...]
    sliding_window: int
    indexer_n_head: int
    indexer_head_dim: int
    context_length: int
    total_params: float
    active_params: float
    sources: tuple[str, ...]


DEEPSEEK_V4_FLASH = ModelCard(
    name="DeepSeek-V4-Flash",
    arch="deepseek4",
    n_layers=43,
    n_embd=4096,
    n_head=64,
    head_dim=512,
    n_vocab=129280,
    q_lora_rank=1024,
    o_lora_rank=1024,
    o_groups=8,
    n_expert=256,
    n_expert_used=6,
    n_expert_shared=1,
    n_ff_exp=2048,
    n_hash_layers=3,
    hc_mult=4,
    # layers 0-1: window only; then 4 and 128 alternate from layer 2 (config.json compress_ratios,
    # whose trailing entries belong to the MTP block)
    compress_ratios=(0, 0) + tuple(4 if i % 2 == 0 else 128 for i in range(41)),
    sliding_window=128,
    indexer_n_head=64,
    indexer_head_dim=128,
    context_length=1_048_576,
    total_params=284e9,
    active_params=13e9,
    sources=(
        "huggingface.co/deepseek-ai/DeepSeek-V4-Flash model card: 284B total, 13B activated, 1M context",
        "its config.json (hidden_size 4096, num_hidden_layers 43, num_attention_heads 64, head_dim 512, "
        "q_lora_rank 1024, o_lora_rank 1024, o_groups 8, n_routed_experts 256, num_experts_per_tok 6, "
        "n_shared_experts 1, moe_intermediate_size 2048, num_hash_layers 3, hc_mult 4, sliding_window "
        "128, index_n_heads 64, index_head_dim 128, vocab_size 129280), as reproduced by third-party "
        "config validators; NVIDIA NeMo AutoModel model-coverage page (43 layers, 256 routed + 1 "
        "shared expert, top-6, hc_mult 4)",
        "llama.cpp 0c1e57098 src/models/deepseek4.cpp load_arch_tensors (tensor shapes)",
    ),
)
