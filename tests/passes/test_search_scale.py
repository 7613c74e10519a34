"""The block search (passes/blocks.py, passes/scale.py): the repeated layers found and cut, the
block stamped over them equal to the whole step's work, the stage DP against brute force, a
search on a small layered step, the time limit, and (slow) GPT-3 175B on 1,024 A100s against
Megatron-LM's own layout."""

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import graphc
from graphc.api.parallel import Parallelized
from graphc.cli import compile as cli_compile
from graphc.cli.common import load_plan
from graphc.cli.main import main as cli_main
from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.core.pytree import static_argnames
from graphc.core.traits import Contraction
from graphc.models import gpt3
from graphc.passes import scale, search
from graphc.passes.blocks import cut_segments, find_layers, segment_graph, update_only
from graphc.passes.gpu_kernels import gemm_absorbed
from graphc.passes.options import PlanOptions
from graphc.passes.partition import Pins, build_problem, state_ties
from graphc.passes.scale import Layout, layered_model, plan_layout, search_layered, stage_cut
from graphc.passes.search import explain, search_meshes, step_batch
from graphc.passes.sharding.build import step_flops
from graphc.passes.sharding.groups import shrink_groups
from graphc.passes.sharding.records import MFU_FORMULA

A100 = get_profile("a100-sxm")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _graph(args, kw):
    pf = Parallelized(gpt3.train_step, {"dp": 1}, static_argnames=static_argnames(kw))
    return pf.trace_optimized(*args, **kw)[1]


def _small(n_layer=5, batch=16, dtype=np.float32):
    return _graph(
        *gpt3.example_train_specs(n_layer=n_layer, d=64, n_head=4, seq=16, n_vocab=128, batch=batch, dtype=dtype)
    )


def test_layers_are_found_and_every_node_has_a_segment():
    g = _small()
    layers = find_layers(g)
    assert layers is not None and layers.count == 5
    assert layers.prefixes == ("opt_state.m.blocks", "opt_state.v.blocks", "params.blocks")
    assert all(len(ks) == 3 * 12 for ks in layers.inputs)  # 12 tensors a layer: params, m and v
    seg = cut_segments(g, layers)
    assert seg is not None and seg.n_segments == 5 + 2
    upd = update_only(g)
    for k, n in enumerate(g.nodes):
        if n.part in ("forward", "backward") and k not in upd and not n.op.name.startswith("const"):
            assert seg.segment[k] >= 0 or not n.outputs, (k, n)
    assert set(seg.update_nodes) == {k for k, n in enumerate(g.nodes) if n.part == "update" or k in upd}


def test_no_layers_in_a_step_without_a_repeated_block():
    args, kw = gpt3.example_train_args(n_layer=2)
    assert find_layers(_graph(args, kw)) is None


def test_the_stamped_block_does_the_whole_steps_work():
    """pre + L x block + head: the forward and backward flops of the whole step, exactly."""
    g = _small(n_layer=6)
    seg = cut_segments(g, find_layers(g))
    upd = set(seg.update_nodes)
    whole = segment_graph(g, [k for k in range(len(g.nodes)) if k not in upd and seg.segment[k] >= 0], "whole")
    parts = [segment_graph(g, seg.nodes(s), f"s{s}") for s in (0, seg.block, seg.n_segments - 1)]
    flops = [sum(step_flops(x)[0].values()) for x in [whole, *parts]]
    assert flops[0] == pytest.approx(flops[1] + 6 * flops[2] + flops[3], rel=1e-12)
    for s in range(1, 7):  # every layer's segment is the same computation
        assert sum(step_flops(segment_graph(g, seg.nodes(s), "x"))[0].values()) == pytest.approx(flops[2])
    for x in parts:
        x.verify()


def _brute_cut(unit_s, unit_mem, fixed_mem, S, limit):
    L = len(unit_s)
    best, arg = np.inf, None
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = [0, *cuts, L]
        if limit is not None and any(
            fixed_mem(s, unit_mem[b[s] : b[s + 1]].sum(), b[s + 1] - b[s]) > limit for s in range(S)
        ):
            continue
        t = max(unit_s[b[s] : b[s + 1]].sum() for s in range(S))
        if t < best:
            best, arg = t, [b[s + 1] - b[s] for s in range(S)]
    return best, arg


