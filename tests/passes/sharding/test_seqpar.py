"""Sequence parallelism (Megatron-SP) on the tp axis, chosen by the solver to fit a memory limit.

A one-block GPT train step with a long sequence (``T = 512``, ``d = 512``, batch 1, so the tp
axis cannot split the batch), priced with the ``h100-sxm`` profile (fixed: the plans do not
depend on this machine's calibration), on ``tp=2``:

- No limit: Megatron tensor parallelism. The layer norms and residual adds run replicated on tp,
  and each row-parallel matmul's partial sum is all-reduced (``P -> R``). Sequence parallelism
  would replace each all-reduce of B bytes by a reduce-scatter into the sequence-split layer
  norm and an all-gather before the next column-parallel matmul: the same bytes on the link
  (``2 (n-1)/n B``), but two calls' latency and overhead instead of one, which on this
  profile costs more than the halved layer-norm work saves.
- A limit below that plan's peak: the layer-norm regions are split on the sequence dim
  (``S(1)`` of ``[1, T, d]``) and the all-reduces become reduce-scatter + all-gather pairs.
  Every activation the forward pass saves for the backward pass in those regions is held
  half per device: the peak drops by the bytes those saved values shrink by.

These plans are made with ``recompute="off"``. With activation recomputation allowed (the
default under a limit, passes/recompute/choices.py) the solver fits the same limit more cheaply by
recomputing layer-norm and softmax values before the backward pass, and keeps Megatron TP
(``test_recomputation_fits_the_limit_more_cheaply``).
"""

import math
from collections import Counter

import numpy as np
import pytest

import graphc
from graphc.core.spec import P, R, S, local_shape
from graphc.core.traits import Constant
from graphc.models import gpt
from graphc.passes.sharding.redistribute import redistribution_time
from tests.helpers import assert_adam_step_close

T, D = 512, 512
# bytes per device: below the Megatron plan's peak (54.1 MB), above the SP plan's (50.0 MB; 51.1 MB
# held with its redistribution buffers). Both were 2.1 MB less before the memory model held the
# constants (the causal mask, the backward's) all run, as the executor does.
LIMIT = 51_500_000
LN_LINES = ("gpt.py:30", "gpt.py:31")
# the tests read the optimum's choices: a solve stopped by the default 60 s of wall time (two test
# workers and other jobs on two cores) could return another plan, so the limit is far out of reach
TIME_LIMIT = 900.0  # layer_norm's body in models/gpt.py


def _args():
    return gpt.example_train_args(batch=1, seq=T, d=D, n_layer=1, n_head=4)


def _plan(memory_limit, recompute="off"):
    args, kw = _args()
    pf = graphc.parallelize(
        gpt.train_step,
        mesh={"tp": 2},
        memory_limit=memory_limit,
        static_argnames=("n_head", "lr"),
        cache=False,
        profile="h100-sxm",
        recompute=recompute,
        time_limit=TIME_LIMIT,
    )
    return pf.plan_and_graph(*args, **kw)


@pytest.fixture(scope="module")
def megatron():
    return _plan(None)


@pytest.fixture(scope="module")
def seqpar():
    return _plan(LIMIT)


def _ln_specs(plan) -> Counter:
    """Out specs of the forward layer norms' ``[1, T, d]`` values before the bias: ``x - mean``,
    its square, the normalized ``x`` times the gain (the all-gather may come before or after the
    bias add: either is sequence parallel)."""
    return Counter(
        n.out_specs[0]
        for n in plan.nodes
        if n.part == "forward"
        and n.op in ("sub", "mul", "div")
        and str(n.loc).endswith(LN_LINES)
        and n.types[0] == f"f32[1,{T},{D}]"
    )


def _forward_collectives(plan) -> Counter:
    """(kind, axis) of the forward pass's collectives on activations (not the scalar loss; not
    the local steps, slices and zeroing, which move nothing)."""
    return Counter(
        (c.kind, c.axes)
        for c in plan.collectives
        if c.part == "forward" and c.bytes >= T * D * 4 and c.kind not in ("slice", "zero")
    )


