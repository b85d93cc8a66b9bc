"""Synthetic-GGUF factory: tiny, valid models of every architecture `swarm.arch` has a row for.

Each model has random float32 weights (deterministic seed per architecture), a few layers, small
hidden sizes and a 260-token byte-level SentencePiece vocabulary (`<unk>`, `<s>`, `</s>`, the space
`\u2581` and the 256 byte tokens `<0x00>`..`<0xFF>`), so llama.cpp tokenizes any text by byte fallback.

Tensor names, shapes and metadata keys follow the vendored llama.cpp's loaders
(llama-cpp-python 0.3.36, llama.cpp 0c1e57098: `src/models/<arch>.cpp` `load_arch_hparams` /
`load_arch_tensors`, key strings from `src/llama-arch.cpp`). Shapes below are written in ggml
order (`ne0` first, as in `create_tensor(..., {ne0, ne1, ne2})`); numpy arrays are the reverse.
Keys are written raw (`<arch>.<suffix>`) because the `gguf` package may lack constants for the
newest architectures.

What each model exercises at a cut:
- llama: a global `rope_freqs.weight` written between the blocks (every span needs it);
- qwen2: q/k/v biases; gemma3: sliding-window pattern derived from the index in the file;
- qwen3moe: experts in every layer; deepseek2: MLA (compressed KV, split wk_b/wv_b) with one
  leading dense layer then MoE layers with a shared expert; glm-dsa: the same plus the DSA
  indexer tensors and per-layer indexer types;
- qwen35 / qwen35moe: hybrid gated-delta-net (recurrent) + attention layers, the recurrent
  layers derived from `full_attention_interval` and the index in the file;
- deepseek4: hyper-connection residual (4 streams), compressed KV of ratios 0/4/128 with the
  indexer, two hash-routed first layers; its spans need the project's llama.cpp patch.

This module does not run llama.cpp; tests do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

N_LAYERS = 5
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16
N_FF = 128
N_CTX_TRAIN = 4096
N_EXPERT = 4
N_EXPERT_USED = 2
N_FF_EXP = 32

_BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
# "\u2581" is SentencePiece's space: one token per space instead of three byte tokens
TOKENS = ["<unk>", "<s>", "</s>", "\u2581", *_BYTE_TOKENS]
N_VOCAB = len(TOKENS)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class SyntheticSpec:
    """One architecture's synthetic model.

    Attributes:
        arch: GGUF `general.architecture`.
        n_layers: block count.
        metadata: `(key suffix after "<arch>.", value, GGUFValueType, array sub-type or None)`.
        globals_: non-block tensors `(name, ggml shape)` besides token_embd / output_norm / output.
        block: function layer index -> list of `(name after "blk.<i>.", ggml shape)`.
        seed: numpy seed for the weights.
    """

    arch: str
    n_layers: int
    metadata: tuple[tuple[str, object, GGUFValueType, GGUFValueType | None], ...]
    globals_: tuple[tuple[str, Shape], ...]
    block: Callable[[int], list[tuple[str, Shape]]]
    seed: int


def _u32(k: str, v: int):
    return (k, v, GGUFValueType.UINT32, None)


def _f32(k: str, v: float):
    return (k, v, GGUFValueType.FLOAT32, None)


def _common(n_layers: int, head_dim: int = HEAD_DIM, n_head_kv: int = N_HEAD_KV, n_rot: int | None = None):
    return (
        _u32("context_length", N_CTX_TRAIN), _u32("embedding_length", N_EMBD), _u32("block_count", n_layers),
        _u32("feed_forward_length", N_FF), _u32("attention.head_count", N_HEAD),
        _u32("attention.head_count_kv", n_head_kv), _f32("attention.layer_norm_rms_epsilon", 1e-6),
        _u32("attention.key_length", head_dim), _u32("attention.value_length", head_dim),
        _u32("rope.dimension_count", n_rot if n_rot is not None else head_dim),
        _f32("rope.freq_base", 10000.0),
    )


def _attn(q_out: int = N_HEAD * HEAD_DIM, kv_out: int = N_HEAD_KV * HEAD_DIM, bias: bool = False,
          qk_norm: bool = False) -> list[tuple[str, Shape]]:
    t = [("attn_norm.weight", (N_EMBD,)), ("attn_q.weight", (N_EMBD, q_out)),
         ("attn_k.weight", (N_EMBD, kv_out)), ("attn_v.weight", (N_EMBD, kv_out)),
         ("attn_output.weight", (N_HEAD * HEAD_DIM, N_EMBD))]
    if bias:
        t += [("attn_q.bias", (q_out,)), ("attn_k.bias", (kv_out,)), ("attn_v.bias", (kv_out,))]
    if qk_norm:
        t += [("attn_q_norm.weight", (HEAD_DIM,)), ("attn_k_norm.weight", (HEAD_DIM,))]
    return t


def _dense_ffn() -> list[tuple[str, Shape]]:
    return [("ffn_norm.weight", (N_EMBD,)), ("ffn_gate.weight", (N_EMBD, N_FF)),
            ("ffn_up.weight", (N_EMBD, N_FF)), ("ffn_down.weight", (N_FF, N_EMBD))]


def _moe_ffn(shared: bool, norm: bool = True) -> list[tuple[str, Shape]]:
    t = [("ffn_norm.weight", (N_EMBD,))] if norm else []
    t += [("ffn_gate_inp.weight", (N_EMBD, N_EXPERT)),
          ("ffn_gate_exps.weight", (N_EMBD, N_FF_EXP, N_EXPERT)),
          ("ffn_up_exps.weight", (N_EMBD, N_FF_EXP, N_EXPERT)),
          ("ffn_down_exps.weight", (N_FF_EXP, N_EMBD, N_EXPERT))]
    if shared:
        t += [("ffn_gate_shexp.weight", (N_EMBD, N_FF_EXP)), ("ffn_up_shexp.weight", (N_EMBD, N_FF_EXP)),
              ("ffn_down_shexp.weight", (N_FF_EXP, N_EMBD))]
    return t


def _llama() -> SyntheticSpec:
    # rope_freqs: llama.cpp's llama3-style per-dimension rope factors, one global tensor {n_rot/2}
    return SyntheticSpec("llama", N_LAYERS, _common(N_LAYERS), (("rope_freqs.weight", (HEAD_DIM // 2,)),),
                         lambda il: _attn() + _dense_ffn(), seed=1)


def _qwen2() -> SyntheticSpec:
    return SyntheticSpec("qwen2", N_LAYERS, _common(N_LAYERS), (), lambda il: _attn(bias=True) + _dense_ffn(),
                         seed=2)


def _gemma3() -> SyntheticSpec:
    # period 3 with 5 layers: sliding, sliding, global, sliding, sliding; a cut at 1 or 2 shifts it
    meta = (*_common(N_LAYERS), _u32("attention.sliding_window", 8),
            _u32("attention.sliding_window_pattern", 3), _f32("rope.freq_base_swa", 10000.0))

    def block(il: int):
        return (_attn(qk_norm=True) + [("post_attention_norm.weight", (N_EMBD,))] + _dense_ffn()
                + [("post_ffw_norm.weight", (N_EMBD,))])

    return SyntheticSpec("gemma3", N_LAYERS, meta, (), block, seed=3)


def _qwen3moe() -> SyntheticSpec:
    meta = (*_common(N_LAYERS), _u32("expert_count", N_EXPERT), _u32("expert_used_count", N_EXPERT_USED),
            _u32("expert_feed_forward_length", N_FF_EXP))
    return SyntheticSpec("qwen3moe", N_LAYERS, meta, (), lambda il: _attn(qk_norm=True) + _moe_ffn(False),
                         seed=4)


# MLA dims: q_lora 32, kv_lora 32, qk_nope 16 + qk_rope 8 per head, v 16 per head. As converted GGUFs
# store them: key_length = kv_lora + rope (the absorbed MQA head), value_length = kv_lora, one KV head.
_Q_LORA, _KV_LORA, _QK_NOPE, _QK_ROPE, _V_MLA = 32, 32, 16, 8, 16
_N_DENSE_LEAD = 1


def _mla_meta(arch_extra: tuple) -> tuple:
    return (
        *_common(N_LAYERS, head_dim=_KV_LORA + _QK_ROPE, n_head_kv=1, n_rot=_QK_ROPE),
        _u32("attention.value_length", _KV_LORA),  # overrides the common value_length (last wins)
        _u32("attention.q_lora_rank", _Q_LORA), _u32("attention.kv_lora_rank", _KV_LORA),
        _u32("attention.key_length_mla", _QK_NOPE + _QK_ROPE), _u32("attention.value_length_mla", _V_MLA),
        _u32("leading_dense_block_count", _N_DENSE_LEAD), _u32("expert_count", N_EXPERT),
        _u32("expert_used_count", N_EXPERT_USED), _u32("expert_feed_forward_length", N_FF_EXP),
        _u32("expert_shared_count", 1), _f32("expert_weights_scale", 1.5),
        ("expert_weights_norm", True, GGUFValueType.BOOL, None), _u32("expert_gating_func", 2),
        *arch_extra,
    )


def _mla_block(il: int, indexer: bool) -> list[tuple[str, Shape]]:
    t = [("attn_norm.weight", (N_EMBD,)), ("attn_q_a_norm.weight", (_Q_LORA,)),
         ("attn_kv_a_norm.weight", (_KV_LORA,)), ("attn_q_a.weight", (N_EMBD, _Q_LORA)),
         ("attn_q_b.weight", (_Q_LORA, N_HEAD * (_QK_NOPE + _QK_ROPE))),
         ("attn_kv_a_mqa.weight", (N_EMBD, _KV_LORA + _QK_ROPE)),
         ("attn_k_b.weight", (_QK_NOPE, _KV_LORA, N_HEAD)), ("attn_v_b.weight", (_KV_LORA, _V_MLA, N_HEAD)),
         ("attn_output.weight", (N_HEAD * _V_MLA, N_EMBD))]
    if indexer:
        t += [("indexer.k_norm.weight", (_IDX_HEAD,)), ("indexer.k_norm.bias", (_IDX_HEAD,)),
              ("indexer.proj.weight", (N_EMBD, _IDX_N_HEAD)), ("indexer.attn_k.weight", (N_EMBD, _IDX_HEAD)),
              ("indexer.attn_q_b.weight", (_Q_LORA, _IDX_N_HEAD * _IDX_HEAD))]
    if il < _N_DENSE_LEAD:
        return t + _dense_ffn()
    return t + _moe_ffn(True) + [("exp_probs_b.bias", (N_EXPERT,))]


def _deepseek2() -> SyntheticSpec:
    return SyntheticSpec("deepseek2", N_LAYERS, _mla_meta(()), (), lambda il: _mla_block(il, False), seed=5)


_IDX_N_HEAD, _IDX_HEAD, _IDX_TOP_K = 2, 64, 16  # key length: a multiple of 64 (Hadamard rotation)


def _glm_dsa() -> SyntheticSpec:
    # top_k 16 < the prompt length, so the DSA indexer really selects; per-layer indexer types
    # (full / shared) written explicitly as llama.cpp reads them (`attention.indexer.types`)
    extra = (_u32("attention.indexer.head_count", _IDX_N_HEAD),
             _u32("attention.indexer.key_length", _IDX_HEAD), _u32("attention.indexer.top_k", _IDX_TOP_K),
             ("attention.indexer.types", [1, 1, 0, 1, 0][:N_LAYERS], GGUFValueType.ARRAY,
              GGUFValueType.UINT32))
    return SyntheticSpec("glm-dsa", N_LAYERS, _mla_meta(extra), (), lambda il: _mla_block(il, True), seed=6)


# gated delta net dims: 2 key heads x 16, 4 value heads x 16, conv kernel 4
_SSM_K_HEADS, _SSM_V_HEADS, _SSM_HEAD, _SSM_CONV = 2, 4, 16, 4
_FULL_ATTN_INTERVAL = 2


# 6 layers: every span must hold both kinds (see swarm.arch MixedSpan), so 3 spans need >= 6
N_LAYERS_HYBRID = 6


def _qwen35_meta(moe: bool) -> tuple:
    meta = (*_common(N_LAYERS_HYBRID, n_rot=HEAD_DIM // 2), _u32("ssm.conv_kernel", _SSM_CONV),
            _u32("ssm.inner_size", _SSM_V_HEADS * _SSM_HEAD), _u32("ssm.state_size", _SSM_HEAD),
            _u32("ssm.time_step_rank", _SSM_V_HEADS), _u32("ssm.group_count", _SSM_K_HEADS),
            _u32("full_attention_interval", _FULL_ATTN_INTERVAL),
            ("rope.dimension_sections", [2, 2, 0, 0], GGUFValueType.ARRAY, GGUFValueType.INT32))
    if moe:
        meta += (_u32("expert_count", N_EXPERT), _u32("expert_used_count", N_EXPERT_USED),
                 _u32("expert_feed_forward_length", N_FF_EXP),
                 _u32("expert_shared_feed_forward_length", N_FF_EXP))
    return meta


def _qwen35_block(il: int, moe: bool) -> list[tuple[str, Shape]]:
    t = [("attn_norm.weight", (N_EMBD,)), ("post_attention_norm.weight", (N_EMBD,))]
    if (il + 1) % _FULL_ATTN_INTERVAL == 0:  # attention layer: q carries its gate (2x)
        t += [("attn_q.weight", (N_EMBD, 2 * N_HEAD * HEAD_DIM)),
              ("attn_k.weight", (N_EMBD, N_HEAD_KV * HEAD_DIM)),
              ("attn_v.weight", (N_EMBD, N_HEAD_KV * HEAD_DIM)),
              ("attn_output.weight", (N_HEAD * HEAD_DIM, N_EMBD)),
              ("attn_q_norm.weight", (HEAD_DIM,)), ("attn_k_norm.weight", (HEAD_DIM,))]
    else:
        key_dim, value_dim = _SSM_K_HEADS * _SSM_HEAD, _SSM_V_HEADS * _SSM_HEAD
        t += [("attn_qkv.weight", (N_EMBD, 2 * key_dim + value_dim)),
              ("attn_gate.weight", (N_EMBD, value_dim)),
              ("ssm_conv1d.weight", (_SSM_CONV, 2 * key_dim + value_dim)), ("ssm_dt.bias", (_SSM_V_HEADS,)),
              ("ssm_a", (_SSM_V_HEADS,)), ("ssm_beta.weight", (N_EMBD, _SSM_V_HEADS)),
              ("ssm_alpha.weight", (N_EMBD, _SSM_V_HEADS)), ("ssm_norm.weight", (_SSM_HEAD,)),
              ("ssm_out.weight", (value_dim, N_EMBD))]
    if not moe:
        return t + [(n, s) for n, s in _dense_ffn() if n != "ffn_norm.weight"]
    return t + _moe_ffn(True, norm=False) + [("ffn_gate_inp_shexp.weight", (N_EMBD,))]


def _qwen35() -> SyntheticSpec:
    return SyntheticSpec("qwen35", N_LAYERS_HYBRID, _qwen35_meta(False), (),
                         lambda il: _qwen35_block(il, False), seed=7)


def _qwen35moe() -> SyntheticSpec:
    return SyntheticSpec("qwen35moe", N_LAYERS_HYBRID, _qwen35_meta(True), (),
                         lambda il: _qwen35_block(il, True), seed=8)


def deepseek2_lite(n_layers: int = N_LAYERS) -> SyntheticSpec:
    """DeepSeek-V2-Lite's shape: no query compression (`attn_q` instead of `attn_q_a`/`attn_q_b`,
    no `q_lora_rank` key), which llama.cpp recognises only by a block count of 26 or 27."""
    base = _deepseek2()
    meta = tuple(m for m in base.metadata if m[0] != "attention.q_lora_rank")

    def block(il: int) -> list[tuple[str, Shape]]:
        out = [t for t in _mla_block(il, False) if not t[0].startswith(("attn_q_a", "attn_q_b"))]
        return [("attn_q.weight", (N_EMBD, N_HEAD * (_QK_NOPE + _QK_ROPE))), *out]

    return SyntheticSpec("deepseek2", n_layers, meta, (), block, seed=9)


def with_layers(spec: SyntheticSpec, n_layers: int, extra: tuple = (),
                drop: tuple[str, ...] = ()) -> SyntheticSpec:
    """`spec` with another block count, extra metadata entries (a later entry of a key wins) and
    the keys in `drop` left out (same shapes per layer)."""
    meta = tuple(m for m in spec.metadata if m[0] not in drop) + extra
    return SyntheticSpec(spec.arch, n_layers, meta, spec.globals_, spec.block, spec.seed)


def _weights(rng: np.random.Generator, name: str, shape: Shape, n_in: int) -> np.ndarray:
    np_shape = tuple(reversed(shape))
    if name.endswith("ffn_gate_tid2eid.weight"):
        # token id -> the experts it routes to: distinct ids per token
        rows = [rng.permutation(N_EXPERT)[:np_shape[1]] for _ in range(np_shape[0])]
        return np.stack(rows).astype(np.int32)
    if name.endswith("norm.weight") or name.endswith("_norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(np_shape)).astype(np.float32)
    if name == "rope_freqs.weight":
        # factors >= 1 (llama3 rope scaling stretches low frequencies): not all ones, so a span
        # that ran without it would differ
        return (1.0 + rng.random(np_shape) * 3.0).astype(np.float32)
    if name.endswith("ssm_a"):
        return (-np.exp(0.5 * rng.standard_normal(np_shape))).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(np_shape)).astype(np.float32)
    # 1/sqrt(fan-in) keeps activations O(1) through the blocks, so logits are not all ties
    return (rng.standard_normal(np_shape) / np.sqrt(max(n_in, 1))).astype(np.float32)


def write_synthetic(arch: str, dest: Path, spec: SyntheticSpec | None = None) -> Path:
    """Write the synthetic GGUF of `arch` to `dest` (deterministic: same bytes every call).

    Args:
        arch: a key of `SPECS`.
        dest: output path.
        spec: a variant to write instead of `SPECS[arch]()` (its `n_layers` sets the block count).
    Returns:
        dest.
    Raises:
        KeyError: no synthetic spec for `arch`.
    """
    spec = spec or SPECS[arch]()
    rng = np.random.default_rng(spec.seed)
    w = GGUFWriter(dest, spec.arch)
    w.add_string("general.name", f"synthetic-{spec.arch}")
    # a later entry for the same key wins (the MLA rows override value_length); first position kept
    meta: dict[str, tuple[object, GGUFValueType, GGUFValueType | None]] = {}
    for suffix, value, vtype, sub in spec.metadata:
        meta[suffix] = (value, vtype, sub)
    meta["block_count"] = (spec.n_layers, GGUFValueType.UINT32, None)
    for suffix, (value, vtype, sub) in meta.items():
        w.add_key_value(f"{spec.arch}.{suffix}", value, vtype, sub_type=sub)
    w.add_uint32(f"{spec.arch}.vocab_size", N_VOCAB)
    _add_tokenizer(w)
    tensors: list[tuple[str, Shape]] = [("token_embd.weight", (N_EMBD, N_VOCAB))]
    half = spec.n_layers // 2
    for il in range(spec.n_layers):
        if il == half:
            tensors += list(spec.globals_)  # globals between blocks: the file order a fetch must handle
        tensors += [(f"blk.{il}.{n}", s) for n, s in spec.block(il)]
    tensors += [("output_norm.weight", (N_EMBD,)), ("output.weight", (N_EMBD, N_VOCAB))]
    for name, shape in tensors:
        w.add_tensor(name, _weights(rng, name, shape, shape[0] if len(shape) > 1 else 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def _add_tokenizer(w: GGUFWriter) -> None:
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", TOKENS)
    w.add_array("tokenizer.ggml.scores", [0.0] * N_VOCAB)
    w.add_array("tokenizer.ggml.token_type", [2, 3, 3, 1] + [6] * 256)  # unknown, control x2, normal, byte
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)


# DeepSeek-V4 (llama.cpp src/models/deepseek4.cpp): hyper-connection residual of 4 streams, MQA
# head of 64 with 16 rotary dims, grouped low-rank output, per-layer KV compression (0: window only,
# 4: compressed + indexer, 128: heavily compressed), the first two layers route experts by token id
# (so a cut at 1 leaves a span that starts with a hash-routed layer)
_DS4_HEAD, _DS4_ROT, _DS4_Q_LORA, _DS4_O_GROUPS, _DS4_O_LORA, _DS4_HC = 64, 16, 32, 2, 16, 4
_DS4_RATIOS = (0, 4, 128, 4)
_DS4_IDX_HEADS, _DS4_IDX_DIM = 2, 64
_DS4_HASH = 2


def _deepseek4() -> SyntheticSpec:
    n = len(_DS4_RATIOS)
    meta = (
        _u32("context_length", N_CTX_TRAIN), _u32("embedding_length", N_EMBD), _u32("block_count", n),
        _u32("feed_forward_length", N_FF), _u32("attention.head_count", 2),
        _u32("attention.head_count_kv", 1),
        _f32("attention.layer_norm_rms_epsilon", 1e-6), _u32("attention.key_length", _DS4_HEAD),
        _u32("attention.value_length", _DS4_HEAD), _u32("rope.dimension_count", _DS4_ROT),
        _f32("rope.freq_base", 10000.0), _u32("attention.q_lora_rank", _DS4_Q_LORA),
        _u32("attention.sliding_window", 8), _u32("expert_count", N_EXPERT),
        _u32("expert_used_count", N_EXPERT_USED), _u32("expert_feed_forward_length", N_FF_EXP),
        _u32("expert_shared_count", 1), _f32("expert_weights_scale", 1.5),
        ("expert_weights_norm", True, GGUFValueType.BOOL, None), _u32("expert_gating_func", 4),
        _f32("swiglu_clamp_exp", 10.0), _u32("attention.indexer.head_count", _DS4_IDX_HEADS),
        _u32("attention.indexer.key_length", _DS4_IDX_DIM), _u32("attention.indexer.top_k", 4),
        _u32("attention.output_group_count", _DS4_O_GROUPS), _u32("attention.output_lora_rank", _DS4_O_LORA),
        _f32("attention.compress_rope_freq_base", 160000.0), _u32("hyper_connection.count", _DS4_HC),
        _u32("hyper_connection.sinkhorn_iterations", 20), _f32("hyper_connection.epsilon", 1e-6),
        _u32("hash_layer_count", _DS4_HASH),
        ("attention.compress_ratios", list(_DS4_RATIOS), GGUFValueType.ARRAY, GGUFValueType.UINT32),
    )
    hc_dim, hc_mix = _DS4_HC * N_EMBD, (2 + _DS4_HC) * _DS4_HC
    globals_ = (("output_hc_fn.weight", (hc_dim, _DS4_HC)), ("output_hc_base.weight", (_DS4_HC,)),
                ("output_hc_scale.weight", (1,)))

    def block(il: int) -> list[tuple[str, Shape]]:
        t = [("attn_norm.weight", (N_EMBD,)), ("attn_sinks.weight", (2,)),
             ("attn_q_a.weight", (N_EMBD, _DS4_Q_LORA)), ("attn_q_a_norm.weight", (_DS4_Q_LORA,)),
             ("attn_q_b.weight", (_DS4_Q_LORA, 2 * _DS4_HEAD)), ("attn_kv.weight", (N_EMBD, _DS4_HEAD)),
             ("attn_kv_a_norm.weight", (_DS4_HEAD,)),
             ("attn_output_a.weight", (2 * _DS4_HEAD // _DS4_O_GROUPS, _DS4_O_LORA * _DS4_O_GROUPS)),
             ("attn_output_b.weight", (_DS4_O_GROUPS * _DS4_O_LORA, N_EMBD))]
        for kind in ("attn", "ffn"):
            t += [(f"hc_{kind}_fn.weight", (hc_dim, hc_mix)), (f"hc_{kind}_base.weight", (hc_mix,)),
                  (f"hc_{kind}_scale.weight", (3,))]
        ratio = _DS4_RATIOS[il]
        if ratio:
            coff = 2 if ratio == 4 else 1
            t += [("attn_compressor_kv.weight", (N_EMBD, coff * _DS4_HEAD)),
                  ("attn_compressor_gate.weight", (N_EMBD, coff * _DS4_HEAD)),
                  ("attn_compressor_ape.weight", (coff * _DS4_HEAD, ratio)),
                  ("attn_compressor_norm.weight", (_DS4_HEAD,))]
        if ratio == 4:
            t += [("indexer.proj.weight", (N_EMBD, _DS4_IDX_HEADS)),
                  ("indexer.attn_q_b.weight", (_DS4_Q_LORA, _DS4_IDX_HEADS * _DS4_IDX_DIM)),
                  ("indexer_compressor_kv.weight", (N_EMBD, 2 * _DS4_IDX_DIM)),
                  ("indexer_compressor_gate.weight", (N_EMBD, 2 * _DS4_IDX_DIM)),
                  ("indexer_compressor_ape.weight", (2 * _DS4_IDX_DIM, ratio)),
                  ("indexer_compressor_norm.weight", (_DS4_IDX_DIM,))]
        if il < _DS4_HASH:
            t += [("ffn_gate_tid2eid.weight", (N_EXPERT_USED, N_VOCAB))]
        else:
            t += [("exp_probs_b.bias", (N_EXPERT,))]
        return t + _moe_ffn(True)

    return SyntheticSpec("deepseek4", n, meta, globals_, block, seed=10)


def deepseek4_mtp() -> SyntheticSpec:
    """`_deepseek4` with one multi-token-prediction block, as llama.cpp stores it: block 4, after the
    four trunk layers, counted in `block_count` (5) and named by `nextn_predict_layers` (1). The
    block is a window-only (ratio 0), score-routed layer plus `nextn.eh_proj` [2 n_embd -> n_embd]
    and the `nextn.enorm` / `nextn.hnorm` norms; it has no `nextn.embed_tokens` or shared head, so
    llama.cpp's MTP graph (deepseek4.cpp `graph_mtp`) reads `token_embd`, `output_norm` and
    `output` of the model."""
    base = _deepseek4()
    n_trunk = base.n_layers
    meta = tuple(m for m in base.metadata if m[0] != "attention.compress_ratios") + (
        ("attention.compress_ratios", [*_DS4_RATIOS, 0], GGUFValueType.ARRAY, GGUFValueType.UINT32),
        _u32("nextn_predict_layers", 1),
    )

    def block(il: int) -> list[tuple[str, Shape]]:
        if il < n_trunk:
            return base.block(il)
        trunk_like = [t for t in base.block(0) if t[0] != "ffn_gate_tid2eid.weight"]
        return trunk_like + [("exp_probs_b.bias", (N_EXPERT,)),
                             ("nextn.eh_proj.weight", (2 * N_EMBD, N_EMBD)),
                             ("nextn.enorm.weight", (N_EMBD,)), ("nextn.hnorm.weight", (N_EMBD,))]

    return SyntheticSpec("deepseek4", n_trunk + 1, meta, base.globals_, block, seed=11)


_NEXTN_CORE = (("nextn.eh_proj.weight", (2 * N_EMBD, N_EMBD)), ("nextn.enorm.weight", (N_EMBD,)),
               ("nextn.hnorm.weight", (N_EMBD,)))
_NEXTN_OPTIONAL = {"shared_head_norm": ("nextn.shared_head_norm.weight", (N_EMBD,)),
                   "shared_head_head": ("nextn.shared_head_head.weight", (N_EMBD, N_VOCAB)),
                   "embed_tokens": ("nextn.embed_tokens.weight", (N_EMBD, N_VOCAB))}


def with_mtp(arch: str, like: int, optional: tuple[str, ...] = ()) -> SyntheticSpec:
    """`SPECS[arch]` with one multi-token-prediction block appended, as llama.cpp stores it: block
    n_layers, counted in `block_count` and named by `nextn_predict_layers` (1). The block holds the
    tensors of trunk block `like` (the kind llama.cpp's loader builds an MTP block as: a full-attention
    block for qwen35 / qwen35moe, a MoE block for deepseek2 / glm-dsa) plus `nextn.eh_proj` and the
    `nextn.enorm` / `nextn.hnorm` norms, and the `optional` nextn tensors named (keys of
    `_NEXTN_OPTIONAL`): without them llama.cpp's MTP graph reads the model's `token_embd`,
    `output_norm` and `output`."""
    base = SPECS[arch]()
    n_trunk = base.n_layers
    extra = [_NEXTN_OPTIONAL[k] for k in optional]
    meta = base.metadata + (_u32("nextn_predict_layers", 1),)

    def block(il: int) -> list[tuple[str, Shape]]:
        return base.block(il) if il < n_trunk else [*base.block(like), *_NEXTN_CORE, *extra]

    return SyntheticSpec(arch, n_trunk + 1, meta, base.globals_, block, seed=base.seed + 100)


MTP_SPECS: dict[str, Callable[[], SyntheticSpec]] = {
    "deepseek4": lambda: deepseek4_mtp(),
    "deepseek2": lambda: with_mtp("deepseek2", like=_N_DENSE_LEAD),
    "glm-dsa": lambda: with_mtp("glm-dsa", like=_N_DENSE_LEAD,
                                optional=("embed_tokens", "shared_head_head", "shared_head_norm")),
    "qwen35": lambda: with_mtp("qwen35", like=_FULL_ATTN_INTERVAL - 1, optional=("shared_head_norm",)),
    "qwen35moe": lambda: with_mtp("qwen35moe", like=_FULL_ATTN_INTERVAL - 1),
}
"""Every architecture whose MTP head is served (`ArchRow.mtp_head`), with a synthetic MTP model."""


SPECS: dict[str, Callable[[], SyntheticSpec]] = {
    "llama": _llama, "qwen2": _qwen2, "gemma3": _gemma3, "qwen3moe": _qwen3moe, "deepseek2": _deepseek2,
    "glm-dsa": _glm_dsa, "qwen35": _qwen35, "qwen35moe": _qwen35moe, "deepseek4": _deepseek4,
}


def write_split(src: Path, dest_dir: Path, n_shards: int) -> list[Path]:
    """Split a GGUF into `n_shards` shards as the `gguf` package's writer does (llama.cpp's `split.*`
    keys, all metadata in the first shard, names `<stem>-0000i-of-0000n.gguf`).

    Args:
        src: a whole GGUF.
        dest_dir: where the shards go (created).
        n_shards: 2 or more, at most the tensor count.
    Returns:
        the shards' paths, first to last.
    """
    reader = GGUFReader(src, "r")
    per_shard = -(-len(reader.tensors) // n_shards)
    dest_dir.mkdir(parents=True, exist_ok=True)
    arch = reader.fields["general.architecture"].contents()
    w = GGUFWriter(dest_dir / src.name, arch, split_max_tensors=per_shard)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [dest_dir / f"{src.stem}-{i + 1:05d}-of-{n_shards:05d}.gguf" for i in range(n_shards)]