@pytest.mark.parametrize("seed", range(6))
def test_stage_cut_is_the_best_cut(seed):
    rng = np.random.default_rng(seed)
    L, S = int(rng.integers(3, 9)), int(rng.integers(1, 4))
    unit_s, unit_mem = rng.uniform(0.5, 2, L), rng.uniform(1, 3, L)

    def fixed_mem(s, b, n):
        return 0.5 * n + (S - s) * b  # 1F1B: earlier stages hold more micro-batches

    limit = float(rng.uniform(4, 12)) if seed % 2 else None
    best, counts = _brute_cut(unit_s, unit_mem, fixed_mem, S, limit)
    got = stage_cut(unit_s, unit_mem, fixed_mem, S, limit)
    if counts is None:
        assert got is None
        return
    b = np.concatenate([[0], np.cumsum(got)])
    assert sum(got) == L and max(unit_s[b[s] : b[s + 1]].sum() for s in range(S)) == pytest.approx(best)


@pytest.fixture(scope="module")
def small_search():
    g = _small(n_layer=4, batch=32, dtype=graphc.bfloat16)
    return g, search_meshes(g, 4, PlanOptions(memory_limit=2**30), profile=A100)


@pytest.mark.long  # 16-19 s: a whole --devices 4 search (tests/passes/test_search.py runs one through the CLI)
def test_block_search_on_a_small_step_finds_a_plan_and_says_what_it_skipped(small_search):
    _g, cands = small_search
    best = cands[0]
    assert best.ok and best.layout is not None and best.axes.get("tp", 1) <= 8
    # a step this small has its choice planned whole (a plan that runs); the others stay composed
    assert not isinstance(best.plan, scale.ComposedPlan) and best.whole_error is None
    assert "planned whole" in explain(cands)
    doc = json.loads(next(c for c in cands[1:] if c.ok).plan.to_json())
    assert doc["kind"] == "composed" and doc["mfu"]["formula"] == MFU_FORMULA
    assert doc["mfu"]["value"] == pytest.approx(
        doc["mfu"]["model_flops"] / (doc["predicted"]["step_s"] * 4 * doc["mfu"]["peak_flops"])
    )
    ok = [c for c in cands if c.ok]
    assert [c.step_s for c in ok] == sorted(c.step_s for c in ok)
    assert all(c.skipped.split(":")[0] in ("memory bound", "compute bound", "time limit") for c in cands if c.skipped)


def test_a_search_stopped_at_its_limit_returns_the_best_plan_so_far(monkeypatch):
    g = _small(n_layer=4, batch=32, dtype=graphc.bfloat16)
    model = layered_model(g, step_batch(g), A100)
    solved = []
    real = scale._solve_all

    def once(*a, **k):
        solved.append(a[1:3])
        return real(*a, **k)

    monkeypatch.setattr(scale, "_solve_all", once)
    deadline = time.perf_counter() + 600  # the solves' own limit; the search's clock runs out after one
    outs = search_layered(model, 4, PlanOptions(), A100, deadline, clock=lambda: 0.0 if not solved else math.inf)
    assert len(solved) == 1  # the first (tp, micro-batch) solved, then the clock ran out
    plans = [o for o in outs if o.plan is not None]
    assert plans and all(o.layout.tp == solved[0][0] for o in plans)
    timed_out = [o for o in outs if o.skipped and o.skipped.startswith("time limit")]
    assert timed_out and {o.layout.tp for o in timed_out} - {solved[0][0]}


@pytest.mark.long  # shares the search above
def test_plan_layout_prices_a_given_layout_no_faster_than_the_search(small_search):
    g, cands = small_search
    model = layered_model(g, step_batch(g), A100)
    lo = Layout(2, 1, 2, 2, 16, 0, "off")
    fixed = plan_layout(model, lo, PlanOptions(memory_limit=2**30), A100, time.perf_counter() + 60)
    assert fixed.layout == lo and fixed.predicted["step_s"] >= cands[0].step_s * (1 - 1e-12)


