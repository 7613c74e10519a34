"""Optimizer-state offload in the block search priced from what the update really reads, whatever
the step's dtypes and ties (passes/state_layout.py, passes/scale.py ``compose``, passes/offload.py
``offload_costs``). The step here keeps bfloat16 parameters, float32 master weights and momentum;
one variant returns its new parameters as bfloat16 (tied to its parameters), the other as
float32, which ties them to the master weights instead and leaves the parameters untied (graphc
warns): its state is still the master weights and momentum, its gradients still float32 sums, and
offloading them moves them all. An offload that would move no state is no layout at all."""

import dataclasses
import time
import warnings

import numpy as np
import pytest

import graphc
from graphc.api.parallel import Parallelized
from graphc.core.profiles import get_profile, host_tier
from graphc.core.pytree import static_argnames
from graphc.passes import scale
from graphc.passes.scale import Layout
from graphc.passes.search import step_batch
from graphc.passes.state_layout import StateLayout

A100 = get_profile("a100-sxm")
B, D_MODEL, LAYERS = 8, 16, 4


def _loss(params, x, y):
    h = x @ params["win"]
    for blk in params["blocks"]:
        h = h + np.tanh(h @ blk["w1"]) @ blk["w2"]
    return np.mean(((h @ params["wout"]).astype(np.float32)[:, 0] - y) ** 2)


def _step(new_dtype):
    def train_step(params, master, mom, x, y, lr=1e-2, b1=0.9):
        val, g = graphc.value_and_grad(_loss)(params, x, y)
        mom = graphc.tree_map(lambda m, g: b1 * m + g.astype(np.float32), mom, g)
        master = graphc.tree_map(lambda w, m: w - lr * m, master, mom)
        return graphc.tree_map(lambda w: w.astype(new_dtype), master), master, mom, val

    return train_step


def _args():
    rng = np.random.default_rng(0)
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    blocks = [dict(w1=w(D_MODEL, 2 * D_MODEL), w2=w(2 * D_MODEL, D_MODEL)) for _ in range(LAYERS)]
    master = {"win": w(D_MODEL, D_MODEL), "blocks": blocks, "wout": w(D_MODEL, 1)}
    params = graphc.tree_map(lambda a: a.astype(graphc.bfloat16), master)
    mom = graphc.tree_map(np.zeros_like, master)
    x = rng.standard_normal((B, D_MODEL)).astype(graphc.bfloat16)
    return (params, master, mom, x, w(B)), {}


def _model(new_dtype):
    args, kw = _args()
    step = Parallelized(_step(new_dtype), {"dp": 1}, static_argnames=static_argnames(kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float32 variant's untied parameters are warned about
        g = step.trace_optimized(*args, **kw)[1]
    return scale.layered_model(g, step_batch(g), A100)


@pytest.fixture(scope="module", params=[graphc.bfloat16, np.float32], ids=["tied", "untied"])
def solved(request):
    model = _model(request.param)
    figures = scale.cluster_figures(A100)
    segs = scale._solve_all(model, 1, B, A100, figures, time.perf_counter() + 120)
    assert not isinstance(segs, str), segs
    return model, segs, figures


def _byname(model, prefix):
    return sum(v.type.nbytes for v in model.graph.inputs if (v.name or "").startswith(prefix))


def test_offload_moves_the_state_the_update_reads_and_prices_its_gradients(solved):
    model, segs, figures = solved
    lo = Layout(1, 1, 1, B, 1, 0, "off")
    kept, why = scale.compose(model, segs, lo, A100, figures, None)
    assert why is None
    off, why = scale.compose(model, segs, dataclasses.replace(lo, offload="optimizer"), A100, figures, None)
    assert why is None and off.offload is not None
    # one device holds the whole step: the master weights and momentum are the state
    S = _byname(model, "master.") + _byname(model, "mom.")
    # the parameters the host copy holds: the layers' (bfloat16), and the ends' (tied or not: the
    # untied variant's are inputs it is warned about, held all the same)
    P = _byname(model, "params.blocks.") + sum(model.graph.inputs[k].type.nbytes for k in model.other_params)
    assert {model.graph.inputs[k].name for k in model.other_params} == {"params.win", "params.wout"}
    G = 2 * _byname(model, "params.")  # every bfloat16 gradient is only widened by the update: summed in float32
    assert S == 2 * G and off.offload.state_bytes == S
    assert max(kept.memory_bytes) - max(off.memory_bytes) == pytest.approx(S, abs=2)
    host = host_tier(A100)
    assert off.offload.host_update_s == pytest.approx((2 * S + 2 * P + G) / host.memory_bandwidth, rel=1e-12)
    assert off.offload.d2h_s == pytest.approx(host.link.latency_s + G / host.link.bandwidth, rel=1e-12)
    assert off.offload.h2d_s == pytest.approx(host.link.latency_s + P / host.link.bandwidth, rel=1e-12)
    assert off.predicted["step_s"] - off.predicted["update_s"] == pytest.approx(
        kept.predicted["step_s"] - kept.predicted["update_s"], rel=1e-12
    )  # the device's update is replaced by the host's; nothing else changes


def test_an_offload_that_moves_no_state_is_not_a_layout(solved):
    model, segs, figures = solved
    none = StateLayout.of([])
    bare = dataclasses.replace(segs, layer_state=none, other_state=none, end_states=None)
    lo = Layout(1, 1, 1, B, 1, 0, "off", "optimizer")
    plan, why = scale.compose(model, bare, lo, A100, figures, None)
    assert plan is None and "no optimizer state" in why
    kept, why = scale.compose(model, bare, dataclasses.replace(lo, offload="off"), A100, figures, None)
    assert why is None and kept.offload is None