def test_without_a_limit_megatron_all_reduces(megatron):
    plan, _graph = megatron
    assert set(_ln_specs(plan)) == {(R,)}
    fwd = _forward_collectives(plan)
    assert fwd == Counter({("all_reduce", ("tp",)): 2}), fwd  # after attention's and the MLP's c_proj


def test_under_a_limit_the_layer_norms_are_split_on_the_sequence(megatron, seqpar):
    plan, _graph = seqpar
    assert plan.memory.peak_bytes[0] <= LIMIT < megatron[0].memory.peak_bytes[0]
    specs = _ln_specs(plan)
    assert set(specs) == {(S(1),)}, specs
    fwd = _forward_collectives(plan)
    assert fwd == Counter({("reduce_scatter", ("tp",)): 2, ("all_gather", ("tp",)): 2}), fwd
    assert not [c for c in plan.collectives if c.part == "forward" and c.kind == "all_reduce" and c.bytes > 4]


def test_the_unlimited_choice_is_the_cheaper_one(megatron, seqpar):
    """Per row-parallel matmul, SP trades one all-reduce of the [1, T, d] activation for a
    reduce-scatter and an all-gather of it (forward; the backward mirrors them): more link time
    on this profile, less layer-norm compute; without a limit the cheaper total wins."""
    mp, sp = megatron[0], seqpar[0]
    mesh, shape = mp.mesh, (1, T, D)
    all_reduce = redistribution_time(shape, 4, (P,), (R,), mesh)
    scatter_gather = redistribution_time(shape, 4, (P,), (S(1),), mesh) + redistribution_time(
        shape, 4, (S(1),), (R,), mesh
    )
    assert scatter_gather > all_reduce

    def fwd_time(plan):
        return sum(c.time_s for c in plan.collectives if c.part == "forward" and c.bytes >= T * D * 4)

    assert fwd_time(mp) == pytest.approx(2 * all_reduce)
    assert fwd_time(sp) == pytest.approx(2 * scatter_gather)
    assert sp.cost.compute_s < mp.cost.compute_s  # the layer norms' work is halved
    assert mp.cost.total_s < sp.cost.total_s
    assert mp.solver.status == sp.solver.status == "optimal"


def test_the_peak_drops_by_the_saved_activations_it_splits(megatron, seqpar):
    """Memory model: at the peak (the forward pass done, the backward pass starting) every value
    the forward pass made and the backward pass reads is live. SP holds the ones of the
    layer-norm regions (x - mean, 1/sqrt(var), the residual sums; and the LM head's; the
    normalized x is recomputed in the backward from the first two, passes/recompute/cheap.py) split on
    the sequence: each shrinks by half, and so do the constants it splits (held all run). The peak drops by that sum, less the values the device
    program's fusion keeps out of memory (sharding/fusion.py)."""
    (mp, graph), (sp, _g) = megatron, seqpar
    later = {v for node in graph.nodes if node.part != "forward" for v in node.inputs}
    shrunk = 0
    for a, b in zip(mp.nodes, sp.nodes):
        node = graph.nodes[a.index]
        for o, before, after in zip(node.outputs, a.out_specs, b.out_specs):
            if (node.part == "forward" and o in later) or node.op.has(Constant):  # constants: held all run
                shrunk += o.type.dtype.itemsize * (
                    math.prod(local_shape(o.type.shape, before, (2,)))
                    - math.prod(local_shape(o.type.shape, after, (2,)))
                )
    drop = mp.memory.peak_bytes[0] - sp.memory.peak_bytes[0]
    assert shrunk > 6 * T * D * 4 // 2  # at least six [1, T, d] values halved (seven measured)
    assert 0.75 * shrunk <= drop <= shrunk, (drop, shrunk)


