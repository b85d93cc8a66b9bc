"""Paper sizing of a model from its published configuration: weights per layer, KV per token, bytes
per hop, how many peers a route needs and the decode speed a route can reach.

Parameter counts follow the vendored llama.cpp loader of the card's architecture tensor by tensor
(today: `deepseek4`, `src/models/deepseek4.cpp` of llama.cpp 0c1e57098). Quantized sizes use
GGUF's block formats: Q4_K 4.5 bits per weight (144 bytes per 256), Q8_0 8.5 bits (34 bytes per 32);
vectors (norms, biases, mixing weights) stay float32 as llama.cpp's quantizer leaves them.

This module is arithmetic only: no I/O, no llama.cpp. The simulator builds its model shape from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.arch import ModelCard, arch_row

BITS_PER_WEIGHT = {"Q4_K": 4.5, "Q8_0": 8.5, "F16": 16.0}
KV_BYTES_PER_VALUE = 2
"""llama.cpp's default KV cache type is f16."""
GIB = 1 << 30


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one block, split by how they are stored and used.

    Attributes:
        matrices: quantizable 2-D/3-D weights, routed experts excluded.
        experts: routed expert weights (all experts).
        vectors: 1-D tensors (norms, biases, mixing bases), kept float32.
        active: matrices + vectors + the experts one token uses.
    """

    matrices: int
    experts: int
    vectors: int
    active: int


def layer_params(card: ModelCard, il: int) -> LayerParams:
    """Parameters of block `il` (0-based), from llama.cpp's deepseek4 tensor shapes.

    Raises:
        ValueError: `il` outside the model, or a compression ratio llama.cpp does not know.
    """
    if not 0 <= il < card.n_layers:
        raise ValueError(f"layer {il} outside the model's {card.n_layers} layers")
    e, hd, q, hc_dim = card.n_embd, card.head_dim, card.q_lora_rank, card.hc_mult * card.n_embd
    hc_mix = (2 + card.hc_mult) * card.hc_mult
    mats = (e * q + q * card.n_head * hd + e * hd  # wq_a, wq_b, wkv
            + (card.n_head * hd // card.o_groups) * card.o_lora_rank * card.o_groups  # wo_a
            + card.o_groups * card.o_lora_rank * e  # wo_b
            + 2 * hc_dim * hc_mix  # hc_attn_fn, hc_ffn_fn
            + e * card.n_expert  # ffn_gate_inp
            + 3 * e * card.n_ff_exp * card.n_expert_shared)  # shared expert
    vecs = 2 * e + card.n_head + q + hd + 2 * (hc_mix + 3)  # norms, sinks, hc bases and scales
    ratio = card.compress_ratios[il]
    if ratio not in (0, 4, 128):
        raise ValueError(f"compression ratio {ratio} of layer {il}: llama.cpp knows 0, 4 and 128")
    if ratio:
        coff = 2 if ratio == 4 else 1
        mats += 2 * e * coff * hd + coff * hd * ratio  # compressor wkv, wgate, ape
        vecs += hd
    if ratio == 4:
        ih, idim = card.indexer_n_head, card.indexer_head_dim
        mats += e * ih + q * ih * idim + 2 * e * 2 * idim + 2 * idim * 4  # indexer proj, q_b, compressor
        vecs += idim
    if il < card.n_hash_layers:
        mats += card.n_expert_used * card.n_vocab  # ffn_gate_tid2eid (token id -> experts)
    else:
        vecs += card.n_expert  # exp_probs_b
    per_expert = 3 * e * card.n_ff_exp
    return LayerParams(matrices=mats, experts=per_expert * card.n_expert, vectors=vecs,
                       active=mats + vecs + per_expert * card.n_expert_used)


def layer_weight_bytes(card: ModelCard, il: int, quant: str) -> int:
    """Bytes of block `il` in a GGUF quantized as `quant` (a key of BITS_PER_WEIGHT)."""
    p = layer_params(card, il)
    return int((p.matrices + p.experts) * BITS_PER_WEIGHT[quant] / 8) + 4 * p.vectors


def head_bytes(card: ModelCard, quant: str) -> int:
    """Output norm + head (+ hyper-connection head) on the last span."""
    head = int(card.n_embd * card.n_vocab * BITS_PER_WEIGHT[quant] / 8)
    hc_head = card.n_embd * card.hc_mult * card.hc_mult + card.hc_mult + 1  # hc_head_fn, base, scale
    return head + 4 * (card.n_embd + hc_head)


def embedding_bytes(card: ModelCard, quant: str) -> int:
    """token_embd (the client's, not a peer's)."""
    return int(card.n_embd * card.n_vocab * BITS_PER_WEIGHT[quant] / 8)


def total_params(card: ModelCard) -> tuple[int, int]:
    """(total, active per token) parameters, embeddings and head included."""
    layers = [layer_params(card, il) for il in range(card.n_layers)]
    head = 2 * card.n_embd * card.n_vocab
    return (sum(p.matrices + p.experts + p.vectors for p in layers) + head,
            sum(p.active for p in layers) + card.n_embd * card.n_vocab)


def kv_bytes_per_token(card: ModelCard, il: int) -> float:
    """KV cache bytes one more token adds to block `il` (f16), beyond the fixed sliding window.

    A ratio-r layer keeps one compressed `head_dim` entry per r tokens, a ratio-4 layer also one
    indexer key of `indexer_head_dim` per 4 tokens; a ratio-0 layer only the window (fixed).
    """
    r = card.compress_ratios[il]
    if r == 0:
        return 0.0
    per_entry = card.head_dim + (card.indexer_head_dim if r == 4 else 0)
    return per_entry * KV_BYTES_PER_VALUE / r


def kv_window_bytes(card: ModelCard) -> int:
    """Fixed KV bytes per sequence for the sliding window, all layers (f16)."""
    return card.n_layers * card.sliding_window * card.head_dim * KV_BYTES_PER_VALUE


def hop_bytes_per_token(card: ModelCard) -> int:
    """Bytes one token moves across a hop: the residual stream (f32, the row's boundary width
    times n_embd) plus each sideband of the architecture's row."""
    row = arch_row(card.arch)
    sidebands = sum(sb.per_token * _itemsize(sb.dtype) for sb in row.sidebands)
    return row.boundary_bytes_per_token(card.n_embd) + sidebands


