"""Print the paper sizing of a model card (default DeepSeek-V4-Flash) as markdown tables.

    .venv/bin/python scripts/size_model.py

Figures come from `swarm.sizing` over `swarm.arch.DEEPSEEK_V4_FLASH`; docs/deepseek-v4-flash.md
holds this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm import sizing  # noqa: E402
from swarm.arch import DEEPSEEK_V4_FLASH  # noqa: E402

GIB = 1 << 30
RTTS_MS = (1, 10, 25, 50, 100)
LINKS_MBIT = (100, 1000)


def main() -> int:
    card = DEEPSEEK_V4_FLASH
    total, active = sizing.total_params(card)
    print(f"parameters: {total / 1e9:.1f}B total, {active / 1e9:.2f}B active per token "
          f"(published: {card.total_params / 1e9:.0f}B / {card.active_params / 1e9:.0f}B)\n")
    print("| layers | compress ratio | params (B) | active (M) | Q4_K GiB | Q8_0 GiB | KV B/token (f16) |")
    print("|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[int]] = {}
    for il in range(card.n_layers):
        key = (card.compress_ratios[il], il < card.n_hash_layers)
        groups.setdefault(key, []).append(il)
    for (ratio, hashed), layers in sorted(groups.items(), key=lambda kv: kv[1][0]):
        il = layers[0]
        p = sizing.layer_params(card, il)
        if len(layers) <= 2:
            name = ", ".join(map(str, layers))
        else:
            name = f"{len(layers)} layers: {layers[0]}, {layers[1]}, ..., {layers[-1]}"
        params = (p.matrices + p.experts + p.vectors) / 1e9
        q4, q8 = (sizing.layer_weight_bytes(card, il, q) / GIB for q in ("Q4_K", "Q8_0"))
        tag = " (hash-routed)" if hashed else ""
        print(f"| {name}{tag} | {ratio} | {params:.3f} | {p.active / 1e6:.0f} | {q4:.3f} | {q8:.3f} "
              f"| {sizing.kv_bytes_per_token(card, il):g} |")
    kv = sum(sizing.kv_bytes_per_token(card, il) for il in range(card.n_layers))
    print(f"\nhead (last span): Q4_K {sizing.head_bytes(card, 'Q4_K') / GIB:.3f} GiB, "
          f"Q8_0 {sizing.head_bytes(card, 'Q8_0') / GIB:.3f} GiB; embedding (client) Q4_K "
          f"{sizing.embedding_bytes(card, 'Q4_K') / GIB:.3f} GiB")
    window_mib = sizing.kv_window_bytes(card) / 2**20
    print(f"KV per token, whole model: {kv:g} B (f16), plus a fixed {window_mib:.2f} MiB per sequence "
          f"for the {card.sliding_window}-token windows")
    print(f"bytes per token per hop: {sizing.hop_bytes_per_token(card)}\n")
    routes = {q: sizing.route_sizing(card, q, 24 * GIB) for q in ("Q4_K", "Q8_0")}
    for q, rs in routes.items():
        print(f"{q}: {rs.layers_per_peer} layers per 24 GiB peer, {rs.peers} peers per route")
    cols = [(q, link) for q in routes for link in LINKS_MBIT]
    print("\n| client-peer RTT | " + " | ".join(f"{q}, {link} Mbit/s (tok/s)" for q, link in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in RTTS_MS:
        speeds = [sizing.decode_tokens_per_s(card, q, routes[q].peers, r, link_mbit_s=link)
                  for q, link in cols]
        print(f"| {r} ms | " + " | ".join(f"{v:.2f}" for v in speeds) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