@pytest.mark.slow
def test_recomputation_fits_the_limit_more_cheaply(megatron, seqpar):
    """With recomputation allowed the solver has more ways to fit the limit, so it fits it for
    no more than SP costs. (The model with recomputation choices also counts the backward values
    fused kernels keep out of memory, passes/sharding/memory.py ``fused_inside``, and finds a
    plan under LIMIT that needs no recomputation: docs/remat.md.)"""
    plan, _graph = _plan(LIMIT, recompute="auto")
    assert plan.memory.peak_bytes[0] <= LIMIT
    assert megatron[0].cost.total_s <= plan.cost.total_s <= seqpar[0].cost.total_s


def test_the_sequence_parallel_plan_runs_equal_to_one_device(seqpar):
    plan, _graph = seqpar
    args, kw = _args()
    want = gpt.train_step(*args, **kw)
    pf = graphc.parallelize(gpt.train_step, plan=plan, static_argnames=("n_head", "lr"), cache=False)
    got = pf(*args, **kw)
    assert_adam_step_close(got, want, lr=kw["lr"], terms=4 * D)  # the longest sum: the MLP's 4d products
    program = pf.compile(*args, **kw).program
    kinds = Counter(n.op.name for n in program.devices[0].graph.nodes)
    assert kinds["reduce_scatter"] >= 4 and kinds["all_gather"] >= 4, kinds


def _gather_step(w, x):
    def loss(w, x):
        h = graphc.shard(np.tanh(x), "S(0)")  # a forward value split on rows: [64, 256]
        return np.sum(np.tanh(h @ w))  # w split by columns: h is all-gathered for the matmul

    value, grad = graphc.value_and_grad(loss)(w, x)
    return w - 0.1 * grad, value


@pytest.mark.parametrize("limit", [None, "1GB"])
def test_under_a_limit_the_backward_pass_gathers_again(limit):
    """The weight gradient reads h whole again. Without a limit the forward pass's gathered copy
    is kept for it (one all-gather); under a limit, which bounds the values' liveness and would
    not see a copy held across the passes, the backward pass gathers again (redistribute.
    read_phase), priced by the plan and made by the lowering."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 8192)) * 0.05).astype(np.float32)  # gathering w would cost more
    x = rng.standard_normal((64, 256)).astype(np.float32)
    pf = graphc.parallelize(
        _gather_step, mesh={"tp": 2}, in_specs=("S(1)", None), memory_limit=limit, cache=False, profile="h100-sxm"
    )
    compiled = pf.compile(w, x)
    gathers = [c for c in compiled.plan.collectives if c.kind == "all_gather"]
    assert [(c.part, c.bytes) for c in gathers] == [("forward", 64 * 256 * 4)] + (
        [("backward", 64 * 256 * 4)] if limit else []
    )
    program = compiled.program.devices[0].graph
    assert sum(n.op.name == "all_gather" for n in program.nodes) == len(gathers)
    for got, want in zip(pf(w, x), _gather_step(w, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("limit", [None, "1GB"])
def test_a_recomputed_reader_gathers_again_under_a_limit(limit):
    """Recomputed (``recompute="on"``), the matmul ``h @ w`` runs again before the backward
    pass. Without a limit its copy reads the forward pass's gathered ``h``; under a limit the
    copy, a later part's reader, gathers ``h`` again (``read_phase``: part "recompute"), so no
    gathered copy is held across the passes."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 8192)) * 0.05).astype(np.float32)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    pf = graphc.parallelize(
        _gather_step,
        mesh={"tp": 2},
        in_specs=("S(1)", None),
        memory_limit=limit,
        recompute="on",
        cache=False,
        profile="h100-sxm",
    )
    compiled = pf.compile(w, x)
    assert any(n.recompute and n.op == "matmul" for n in compiled.plan.nodes)
    program = compiled.program.devices[0].graph
    gathers = Counter(n.part for n in program.nodes if n.op.name == "all_gather")
    # under a limit h is gathered again after the forward pass (by the copy, or by the backward
    # reader before it, whose gathered copy the copy then reads)
    assert (gathers["forward"], gathers["recompute"] + gathers["backward"]) == (1, 1 if limit else 0), gathers
    for got, want in zip(pf(w, x), _gather_step(w, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