def _itemsize(dtype: str) -> int:
    return int(dtype[-1])


@dataclass(frozen=True)
class RouteSizing:
    """How a route of equal peers covers the model.

    Attributes:
        layers_per_peer: whole layers one peer holds (weights + KV for `kv_tokens` + reserve).
        peers: peers on one route (the last also holds the head).
    """

    layers_per_peer: int
    peers: int


def route_sizing(card: ModelCard, quant: str, peer_bytes: int, *, kv_tokens: int = 32_768,
                 reserve_bytes: int = 2 * GIB) -> RouteSizing:
    """Peers of `peer_bytes` memory each a route needs, filling each with whole layers.

    Args:
        peer_bytes: memory of each peer (e.g. 24 GiB).
        kv_tokens: KV cache tokens each peer reserves for its sessions.
        reserve_bytes: compute buffers and runtime, not for weights or KV.
    Raises:
        ValueError: not even one layer fits a peer.
    """
    per_layer = [layer_weight_bytes(card, il, quant) + kv_tokens * kv_bytes_per_token(card, il)
                 + card.sliding_window * card.head_dim * KV_BYTES_PER_VALUE for il in range(card.n_layers)]
    budget = peer_bytes - reserve_bytes
    peers, used, most = 1, 0.0, 0
    n_here = 0
    for b in per_layer:
        if b > budget:
            raise ValueError(f"one layer ({b / GIB:.1f} GiB) does not fit {budget / GIB:.1f} GiB")
        if used + b > budget:
            peers, used, n_here = peers + 1, 0.0, 0
        used += b
        n_here += 1
        most = max(most, n_here)
    if used + head_bytes(card, quant) > budget:
        peers += 1  # the head alone on one more peer's span end (rare)
    return RouteSizing(layers_per_peer=most, peers=peers)


def decode_tokens_per_s(card: ModelCard, quant: str, peers: int, rtt_ms: float, *,
                        mem_bandwidth_gb_s: float = 900.0, link_mbit_s: float = 100.0) -> float:
    """Decode speed of one sequence on a route of `peers` hops, the client relaying every hop.

    Per token: every hop costs one client-peer round trip plus sending the hop's bytes both ways
    over the link; every layer reads its active weights once (memory-bandwidth bound, batch 1).

    Args:
        rtt_ms: round trip between the client and each peer.
        mem_bandwidth_gb_s: each peer's memory bandwidth (an RTX 3090/4090-class card: ~900-1000).
        link_mbit_s: each link's bandwidth.
    Returns:
        tokens per second.
    """
    bits = BITS_PER_WEIGHT[quant]
    active_bytes = sum(layer_params(card, il).active for il in range(card.n_layers)) * bits / 8
    active_bytes += card.n_embd * card.n_vocab * bits / 8  # the head
    compute_s = active_bytes / (mem_bandwidth_gb_s * 1e9)
    transfer_s = 2 * hop_bytes_per_token(card) * 8 / (link_mbit_s * 1e6)
    return 1.0 / (compute_s + peers * (rtt_ms / 1000.0 + transfer_s))