@pytest.mark.long
@pytest.mark.slow
def test_gpt3_175b_on_1024_a100s_against_megatron(tmp_path):
    """Issue 29: the searched layout keeps tp within a node and uses stages; Megatron-LM's own
    layout (pp=16, dp=8, tp=8, micro-batch 1: 192 micro-batches), compiled with a plain --mesh
    (a step too big to plan whole: priced by blocks, by the same model), is no faster. (The
    searched plan's MFU is above Megatron-LM's measured 45%: docs/scale.md says why.)"""
    g = _graph(*gpt3.example_train_specs_175b())
    options = PlanOptions(memory_limit=80 * 2**30)
    cands = search_meshes(g, 1024, options, profile=A100, deadline=time.perf_counter() + 600)
    best = cands[0]
    assert best.ok and best.axes.get("tp", 1) <= 8 and best.axes.get("pp", 1) > 1
    assert 0.35 <= best.plan.mfu < 1
    target = [os.path.join(ROOT, "models/gpt3.py") + ":train_step", "--example", "example_train_specs_175b"]
    megatron = _cli(
        "compile", *target, "--mesh", "pp=16,dp=8,tp=8", "--microbatches", "192", "--profile", "a100-sxm",
        "--memory", "80GiB", "--time-limit", "600", "--quiet", "-o", str(tmp_path / "m.json"), cwd=tmp_path,
    )  # fmt: skip
    assert megatron.returncode == 0, megatron.stderr
    assert "priced by blocks" in megatron.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["kind"] == "composed" and m["layout"]["micro_batch"] == 1
    assert (m["layout"]["pp"], m["layout"]["dp"], m["layout"]["tp"]) == (16, 8, 8)
    assert m["predicted"]["step_s"] >= best.step_s * (1 - 1e-12)


@pytest.mark.slow
def test_plain_mesh_on_a_step_too_big_to_plan_whole_is_priced_by_blocks(tmp_path, monkeypatch):
    """``compile --mesh`` plans a small step whole (a plan that runs); past ``WHOLE_PLAN_NODES``
    it prices a pipeline mesh by blocks, as --by-blocks, and says so; a mesh without stages is
    planned whole at any size."""
    target = [os.path.join(ROOT, "models/gpt3.py") + ":train_step", "--example", "example_train_specs_small"]
    common = [*target, "--mesh", "pp=2,tp=2", "--microbatches", "4", "--profile", "a100-sxm", "--quiet", "--no-cache"]
    assert cli_main(["compile", *common, "-o", str(tmp_path / "whole.json")]) == 0
    assert json.loads((tmp_path / "whole.json").read_text())["kind"] != "composed"
    monkeypatch.setattr(cli_compile, "WHOLE_PLAN_NODES", 100)
    assert cli_main(["compile", *common, "-o", str(tmp_path / "blocks.json")]) == 0
    doc = json.loads((tmp_path / "blocks.json").read_text())
    assert doc["kind"] == "composed" and doc["layout"]["micro_batch"] == 8
    assert (doc["layout"]["pp"], doc["layout"]["tp"], doc["layout"]["microbatches"]) == (2, 2, 4)
    assert cli_main(["compile", *common, "--explain", "%x", "-o", str(tmp_path / "x.json")]) == 0  # needs a whole plan
    assert json.loads((tmp_path / "x.json").read_text())["kind"] != "composed"
    flat = [*target, "--mesh", "dp=2,tp=2", "--profile", "a100-sxm", "--quiet", "--no-cache"]
    assert cli_main(["compile", *flat, "-o", str(tmp_path / "flat.json")]) == 0  # no stages: planned whole
    assert json.loads((tmp_path / "flat.json").read_text()).get("kind") != "composed"


def test_a_step_too_large_to_plan_whole_keeps_the_composed_plan_and_says_so(monkeypatch):
    monkeypatch.setattr(search, "WHOLE_PLAN_NODES", 0)
    g = _small(n_layer=4, batch=8, dtype=graphc.bfloat16)
    cands = search_meshes(g, 2, PlanOptions(), profile=A100)
    assert isinstance(cands[0].plan, scale.ComposedPlan)
    assert "not a plan to run" in explain(cands) and "--mesh" in explain(cands)


def test_a_search_out_of_time_keeps_the_composed_plan():
    g = _small(n_layer=4, batch=8, dtype=graphc.bfloat16)
    cand = search_meshes(g, 2, PlanOptions(), profile=A100)[0]
    composed = dataclasses.replace(cand, plan=None, whole_error=None)
    search._plan_whole(composed, g, PlanOptions(), A100, deadline=time.perf_counter() - 1)
    assert composed.plan is None and "time limit" in composed.whole_error


def test_running_a_composed_plan_is_a_clear_error(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "kind": "composed", "graph": {"name": "f", "hash": ""}, "mesh": {}}))
    with pytest.raises(PlanError, match="block search predicted.*--mesh"):
        load_plan(str(path))


