"""sim/ with DeepSeek-V4-Flash's real sizes (Q4_K, `swarm.sizing` over the published configuration):
volunteers of 12-24 GiB hold 3 to 6 of its 3.45 GiB layers. Joining one by one they form complete
chains; joining together (Poisson, stale views) they need rebalancing to get there, and every
generation that completes is exact."""

import asyncio

from sim import vloop
from sim.clients import Load
from sim.metrics import judge
from sim.runner import SwarmSim, run
from sim.scenarios import DSV4_FLASH_MIX, MODEL_DSV4_FLASH, Scenario
from sim.world import Membership
from swarm.arch import DEEPSEEK_V4_FLASH
from swarm.sizing import layer_weight_bytes

GIB = 1 << 30


def dsv4_scenario(n_peers: int, seed: int, rebalance_period_s: float | None = None) -> Scenario:
    return Scenario("dsv4-test", MODEL_DSV4_FLASH, DSV4_FLASH_MIX,
                    Membership(n_peers=n_peers, churn_per_min=0.0, rebalance_period_s=rebalance_period_s),
                    load=Load(sites=4), grow_s=120.0, churn_s=240.0, seed=seed)


def test_dsv4_flash_shape_is_the_real_model_at_q4():
    assert MODEL_DSV4_FLASH.n_layers == 43
    assert MODEL_DSV4_FLASH.layer_bytes == sum(
        layer_weight_bytes(DEEPSEEK_V4_FLASH, il, "Q4_K") for il in range(43)) // 43
    assert 3.4 * GIB < MODEL_DSV4_FLASH.layer_bytes < 3.5 * GIB
    assert MODEL_DSV4_FLASH.kv_bytes_per_layer_token == 160  # 6,880 B per token over 43 layers
    lo, hi = DSV4_FLASH_MIX.memory_layers
    assert 3.3 < lo < 3.5 and 6.8 < hi < 7.0  # 12 and 24 GiB in layers' worth


def test_dsv4_flash_swarm_forms_complete_chains_of_small_spans():
    """60 volunteers join; every span is at most 6 layers (24 GiB), yet chains join layer 0 to 43
    and every generation completes exactly."""

    async def grow():
        sim = SwarmSim(dsv4_scenario(60, seed=3))
        for _ in range(60):
            sim.world.join()
            await asyncio.sleep(70.0)
        layout = dict(sim.world.layout)
        sim.finish()
        return layout

    layout = vloop.run(grow())
    assert max(e - s for s, e in layout) <= 6
    figures = judge(layout, 43)
    assert figures.complete and figures.serving == 60


def test_dsv4_flash_run_with_rebalancing_yields_complete_chains_and_exact_generations():
    """150 volunteers join within 2 minutes (each placed on a view that misses the latest joiners):
    without rebalancing no chain completes (measured: 0.0 of the time at 80-300 peers); rebalancing
    every 2 minutes moves peers onto complete chains and generations run on them, exactly."""
    still = run(dsv4_scenario(150, seed=5)).summary()
    assert still["complete_chain_time"] == 0.0 and still["completed"] == 0
    s = run(dsv4_scenario(150, seed=5, rebalance_period_s=120.0)).summary()
    assert s["n_layers"] == 43 and s["moves"] > 0
    assert s["complete_chain_time"] > 0.0
    assert s["completed"] > 0 and s["exact"] == s["completed"]
