"""Named swarm scenarios: a model, a mix of volunteers, how they come and go, and the client load.

Timeline of every scenario, in virtual seconds: `n_peers` join over `grow_s` (Poisson times) into
an empty swarm; nothing happens for `settle_s` (the last joiners finish loading); then for
`churn_s`, the measured window, peers leave and join at the churn rate while clients generate
(arrivals stop `tail_s` before the end, so that generations end inside the window).

The two illustrative models have the depth of DeepSeek-V4-Flash (43 layers) and of a 70B-class
dense model (80 layers); their byte sizes are illustrative, since memory is drawn in layers' worth.
`MODEL_DSV4_FLASH` has DeepSeek-V4-Flash's real sizes at Q4_K (from `swarm.sizing` over the
published configuration in `swarm.arch.DEEPSEEK_V4_FLASH`), served by 12-24 GiB volunteers.

This module does not: run anything (`sim.runner` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.clients import Load
from sim.world import Membership, ModelShape, PeerMix
from swarm import sizing
from swarm.arch import DEEPSEEK_V4_FLASH, ModelCard

GIB = 1 << 30

MODEL_43 = ModelShape("43 layers (DeepSeek-V4-Flash depth)", 43, 3 * GIB, GIB, 8 * 1024)
MODEL_80 = ModelShape("80 layers", 80, GIB, GIB, 4 * 1024)


@dataclass(frozen=True)
class Scenario:
    """One simulation run.

    Attributes:
        name: label.
        model: the served model.
        mix: how volunteers differ.
        members: size, churn, placement rule, announce and rebalance timing.
        load: the clients.
        grow_s, settle_s, churn_s, tail_s: the timeline (see the module docstring), seconds.
        seed: seeds the run's one random source.
    """

    name: str
    model: ModelShape
    mix: PeerMix
    members: Membership
    load: Load = Load()
    grow_s: float = 300.0
    settle_s: float = 60.0
    churn_s: float = 600.0
    tail_s: float = 30.0
    seed: int = 0


def card_shape(card: ModelCard, quant: str) -> ModelShape:
    """A card's real sizes: mean weight bytes and mean KV bytes per token over its layers."""
    n = card.n_layers
    layer_bytes = sum(sizing.layer_weight_bytes(card, il, quant) for il in range(n)) // n
    kv = round(sum(sizing.kv_bytes_per_token(card, il) for il in range(n)) / n)
    return ModelShape(f"{card.name} {quant}", n, layer_bytes, sizing.head_bytes(card, quant), kv)


def memory_mix(model: ModelShape, low_bytes: int, high_bytes: int) -> PeerMix:
    """Volunteers with `low_bytes`..`high_bytes` of memory (log-uniform), in layers' worth."""
    kv_tokens = PeerMix(memory_layers=(1.0, 1.0)).kv_tokens
    per_layer = model.layer_bytes + kv_tokens * model.kv_bytes_per_layer_token
    return PeerMix(memory_layers=((low_bytes - model.head_bytes) / per_layer,
                                  (high_bytes - model.head_bytes) / per_layer))


MODEL_DSV4_FLASH = card_shape(DEEPSEEK_V4_FLASH, "Q4_K")
DSV4_FLASH_MIX = memory_mix(MODEL_DSV4_FLASH, 12 * GIB, 24 * GIB)

MODELS: dict[str, tuple[ModelShape, PeerMix]] = {
    "deepseek-v4-flash": (MODEL_DSV4_FLASH, DSV4_FLASH_MIX),
}
"""Models with real sizes, by name (`scripts/bench_sim.py --model`)."""


def default_mix(model: ModelShape) -> PeerMix:
    """Memories from two layers' worth to the whole model (+10%); the other `PeerMix` defaults."""
    return PeerMix(memory_layers=(2.0, 1.1 * model.n_layers))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # The acceptance runs: 10,000 peers, 10% churn per minute for 10 virtual minutes.
        Scenario("swarm43_10k", MODEL_43, default_mix(MODEL_43), Membership(n_peers=10_000), seed=43),
        Scenario("swarm80_10k", MODEL_80, default_mix(MODEL_80), Membership(n_peers=10_000), seed=80),
        # A quick look at the same dynamics (seconds of wall time).
        Scenario(
            "swarm43_300",
            MODEL_43,
            default_mix(MODEL_43),
            Membership(n_peers=300, rebalance_period_s=120.0),
            load=Load(generations_per_s=1.0, sites=16),
            grow_s=120.0,
            churn_s=300.0,
            seed=1,
        ),
        # DeepSeek-V4-Flash at Q4_K (3.4 GiB a layer) on 12-24 GiB volunteers: 3-7 layers each.
        Scenario(
            "dsv4flash_300",
            MODEL_DSV4_FLASH,
            DSV4_FLASH_MIX,
            Membership(n_peers=300, rebalance_period_s=120.0),
            load=Load(generations_per_s=1.0, sites=16),
            grow_s=120.0,
            churn_s=300.0,
            seed=4,
        ),
    )
}
