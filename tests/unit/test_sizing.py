"""swarm.sizing over DeepSeek-V4-Flash's published configuration: the tensor-by-tensor count lands
on the published totals, and the derived figures follow from it."""

import pytest

from swarm import sizing
from swarm.arch import DEEPSEEK_V4_FLASH as CARD
from swarm.arch import arch_row

GIB = 1 << 30


def test_parameter_count_matches_the_published_totals():
    total, active = sizing.total_params(CARD)
    assert abs(total - 284e9) / 284e9 < 0.005  # 284.3B
    assert abs(active - 13e9) / 13e9 < 0.03  # 13.27B
    assert len(CARD.compress_ratios) == CARD.n_layers == 43
    assert CARD.compress_ratios.count(4) == 21 and CARD.compress_ratios.count(128) == 20


def test_layer_bytes_at_q4_and_q8():
    p = sizing.layer_params(CARD, 10)
    assert p.experts == 3 * 4096 * 2048 * 256
    q4 = sizing.layer_weight_bytes(CARD, 10, "Q4_K")
    q8 = sizing.layer_weight_bytes(CARD, 10, "Q8_0")
    assert q4 == int((p.matrices + p.experts) * 4.5 / 8) + 4 * p.vectors
    assert 3.44 * GIB < q4 < 3.47 * GIB and 6.5 * GIB < q8 < 6.53 * GIB
    # a hash-routed layer carries its token-id -> experts table instead of the routing bias
    assert sizing.layer_params(CARD, 2).matrices - sizing.layer_params(CARD, 4).matrices == 6 * 129280
    assert sizing.layer_params(CARD, 4).vectors - sizing.layer_params(CARD, 2).vectors == 256
    with pytest.raises(ValueError, match="outside"):
        sizing.layer_params(CARD, 43)


def test_kv_and_hop_bytes():
    assert sizing.kv_bytes_per_token(CARD, 0) == 0.0
    assert sizing.kv_bytes_per_token(CARD, 2) == (512 + 128) * 2 / 4
    assert sizing.kv_bytes_per_token(CARD, 3) == 512 * 2 / 128
    assert sum(sizing.kv_bytes_per_token(CARD, il) for il in range(43)) == 6880
    # 4 hyper-connection streams of 4096 float32 + one int32 token id
    assert sizing.hop_bytes_per_token(CARD) == 4 * 4096 * 4 + 4
    assert arch_row(CARD.arch).boundary_width == CARD.hc_mult


def test_route_sizing_and_speed():
    q4 = sizing.route_sizing(CARD, "Q4_K", 24 * GIB)
    q8 = sizing.route_sizing(CARD, "Q8_0", 24 * GIB)
    assert (q4.layers_per_peer, q4.peers) == (6, 8)
    assert (q8.layers_per_peer, q8.peers) == (3, 15)
    with pytest.raises(ValueError, match="does not fit"):
        sizing.route_sizing(CARD, "Q8_0", 8 * GIB)
    fast = sizing.decode_tokens_per_s(CARD, "Q4_K", 8, 1.0, link_mbit_s=1000)
    slow = sizing.decode_tokens_per_s(CARD, "Q4_K", 8, 100.0, link_mbit_s=1000)
    assert slow < fast
    # at 100 ms the 8 round trips dominate: just under 1 / 0.8 s
    assert 1.15 < slow < 1.25
