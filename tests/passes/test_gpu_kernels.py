"""GEMM wave quantization on GPU profiles (graphc/core/profiles.py ``wave_efficiency``,
``gemm_tiles``; passes/gpu_kernels.py ``GemmWaves``): the formula on hand-worked examples, and the
rows and columns a matmul's tiles are counted over; kernel launches, and compute slowed beside a
collective it hides (``hidden_collective_s``)."""

import dataclasses
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest

import graphc
from graphc.api.parallel import Parallelized
from graphc.core.mesh import Mesh
from graphc.core.profiles import (
    GEMM_WAVES,
    LAUNCH_S,
    OVERLAP_SLOWDOWN,
    cluster_figures,
    gemm_tiles,
    get_profile,
    hidden_collective_s,
    launch_gap,
    wave_efficiency,
)
from graphc.core.pytree import static_argnames
from graphc.core.spec import R, S
from graphc.models import gpt3
from graphc.passes import scale
from graphc.passes.gpu_kernels import GemmWaves, gemm_absorbed, kernel_launches
from graphc.passes.partition import plan_sharding

A100 = cluster_figures(get_profile("a100-sxm"))
TILE = (256, 128)


def test_a100_qkv_gemm_of_gpt3_175b_at_tp8_runs_three_waves_of_which_the_last_two_thirds_full():
    # one micro-batch of 2,048 tokens times the QKV weight's 3 x 12,288 / 8 = 4,608 columns on one
    # device: 8 x 36 = 288 tiles of 256 x 128, waves of 108 (one tile a SM): 3 waves, the last
    # 72 tiles; it runs at 288 / 324 = 8/9 of the whole-wave rate
    tiles = gemm_tiles(2048, 3 * 12288 // 8, TILE)
    assert tiles == 288
    assert A100.gemm_wave == GEMM_WAVES["a100-sxm"] == 108
    assert wave_efficiency(tiles, A100.gemm_wave) == pytest.approx(8 / 9, rel=1e-12)


def test_wave_efficiency_whole_waves_one_tile_over_and_no_wave_size():
    assert wave_efficiency(108, 108) == 1.0
    assert wave_efficiency(216, 108) == 1.0
    assert wave_efficiency(109, 108) == pytest.approx(109 / 216, rel=1e-12)  # a second wave of one tile
    assert wave_efficiency(1, 132) == pytest.approx(1 / 132, rel=1e-12)
    assert wave_efficiency(288, None) == 1.0
    assert wave_efficiency(0, 108) == 1.0  # an empty product: nothing to stretch


def test_partial_tiles_count_whole_and_matrices_multiply():
    assert gemm_tiles(256, 128, TILE) == 1
    assert gemm_tiles(257, 129, TILE) == 4
    assert gemm_tiles(1, 1, TILE, matrices=3) == 3


def _node(g, name):
    return next(k for k, n in enumerate(g.nodes) if n.op.name == name)


def test_a_shared_weight_makes_one_gemm_over_every_row_and_the_spec_divides_them():
    x, w = np.ones((3, 200, 64), np.float32), np.ones((64, 300), np.float32)
    g = graphc.trace(lambda x, w: x @ w, x, w)
    k = _node(g, "matmul")
    whole = GemmWaves(g, set(), (), A100)
    assert whole.tiles(k, ()) == math.ceil(600 / 256) * math.ceil(300 / 128)  # 3 x 3: rows of all 3 batches
    split = GemmWaves(g, set(), (3,), A100)
    assert split.tiles(k, (S(0),)) == 1 * 3  # 200 rows on each of 3 devices
    assert split.tiles(k, (S(2),)) == 3 * 1  # 100 columns each


def test_batched_products_are_a_batch_of_matrices_and_a_summed_weight_gradient_is_one():
    a, b = np.ones((4, 300, 64), np.float32), np.ones((4, 64, 200), np.float32)
    g = graphc.trace(lambda a, b: a @ b, a, b)
    assert GemmWaves(g, set(), (), A100).tiles(_node(g, "matmul"), ()) == 4 * 2 * 2
    x, dy = np.ones((4, 300, 64), np.float32), np.ones((4, 300, 200), np.float32)
    h = graphc.trace(lambda x, dy: np.sum(x.swapaxes(-1, -2) @ dy, axis=0), x, dy)
    absorbed = gemm_absorbed(h)
    assert {h.nodes[k].op.name for k in absorbed} == {"transpose", "reduce_sum"}
    # the weight gradient over 4 sequences is one 64 x 200 GEMM with 4 x 300 inner terms
    assert GemmWaves(h, absorbed, (), A100).tiles(_node(h, "matmul"), ()) == 1 * 2
    assert GemmWaves(h, set(), (), A100).tiles(_node(h, "matmul"), ()) == 4 * 1 * 2  # unless not absorbed


def test_seconds_are_the_per_op_time_over_the_wave_efficiency():
    x, w = np.ones((3, 200, 64), np.float32), np.ones((64, 300), np.float32)
    g = graphc.trace(lambda x, w: x @ w, x, w)
    k = _node(g, "matmul")
    nc = SimpleNamespace(index=k, out_specs=((),), compute_s=1e-3)
    # 9 tiles in one wave of 108: the wave takes as long as a full one, 12x the work's share
    assert GemmWaves(g, set(), (), A100).seconds(nc) == pytest.approx(1e-3 * 108 / 9, rel=1e-12)
    no_waves = cluster_figures(get_profile("cpu-here"))
    assert GemmWaves(g, set(), (), no_waves).seconds(nc) == 1e-3  # no wave size: the per-op time
    nc_r = SimpleNamespace(index=k, out_specs=((R,),), compute_s=2e-3)
    assert GemmWaves(g, set(), (3,), A100).seconds(nc_r) == pytest.approx(2e-3 * 108 / 9, rel=1e-12)


# --- kernel launches (graphc/core/profiles.py ``launch_gap``, passes/gpu_kernels.py ``kernel_launches``)


def test_launch_gap_is_the_launches_excess_over_the_gpus_work():
    assert launch_gap(1e-4, 10, 5e-6) == 0.0  # 10 launches of 5 us hide behind 100 us of kernels
    assert launch_gap(1e-5, 10, 5e-6) == pytest.approx(4e-5, rel=1e-12)  # 50 us of launches, 10 us of work
    assert launch_gap(0.0, 0, 5e-6) == 0.0
    assert A100.launch_s == LAUNCH_S == 5e-6  # Holistic Trace Analysis: 5-20 us, the lower end


def test_a_fused_elementwise_chain_is_one_kernel_after_its_matmul():
    x, w = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    g = graphc.trace(lambda x, w: np.tanh(x @ w) * 2.0 + 1.0, x, w)
    plan = plan_sharding(g, Mesh({"dp": 1}, profile=get_profile("a100-sxm")), ties=[])
    assert [n.op.name for n in g.nodes if n.op.name != "constant"] == ["matmul", "tanh", "mul", "add"]
    assert kernel_launches(g, plan, set(), set(), "dp") == {"forward": 2, "backward": 0}  # matmul; tanh-mul-add
    unfused = plan_sharding(
        g, Mesh({"dp": 1}, profile=dataclasses.replace(get_profile("a100-sxm"), fuses_elementwise=False)), ties=[]
    )
    assert kernel_launches(g, unfused, set(), set(), "dp") == {"forward": 4, "backward": 0}
    assert kernel_launches(g, plan, {0}, set(), "dp") == {"forward": 1, "backward": 0}  # skipped: no kernel


def test_a_small_block_on_a_gpu_waits_for_its_launches():
    # a d=64 block's kernels run for nanoseconds: each micro-batch's forward and backward take
    # their kernels' launches, 5 us each
    args, kw = gpt3.example_train_specs(n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=8)
    pf = Parallelized(gpt3.train_step, {"dp": 1}, static_argnames=static_argnames(kw))
    model = scale.layered_model(pf.trace_optimized(*args, **kw)[1], 8, get_profile("a100-sxm"))
    seg = scale.solve_segment(model.graphs["block"], 2, 1, 8, get_profile("a100-sxm"), A100, time.perf_counter() + 60)
    kernels = kernel_launches(model.graphs["block"], seg.plan, set(), set(), "dp")
    assert kernels["forward"] > 10 and kernels["backward"] > kernels["forward"]
    assert seg.forward_terms["launch"] > 0 and seg.backward_terms["launch"] > 0
    # the launches bound each side: the side's time is its kernels' launches (those the fused
    # attention kernel and the GEMM take in count less than every kernel of the plan)
    for part, terms, total in (
        ("forward", seg.forward_terms, seg.forward_s),
        ("backward", seg.backward_terms, seg.backward_s),
    ):
        assert total == pytest.approx(sum(terms.values()), rel=1e-12)
        assert total <= kernels[part] * LAUNCH_S * (1 + 1e-12)
        assert total >= 0.5 * kernels[part] * LAUNCH_S


# --- compute beside a collective (graphc/core/profiles.py ``hidden_collective_s``)


def _timeline_extra(comm_s: float, window_s: float, slowdown: float) -> float:
    """The same by the timeline: the compute does 1 / (1 + slowdown) of its work a second while
    the collective runs (from 0 to comm_s), then all of it; the step goes on when both are done."""
    if window_s <= comm_s / (1 + slowdown):  # the compute is done while the collective still runs
        done = window_s * (1 + slowdown)
    else:
        done = comm_s + (window_s - comm_s / (1 + slowdown))
    return max(done, comm_s) - window_s


@pytest.mark.parametrize(
    "comm_s, window_s",
    [(0.1, 1.0), (0.5, 1.0), (1.0, 1.0), (1.2, 1.0), (2.0, 1.0), (1.0, 0.0), (0.0, 1.0), (1e-6, 1e-3)],
)
@pytest.mark.parametrize("slowdown", [0.0, OVERLAP_SLOWDOWN, 0.4])
def test_a_hidden_collective_adds_its_excess_or_the_slowed_compute(comm_s, window_s, slowdown):
    assert hidden_collective_s(comm_s, window_s, slowdown) == pytest.approx(
        _timeline_extra(comm_s, window_s, slowdown), rel=1e-12, abs=1e-15
    )


def test_a_collective_shorter_than_its_window_slows_the_compute_by_the_published_share():
    # 0.1 s of reduction beside 1 s of backward: the backward runs 18.9% slower for 0.1 s, so it
    # does 0.1 / 1.189 s of its work then and ends 0.1 x 0.189 / 1.189 s late (Lee et al. 2025)
    assert A100.overlap_slowdown == OVERLAP_SLOWDOWN == 0.189
    assert hidden_collective_s(0.1, 1.0, 0.189) == pytest.approx(0.1 * 0.189 / 1.189, rel=1e-12)
    assert hidden_collective_s(0.1, 1.0, 0.0) == 0.0  # no slowdown: hidden whole
    assert hidden_collective_s(3.0, 1.0, 0.189) == pytest.approx(2.0, rel=1e-12)  # longer: its excess
    assert cluster_figures(get_profile("cpu-here")).overlap_slowdown == 0.0  # nothing overlaps on threads