def test_a_composed_step_is_the_1f1b_closed_form():
    """Balanced stages, no memory limit: step = (k + S - 1) x (f + b) x layers per stage + the
    sends of every micro-batch + the gradient all-reduce the last backward does not hide + update;
    the breakdown's terms add up to it."""
    g = _small(n_layer=4, batch=32, dtype=graphc.bfloat16)
    model = layered_model(g, step_batch(g), A100)
    fwd_terms = {"gemm": 0.6e-3, "attention": 0.1e-3, "non_gemm": 0.1e-3, "tp_comm": 0.2e-3}
    bwd_terms = {"gemm": 1.2e-3, "attention": 0.3e-3, "non_gemm": 0.1e-3, "tp_comm": 0.4e-3}
    blk = scale.SegmentCost(1e-3, 2e-3, 100, 10, 0.0, None, fwd_terms, bwd_terms)
    zero = scale.SegmentCost(0.0, 0.0, 0, 0, 0.0, None)
    segs = scale._Segments(zero, blk, zero)
    figures = scale.cluster_figures(A100)
    lo = Layout(pp=2, dp=4, tp=2, micro_batch=1, microbatches=8, zero=0, recompute="off")
    plan, why = scale.compose(model, segs, lo, A100, figures, None)
    assert why is None and plan.stage_layers == (2, 2)
    link = A100.link_for("pp")
    sends = 2 * (8 + 2 - 1) * (link.latency_s + 10 / link.bandwidth)  # every micro-batch waits (Megatron's 1F1B)
    dp_link = A100.link_for("dp")
    grads = model.param_bytes * 2 / 2 + model.other_state / 2 * model.param_bytes / (
        model.param_bytes + model.state_bytes
    )
    ring = 2 * 3 / 4 * grads / dp_link.bandwidth + 2 * 3 * dp_link.latency_s
    # hidden behind one micro-batch's backward of a stage, which runs slower beside it
    s = figures.overlap_slowdown
    exposed = max(ring - 2 * 2e-3, s * ring / (1 + s))
    # the update: the whole update's time by the share of its bytes a device of a stage updates
    # (2 of the 4 layers and the ends, which both stages hold here, split over tp = 2)
    layer, ends = model.param_bytes + model.state_bytes, model.other_state
    update = model.update_s * (2 * layer + ends) / 2 / (4 * layer + ends)
    assert plan.predicted["step_s"] == pytest.approx((8 + 1) * 2 * 3e-3 + sends + exposed + update, rel=1e-12)
    assert plan.predicted["bubble"] == pytest.approx(1 / 9)
    assert plan.mfu == pytest.approx(plan.model_flops / (plan.predicted["step_s"] * 16 * 312e12))
    # the breakdown: the slowest stage's 8 micro-batches term by term, with the fill and drain,
    # add up to the pipeline; the communication and update terms to the step
    p = plan.predicted
    assert p["gemm_s"] == pytest.approx(8 * 2 * 1.8e-3) and p["tp_comm_s"] == pytest.approx(8 * 2 * 0.6e-3)
    assert p["bubble_s"] == pytest.approx(1 * 2 * 3e-3) and p["recompute_s"] == 0.0
    terms = ("gemm_s", "attention_s", "non_gemm_s", "tp_comm_s", "launch_s", "recompute_s", "bubble_s")
    assert sum(p[t] for t in terms) == pytest.approx(p["pipeline_s"], rel=1e-12)
    assert sum(p[t] for t in (*terms, "p2p_s", "dp_s", "update_s", "relayout_s")) == pytest.approx(
        p["step_s"], rel=1e-12
    )
    assert "GEMM" in plan.breakdown() and "bubble" in plan.summary()
    full, _ = scale.compose(model, segs, dataclasses.replace(lo, recompute="full"), A100, figures, None)
    assert full.predicted["pipeline_s"] == pytest.approx((8 + 1) * 2 * 4e-3)  # the forward twice
    assert full.predicted["recompute_s"] == pytest.approx(8 * 2 * 1e-3)
    assert max(full.memory_bytes) < max(plan.memory_bytes)  # keeps 10 bytes a layer, not 100


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "graphc.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.long
@pytest.mark.slow
def test_cli_prices_a_given_mesh_by_blocks_no_faster_than_the_search(tmp_path):
    target = [os.path.join(ROOT, "models/gpt3.py") + ":train_step", "--example", "example_train_specs_small"]
    common = ["--profile", "a100-sxm", "--quiet", "--time-limit", "300"]
    searched = _cli("compile", *target, "--devices", "4", *common, "-o", str(tmp_path / "s.json"), cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr
    given = _cli(
        "compile", *target, "--mesh", "pp=2,tp=2", "--microbatches", "4", "--by-blocks", *common,
        "-o", str(tmp_path / "m.json"), cwd=tmp_path,
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    s, m = (json.loads((tmp_path / f).read_text()) for f in ("s.json", "m.json"))
    assert m["kind"] == "composed" and m["layout"]["micro_batch"] == 8
    chosen = s["search"]["candidates"][0]  # the search's composed prediction (its plan was then made whole)
    assert m["predicted"]["step_s"] >= chosen["predicted_s"] * (1 - 1e-12)


def test_by_blocks_with_devices_is_a_usage_error(tmp_path):
    res = _cli(
        "compile", os.path.join(ROOT, "models/gpt3.py") + ":train_step", "--devices", "4", "--by-blocks",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2 and "--by-blocks prices one --mesh" in res.stderr


def test_gemm_absorbed_ops_are_operand_transposes_and_batch_sums_of_products():
    """On GPU profiles a block's transposed GEMM operands and its weight gradients' sums over the
    batch are part of the GEMMs (cuBLAS operand flags; one GEMM over batch x sequence rows)."""
    g = _small(n_layer=4, batch=8, dtype=graphc.bfloat16)
    blk = layered_model(g, step_batch(g), A100).graphs["block"]
    nodes = [blk.nodes[k] for k in sorted(gemm_absorbed(blk))]
    assert {n.op.name for n in nodes} == {"transpose", "reduce_sum"}
    for n in nodes:
        if n.op.name == "transpose":
            r = n.inputs[0].type.ndim
            assert n.attrs["perm"] == (*range(r - 2), r - 1, r - 2)
            assert all(u.op.has(Contraction) for u in blk.nodes if n.outputs[0] in u.inputs)
        else:
            assert n.inputs[0].producer.op.has(Contraction)
            assert n.attrs["axes"] == tuple(range(len(n.attrs["axes"])))
    assert scale.cluster_figures(A100).gemm_absorbs_layouts  # only GPU presets say so
    assert not scale.cluster_figures(get_profile("cpu-here")).gemm_absorbs_layouts
    weights = {v.type.shape for v in blk.inputs if (v.name or "").endswith(".w")}
    sums = {n.outputs[0].type.shape for n in nodes if n.op.name == "reduce_sum"}
    assert weights and weights <= sums  # every weight gradient is one GEMM


@pytest.mark.slow
def test_attention_is_priced_at_the_fused_kernels_share_of_the_peak():
    """The attention matmuls run at ``attention_efficiency`` of the peak: half the share, twice
    the time, and nothing else changes; never faster than the flops perfectly split."""
    g = _small(n_layer=4, batch=8, dtype=graphc.bfloat16)
    blk = layered_model(g, step_batch(g), A100).graphs["block"]
    # without launches: this block's kernels run shorter than their launches, which would hide
    # the attention's extra time (tests/passes/test_gpu_kernels.py prices them)
    figs = dataclasses.replace(scale.cluster_figures(A100), launch_s=0.0)
    half = dataclasses.replace(figs, attention_efficiency=figs.attention_efficiency / 2)
    a, b = (scale.solve_segment(blk, 2, 1, 8, A100, f, time.perf_counter() + 60) for f in (figs, half))
    for side in ("forward_terms", "backward_terms"):
        x, y = getattr(a, side), getattr(b, side)
        assert x["attention"] > 0 and y["attention"] == pytest.approx(2 * x["attention"])
        assert {t: x[t] for t in x if t != "attention"} == pytest.approx({t: y[t] for t in y if t != "attention"})
    scores = scale._score_values(blk)
    qk_pv = [
        n for n in blk.nodes if n.op.has(Contraction) and n.part == "forward" and set(n.inputs + n.outputs) & scores
    ]
    flops = sum(sum(step_flops(segment_graph(blk, [blk.nodes.index(n)], "n"))[0].values()) for n in qk_pv)
    assert len(qk_pv) == 2 and a.forward_terms["attention"] >= flops / 16 / (0.5 * 312e12) * (1 - 1e-9)
    assert a.forward_s == pytest.approx(sum(a.forward_terms.values()))


@pytest.mark.slow
def test_dropout_inside_the_fused_attention_kernel_is_priced_at_its_measured_slowdown():
    """The probabilities' dropout runs inside the fused attention kernel: its forward and backward
    take FlashAttention's measured ratios with dropout over without (graphc/core/profiles.py
    ``FLASH_DROPOUT_MS``; 16 tokens are below its shortest row, 128), and nothing else changes; a
    step without dropout is priced the same with or without the figure."""
    figs = dataclasses.replace(scale.cluster_figures(A100), launch_s=0.0)  # launches would hide the difference
    free = dataclasses.replace(figs, attention_dropout=())
    fwd_x, bwd_x = 0.10 / 0.08, 0.15 / 0.11  # FlashAttention (Dao et al. 2022), tables 15, 18, 16, 19, at 128
    for p_drop, ratios in ((0.1, (fwd_x, bwd_x)), (0.0, (1.0, 1.0))):
        args, kw = gpt3.example_train_specs(
            n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=8, dtype=graphc.bfloat16, dropout_p=p_drop
        )
        g = _graph(args, kw)
        blk = layered_model(g, step_batch(g), A100).graphs["block"]
        a, b = (scale.solve_segment(blk, 2, 1, 8, A100, f, time.perf_counter() + 60) for f in (figs, free))
        for side, ratio in zip(("forward_terms", "backward_terms"), ratios):
            x, y = getattr(a, side), getattr(b, side)
            assert y["attention"] > 0 and x["attention"] == pytest.approx(ratio * y["attention"])
            assert {t: x[t] for t in x if t != "attention"} == pytest.approx({t: y[t] for t in y if t != "attention"})


def _sgd_step(params, tokens, targets, n_head, lr=0.1):
    # plain SGD: no optimizer state, only the parameters
    value, grads = graphc.value_and_grad(gpt3.loss)(params, tokens, targets, n_head, None, 0.0)

    def step(p, g):
        if isinstance(p, dict):
            return {k: step(p[k], g[k]) for k in p}
        if isinstance(p, list):
            return [step(a, b) for a, b in zip(p, g)]
        return p - lr * g

    return step(params, grads), value


def test_a_step_without_optimizer_state_gets_no_optimizer_offload_layouts():
    params = gpt3.init_params(None, 128, 16, 64, 3, np.float32, spec=True)
    tokens = graphc.ArraySpec((8, 16), np.int64)
    pf = Parallelized(_sgd_step, {"dp": 1}, static_argnames=("n_head",))
    g = pf.trace_optimized(params, tokens, tokens, n_head=4)[1]
    model = layered_model(g, step_batch(g), A100)
    assert model is not None and model.state_bytes == 0 and not model.state_names
    assert scale.offload_choices(model, A100) == ("off", "activations")
    outs = search_layered(model, 2, PlanOptions(), A100, deadline=0.0)  # nothing solved: the layouts listed
    assert outs and {o.layout.offload for o in outs} == {"off", "activations"}
    adam = layered_model(_small(n_layer=3, batch=8), 8, A100)
    assert scale.offload_choices(adam, A100) == ("off", "optimizer", "activations", "both")


def test_a_scaled_estimate_keeps_a_micro_batch_s_kernel_launches_once():
    """A micro-batch launches the same kernels whatever its size: scaled to b sequences, the work
    is b times micro-batch 1's and the host's excess over it is taken again (it used to be b times
    the excess too, so a launch-bound block looked no faster at larger micro-batches)."""
    terms = dict.fromkeys(scale.TERMS, 0.0) | {"gemm": 1e-3, "tp_comm": 0.5e-3, "launch": 3e-3}  # launches: 4.5 ms
    cost = scale.SegmentCost(4.5e-3, 0.0, 10, 2, 1.0, None, terms, dict.fromkeys(scale.TERMS, 0.0))  # type: ignore[arg-type]
    for b, launch in ((1, 3e-3), (2, 1.5e-3), (3, 0.0), (16, 0.0)):
        s = scale.scaled(cost, b)
        assert s.forward_terms["gemm"] == pytest.approx(b * 1e-3) and s.forward_terms["launch"] == pytest.approx(launch)
        assert s.forward_s == pytest.approx(max(4.5e-3, b * 1.5e-3)) and s.activation_bytes == 10 * b
    no_gap = dataclasses.replace(cost, forward_terms=terms | {"launch": 0.0}, forward_s=1.5e-3)
    assert scale.scaled(no_gap, 4).forward_s == pytest.approx(6e-3)


def _outcome(tp, b, step, exact, zero=0):
    o = scale.Outcome(Layout(1, 1, tp, b, 8 // b, zero, "off"), exact=exact)
    o.plan = type("P", (), {"predicted": {"step_s": step}})()  # type: ignore[assignment]
    return o


def test_refinement_stops_when_no_estimate_beats_the_best_solved_plan(monkeypatch):
    solved_steps = {(1, 2, 0): 0.7, (1, 2, 1): 0.84, (1, 4, 0): 0.72, (1, 8, 0): 1.9}  # each layout solved

    def compose_into(o, model, segs, profile, figures, limit):
        o.plan.predicted = {"step_s": solved_steps[(o.layout.tp, o.layout.micro_batch, o.layout.zero)]}
        o.exact = True

    monkeypatch.setattr(scale, "_compose_into", compose_into)
    asked = []
    out = [
        _outcome(1, 1, 1.0, True),
        _outcome(1, 2, 0.75, False),
        _outcome(1, 2, 1.2, False, zero=1),  # solved 30% below its estimate
        _outcome(1, 4, 0.8, False),  # no estimate of 4 or more solved yet: solved
        _outcome(1, 8, 2.0, False),  # nor of 8: solved, though far above the best (0.7)
        _outcome(2, 2, 1.0 * (1 - 1e-4), False),  # 30% below is within the solver's gap of 0.7: left
    ]
    scale._refine(out, lambda t, b, exact: asked.append((t, b)), None, A100, None, None, lambda: True)
    assert asked == [(1, 2), (1, 4), (1, 8)] and all(o.exact and o.unsolved is None for o in out[:5])
    assert not out[5].exact and out[5].unsolved is not None and "solver's gap" in out[5].unsolved
    late = [_outcome(1, 1, 1.0, True), _outcome(1, 2, 0.5, False)]
    scale._refine(late, lambda *a: None, None, A100, None, None, lambda: False)
    assert late[1].unsolved is not None and late[1].unsolved.startswith("the time limit")


def test_the_choice_says_how_many_plans_were_estimates_and_prefers_a_runnable_tie():
    def cand(step, offload="off", estimate=None):
        lo = Layout(1, 8, 1, 1, 4, 0, "off", offload)
        c = search.Candidate(
            axes=lo.axes, microbatches=4, layout=lo, predicted_s=step, memory_bytes=1, estimate=estimate
        )
        return c

    cands = [cand(14.6331, "activations"), cand(14.6377), cand(15.0, estimate="the time limit ran out")]
    search._prefer_runnable(cands)
    assert cands[0].layout.offload == "off" and cands[0].step_s == 14.6377  # 0.03% slower: a tie
    text = explain(cands)
    assert "cannot run here" in text and "0.031% slower" in text
    assert "1 of them estimates scaled from micro-batch 1, not solved: the time limit ran out" in text
    assert "(an estimate, not solved)" in explain(cands, verbose=True)
    apart = [cand(14.0, "activations"), cand(14.6377)]  # 4.6% apart: the offloading plan stays first
    search._prefer_runnable(apart)
    assert apart[0].layout.offload == "activations" and apart[1].tie is None


def test_the_block_search_hashes_the_step_inside_its_deadline(monkeypatch):
    """The chosen plan names its graph's hash; hashing a large step takes seconds, so it is done
    before the search and the search ends that much earlier (it used to run after the deadline)."""
    g = _small(n_layer=3, batch=8)
    seen = {}

    def slow_hash(graph):
        time.sleep(0.3)
        return "hash"

    def record(model, n, options, profile, deadline, progress=None, clock=time.perf_counter):
        seen["deadline"] = deadline
        return []

    monkeypatch.setattr(search, "graph_hash", slow_hash)
    monkeypatch.setattr(search, "search_layered", record)
    deadline = time.perf_counter() + 100
    search.search_meshes(g, 2, PlanOptions(), profile=A100, deadline=deadline)
    assert seen["deadline"] <= deadline - 0.3


def test_no_solve_begins_within_its_least_time_of_the_deadline(monkeypatch):
    """A segment solve gets at least MIN_SOLVE_S: one begun closer to the deadline than that would
    end after it (the first solve of a search used to be begun at any time before the deadline)."""
    g = _small(n_layer=3, batch=8)
    model = layered_model(g, step_batch(g), A100)
    monkeypatch.setattr(scale, "_solve_all", lambda *a, **k: pytest.fail("a solve was begun"))
    deadline = 1000.0
    outs = search_layered(model, 2, PlanOptions(), A100, deadline, clock=lambda: deadline - scale.MIN_SOLVE_S / 2)
    assert outs and all(o.skipped and o.skipped.startswith("time limit") for o in outs)


def test_every_data_parallel_width_may_take_its_whole_batch_in_one_micro_batch():
    """A batch of 24 on 8 devices: each data-parallel width D may run its 24 / D sequences per
    replica as one micro-batch, or split them (24 / D over 2, 4, ...), not only in the power-of-two
    sizes 1, 2, 4, 8, 16 (it used to try dp=8 only as 3 micro-batches of 1 and dp=4 as 6 of 1 or
    3 of 2: a search on a batch of 24 returned a plan `--mesh dp=4,tp=2 --by-blocks` beat)."""
    model = layered_model(_small(n_layer=3, batch=24), 24, A100)
    los = scale.layouts(model, 8, 8, PlanOptions())
    sizes: dict[tuple[int, int, int], set[int]] = {}
    for lo in los:
        assert lo.micro_batch * lo.microbatches * lo.dp == 24
        sizes.setdefault((lo.pp, lo.dp, lo.tp), set()).add(lo.micro_batch)
    for (_S, D, _t), got in sizes.items():
        per = 24 // D
        want = {b for b in (1, 2, 4, 8, 16) if per % b == 0} | {per // m for m in (1, 2, 4, 8, 16) if per % m == 0}
        assert got == want and per in got
    assert (
        sizes[(1, 8, 1)] == {1, 3}
        and sizes[(1, 4, 2)] == {1, 2, 3, 6}
        and sizes[(1, 1, 8)] == {1, 2, 3, 4, 6, 8, 12, 24}
    )
    firsts = [lo.micro_batch for lo in los if lo.tp == 8]
    assert firsts == sorted(firsts)  # smallest micro-batch first within a tp


def _keyed_loss(params, tokens, targets, n_head):
    # gpt3.loss with its blocks in a dict {"layer1": ..., "layer2": ...}, in their numbers' order
    blocks = params["blocks"]
    as_list = {**params, "blocks": [blocks[f"layer{i + 1}"] for i in range(len(blocks))]}
    return gpt3.loss(as_list, tokens, targets, n_head)


def _keyed_step(params, opt_state, tokens, targets, n_head, lr=6e-5):
    value, grads = graphc.value_and_grad(_keyed_loss)(params, tokens, targets, n_head)
    params, opt_state = gpt3.adam_mixed(params, grads, opt_state, lr)
    return params, opt_state, value


def _keyed(tree):
    return {**tree, "blocks": {f"layer{i + 1}": b for i, b in enumerate(tree["blocks"])}}


def test_layers_kept_in_a_dict_are_found_and_tied_as_a_list_s():
    """Layers as dict keys of a name and a number ("layer1" .. "layer11", numbered from 1) are the
    list's layers to the block search (``find_layers``) and to the sharding ILP's tying: they used
    to be neither, so a search fell back to planning meshes whole, and a whole plan of the same
    step had 3x the ILP groups, stopping at its time limit 31% from its bound on a GPT of 8 layers
    on tp=8 (the list's: optimal in under a second)."""
    (params, state, tokens, targets), kw = gpt3.example_train_specs(
        n_layer=11, d=64, n_head=4, seq=16, n_vocab=128, batch=8, dtype=np.float32, dropout_p=0.0
    )
    state = {"m": _keyed(state["m"]), "v": _keyed(state["v"]), "t": state["t"]}
    pf = Parallelized(_keyed_step, {"dp": 1}, static_argnames=("n_head",))
    g = pf.trace_optimized(_keyed(params), state, tokens, targets, **kw)[1]
    layers = find_layers(g)
    assert layers is not None and layers.count == 11
    assert layers.prefixes == ("opt_state.m.blocks.layer", "opt_state.v.blocks.layer", "params.blocks.layer")
    for i, ks in enumerate(layers.inputs):  # layer i is key "layer{i + 1}": 10 and 11 after 9
        assert all(f".layer{i + 1}." in g.inputs[k].name for k in ks) and len(ks) == 3 * 12
    listed = _graph((params, {"m": {**state["m"], "blocks": list(state["m"]["blocks"].values())},
                              "v": {**state["v"], "blocks": list(state["v"]["blocks"].values())}, "t": state["t"]},
                     tokens, targets), kw)  # fmt: skip
    mesh = Mesh({"tp": 2}, profile=A100)
    tied = [len(shrink_groups(build_problem(h, mesh, PlanOptions(), Pins(), state_ties(h)))[0]) for h in (g, listed)]
    assert tied[0] <= tied[1] + 1, tied  # the dict's step has one item more (2,338 groups before)


@pytest.mark.parametrize("n", [96, 1000, 12])
def test_tensor_parallel_groups_divide_a_node(n):
    """A tensor-parallel group stays inside a node of 8 only if its size divides 8: 96 devices in
    groups of 6 (or 1,000 in groups of 5) put ranks 6-11 (5-9) on two nodes, priced at the
    node's link. The search offered tp = 3, 5, 6 because they are at most 8."""
    model = layered_model(_small(n_layer=3, batch=1000 if n == 1000 else 48), 1000 if n == 1000 else 48, A100)
    tps = {lo.tp for lo in scale.layouts(model, n, 8, PlanOptions())}
    assert tps == {t for t in (1, 2, 4, 8) if n % t == 0}
