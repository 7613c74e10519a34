"""The float32 main gradients and master copies of low-precision parameters
(passes/mixed_precision.py), against Megatron-LM's count of bytes a parameter and by hand."""

import pytest

from graphc.api.parallel import Parallelized
from graphc.core.profiles import cluster_figures, get_profile
from graphc.core.pytree import static_argnames
from graphc.models import gpt3
from graphc.passes import scale
from graphc.passes.mixed_precision import gather_bytes, main_copies, update_bytes
from graphc.passes.state_layout import ParamLayout, StateLayout

SIZES = {"w": 2, "g": 4}  # a bfloat16 weight, a float32 norm scale


def _w(elements=1000, read=1, grad=1):
    # bfloat16, Adam's float32 moments (8 bytes an element)
    return ParamLayout("w", 2 * elements, 2 * elements, 8 * elements, read, grad, 0.0)


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_bf16_parameters_hold_megatrons_6_plus_12_over_d_bytes_with_the_distributed_optimizer(d):
    # docs/user-guide/features/dist_optimizer.md (Megatron-LM): bf16 parameters, fp32 gradients,
    # 18 bytes a parameter; 6 + 12/d with the distributed optimizer (ZeRO 1 over d)
    layout = main_copies(StateLayout.of([_w()]), SIZES, 2, 4)
    assert layout.held(d, 1, False) == pytest.approx(1000 * (6 + 12 / d), rel=1e-12)
    assert layout.held(d, 0, False) == pytest.approx(1000 * 18, rel=1e-12)


def test_the_copies_follow_the_parameters_layout_on_tp_and_leave_float32_parameters_alone():
    norm = ParamLayout("g", 400, 400, 800, 1, 1, 0.0)
    layout = main_copies(StateLayout.of([_w(read=1, grad=2), norm]), SIZES, 2, 4)
    # the weight read whole, its gradient split over tp=2 (and the update there): the main
    # gradient 4 bytes an element over 2, the master with the moments over 2
    assert layout.param_bytes == 2000 + 400
    assert layout.grad_bytes == pytest.approx(4000 / 2 + 400, rel=1e-12)
    assert layout.state_bytes == pytest.approx((8000 + 4000) / 2 + 800, rel=1e-12)
    # the all-gather after a ZeRO update moves the parameters in their own dtype, as updated
    assert gather_bytes(layout) == pytest.approx(2000 / 2 + 400, rel=1e-12)
    # the update: per element updated 4 x 4 - 2 x 2 bytes more; the main gradient zeroed (4)
    assert update_bytes(StateLayout.of([_w(read=1, grad=2), norm]), SIZES, 2, 4) == (500 * 12, 500 * 4)
    assert main_copies(StateLayout.of([norm]), SIZES, 4, 4) == StateLayout.of([norm])
    assert main_copies(StateLayout.of([_w()]), SIZES, 2, 0) == StateLayout.of([_w()])  # the step as written


def test_a_layout_read_from_no_plan_widens_by_the_parameters_itemsize():
    even = StateLayout.even(2000.0, 8000.0, 1)
    wide = main_copies(even, {}, 2, 4)
    assert (wide.param_bytes, wide.grad_bytes, wide.state_bytes) == (2000.0, 4000.0, 12000.0)
    assert update_bytes(even, {}, 2, 4) == (1000 * 12, 1000 * 4)
    assert main_copies(even, {}, 4, 4) == even and update_bytes(even, {}, 4, 4) == (0.0, 0.0)


def test_gpu_presets_keep_float32_main_copies_and_this_machine_does_not():
    assert cluster_figures(get_profile("a100-sxm")).main_bytes == 4
    assert cluster_figures(get_profile("h100-sxm")).main_bytes == 4
    assert cluster_figures(get_profile("cpu-here")).main_bytes == 0


def test_a_zero1_step_reduces_float32_gradients_and_gathers_bf16_parameters_beside_the_compute():
    """The composed step of a bf16 layer of 1e8 elements a layer (2 layers a stage, dp=4): the
    reduce-scatter of float32 gradients beside the last backward, the all-gather of the bf16
    parameters beside the first forward, what neither hides exposed."""
    a100 = get_profile("a100-sxm")
    args, kw = gpt3.example_train_specs(n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=32)
    pf = Parallelized(gpt3.train_step, {"dp": 1}, static_argnames=static_argnames(kw))
    model = scale.layered_model(pf.trace_optimized(*args, **kw)[1], 32, a100)
    name = "params.blocks.0.qkv.w"
    assert model.itemsizes[name] == 2 and model.tied_ends == {"params.wte"}  # the embedding and the logits
    n, m = 10**8, 10**7
    layer = StateLayout.of([ParamLayout(name, 2 * n, 2 * n, 8 * n, 1, 1, 0.0)])
    other = StateLayout.of([ParamLayout("params.wte", 2 * m, 2 * m, 8 * m, 1, 1, 0.0)])
    f, b = 2.5e-3, 5e-3  # one layer's forward and backward a micro-batch
    blk = scale.SegmentCost(f, b, 100, 10, 0.0, None, {}, {})
    zero = scale.SegmentCost(0.0, 0.0, 0, 0, 0.0, None)
    segs = scale._Segments(zero, blk, zero, layer_state=layer, other_state=other)
    lo = scale.Layout(pp=2, dp=4, tp=1, micro_batch=1, microbatches=8, zero=1, recompute="off")
    plan, why = scale.compose(model, segs, lo, a100, cluster_figures(a100), None)
    assert why is None and plan.stage_layers == (2, 2)
    link = a100.link_for("dp")

    def half_ring(nbytes):  # a reduce-scatter or an all-gather over 4: half a ring all-reduce
        return 3 / 4 * nbytes / link.bandwidth + 3 * link.latency_s

    reduce_s = half_ring(2 * 4 * n + 4 * m)  # two layers' float32 gradients, and the embedding's
    gather_s = half_ring(2 * 2 * n + 2 * m)  # two layers' bf16 parameters, and the embedding
    # the tied embedding's float32 gradient summed between the first and the last stage
    pp = a100.link_for("pp")
    tied_s = 4 * m / pp.bandwidth + 2 * pp.latency_s  # a ring all-reduce over 2: 2 (2 - 1) / 2 = 1
    expected = max(0.0, reduce_s - 2 * b) + max(0.0, gather_s - 2 * f) + tied_s
    assert reduce_s > 2 * b and gather_s > 2 * f  # neither hides whole
    assert plan.predicted["dp_s"] == pytest.approx(expected, rel=1e-12)
    # memory: 2 layers of 2 + 4 + 12 / 4 bytes an element (Megatron's 6 + 12/d), the embedding too
    assert plan.memory_bytes[1] == pytest.approx((2 * n + m) * (6 + 12 / 4) + 2 * 100, rel=1e-9)
    one, _ = scale.compose(model, segs, scale.Layout(1, 4, 1, 1, 8, 1, "off"), a100, cluster_figures(a100), None)
    # one stage of 4 layers: nothing to sum between stages
    flat = max(0.0, half_ring(4 * 4 * n + 4 * m) - 4 * b) + max(0.0, half_ring(4 * 2 * n + 2 * m) - 4 * f)
    assert one.predicted["dp_s"] == pytest.approx(flat, rel=1e-12)
