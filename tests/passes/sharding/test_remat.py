"""Activation recomputation chosen by the planner (passes/recompute/choices.py): the solver recomputes
only under a memory limit that needs it, cheap values first; the lowered programs recompute
before the backward pass and free the originals; results equal the plan without recomputation."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import graphc
from graphc.core.errors import GraphcError, PlanError
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import flatten
from graphc.core.traits import ViewOf
from graphc.interpreter import bind_arguments
from graphc.models import gpt
from graphc.passes.lower import lower_graph
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, solve_problem, state_ties
from graphc.passes.sharding.plan import ShardingPlan
from tests.helpers import assert_adam_step_close
from tests.passes.sharding.exhaustive import exhaustive

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PROFILE = MachineProfile.default()
MESH = Mesh({"dp": 2}, profile=PROFILE)


def par(fn, **kw):
    return graphc.parallelize(fn, mesh=MESH, cache=False, **kw)


def leaves(tree):
    return [np.asarray(x) for x in flatten(tree)[0]]


# a GPT step whose peak is its activations (batch 16 x 32 tokens, d=32): the weights and Adam
# state are a small part of it, so recomputation is what lowers it
GPT_ARGS, GPT_KW = gpt.example_train_args(batch=16, seq=32, d=32)
GPT = dict(static_argnames=("n_head",))
GPT_TERMS = 16 * 32  # its longest sum: a weight's gradient over the 16 x 32 tokens


def assert_same_step(got, want):
    assert_adam_step_close(got, want, lr=GPT_KW["lr"], terms=GPT_TERMS)


@pytest.fixture(scope="module")
def gpt_unlimited():
    return par(gpt.train_step, **GPT).plan(*GPT_ARGS, **GPT_KW)


def _recomputed(plan):
    return [n for n in plan.nodes if n.recompute]


def _measured_peak(compiled, pf):
    args, kwargs, _ = pf.split_static(GPT_ARGS, GPT_KW)
    arrays = bind_arguments(compiled.graph, args, kwargs)
    compiled.executable.run_flat(arrays, profile=True)
    return max(p["peak_bytes"] for p in compiled.executable.last_profile.values())


@pytest.mark.slow
def test_a_step_that_fits_only_with_recomputation_gets_it_runs_and_equals_one_device(gpt_unlimited):
    unlimited = gpt_unlimited.memory.peak_bytes[0]
    limit = unlimited - 400_000  # about three of its [16, 32, 128] activations per device
    with pytest.raises(PlanError) as info:
        par(gpt.train_step, memory_limit=limit, recompute="off", **GPT).plan(*GPT_ARGS, **GPT_KW)
    assert info.value.min_memory_bytes > limit  # no plan fits without recomputation
    pf = par(gpt.train_step, memory_limit=limit, **GPT)
    c = pf.compile(*GPT_ARGS, **GPT_KW)
    again = _recomputed(c.plan)
    assert again and c.plan.memory.peak_bytes[0] <= limit
    # keeping the recomputed values instead, the same specs would not fit (the limited problem's
    # model also counts what fused backward kernels keep out of memory: memory.fused_inside)
    assert c.plan.memory.peak_bytes[0] + c.plan.memory.recompute_saved_bytes > limit
    # priced in compute time: the plan costs more than the unlimited one, by at most the recomputed nodes
    # priced in compute time: the plan costs more than the unlimited one, by little. (Not by the
    # recomputed nodes alone: a copy's point is the earliest its segment's copies may need it,
    # so it may be held longer than its own readers need, and the solver then trades a little
    # communication for it: 0.25% over the recomputed compute here; docs/remat.md, "Not done".)
    extra = sum(n.compute_s for n in again) / 2
    assert extra > 0
    assert gpt_unlimited.cost.total_s < c.plan.cost.total_s <= 1.02 * gpt_unlimited.cost.total_s
    want = graphc.jit(gpt.train_step, static_argnames=("n_head",))(*GPT_ARGS, **GPT_KW)
    got = c(*GPT_ARGS, **GPT_KW)
    assert_same_step(got, want)
    # the same plan without recomputation gives the same numbers (up to rounding: a recomputed
    # copy runs outside the fused kernel that made the original)
    plain = par(gpt.train_step, recompute="off", **GPT).compile(*GPT_ARGS, **GPT_KW)
    assert_same_step(got, plain(*GPT_ARGS, **GPT_KW))
    # and the runtime really holds less: the executor frees the originals after the forward pass
    assert _measured_peak(c, pf) < _measured_peak(plain, pf) - 300_000


def test_the_lowered_program_recomputes_in_runs_before_the_backward_pass_reads_the_copies(gpt_unlimited):
    limit = gpt_unlimited.memory.peak_bytes[0] - 400_000
    c = par(gpt.train_step, memory_limit=limit, **GPT).compile(*GPT_ARGS, **GPT_KW)
    n_again = len(_recomputed(c.plan))
    for program in lower_graph(c.partitioned.graph, c.plan).devices:
        nodes = program.graph.nodes
        assert program.origin is not None
        copies = [k for k, n in enumerate(nodes) if n.part == "recompute" and not n.op.has(ViewOf)]
        assert len(copies) == n_again  # and the views into them, made again from the copies
        for k in copies:
            copy = nodes[k]
            j = program.origin[k]  # the graph node it is a copy of
            original = next(n for i, n in enumerate(nodes[:k]) if program.origin[i] == j and n.op is copy.op)
            readers = [j for j, n in enumerate(nodes) if original.outputs[0] in n.inputs]
            assert all(nodes[j].part == "forward" for j in readers)  # freed after the forward pass
            assert all(
                nodes[j].part in ("backward", "recompute") for j, n in enumerate(nodes) if copy.outputs[0] in n.inputs
            )
            after = next(j for j in range(k, len(nodes)) if nodes[j].part != "recompute")
            assert nodes[after].part == "backward"  # a run of copies right before a backward node
    # device CSE leaves the copies alone
    assert sum(n.part == "recompute" for n in c.program.devices[0].graph.nodes) >= 1


def test_without_a_limit_or_with_room_to_spare_nothing_is_recomputed(gpt_unlimited):
    assert not _recomputed(gpt_unlimited)
    assert gpt_unlimited.memory.recompute_saved_bytes == 0
    roomy = par(gpt.train_step, memory_limit=gpt_unlimited.memory.peak_bytes[0] + 1, **GPT).plan(*GPT_ARGS, **GPT_KW)
    assert roomy.solver.sizes["variables"] > gpt_unlimited.solver.sizes["variables"]  # the choice was offered
    assert not _recomputed(roomy)
    assert roomy.cost.total_s == pytest.approx(gpt_unlimited.cost.total_s, rel=1e-9)


# --- cheap, large values first ------------------------------------------------------------------------


def _layer(h, w):
    z = h @ w  # [B, H]: a matmul's result
    return np.tanh(z) * z  # [B, H]: elementwise results


def _two_layer_loss(p, x):
    return np.sum(_layer(_layer(x, p["w1"]), p["w2"]) @ p["w3"])


def _two_layer_step(p, x):
    loss, grads = graphc.value_and_grad(_two_layer_loss)(p, x)
    return {k: p[k] - 0.1 * grads[k] for k in p}, loss


def _two_layer_args(batch=1024, width=128):
    rng = np.random.default_rng(0)
    p = {
        k: (rng.standard_normal(s) * 0.1).astype(np.float32)
        for k, s in [("w1", (width, width)), ("w2", (width, width)), ("w3", (width, 8))]
    }
    return p, rng.standard_normal((batch, width)).astype(np.float32)


def test_the_cheap_elementwise_value_is_recomputed_before_the_matmul_result_of_the_same_size():
    p, x = _two_layer_args()
    graph = optimize_for_planning(graphc.trace(_two_layer_step, p, x))
    unlimited = par(_two_layer_step).plan(p, x).memory.peak_bytes[0]
    activation = 1024 * 128 * 4 // 2  # one [B, H] value on each of the two devices
    limit = unlimited - activation // 2
    options = PlanOptions(memory_limit=limit, zero=0)
    problem = build_problem(graph, MESH, options, ties=state_ties(graph))
    sol = solve_problem(problem, options)
    chosen = [problem.items[i].node for i in problem.recomputed(sol.choice)]
    # one elementwise value of the first layer: tanh(z) (z is kept for the backward anyway) or tanh(z) * z
    assert len(chosen) == 1 and chosen[0].op.name in ("tanh", "mul")
    # the first layer's matmul result is as large, and recomputing it instead fits as well, but
    # costs more: it is a matmul
    matmul = next(
        i
        for i in problem.remat
        if problem.items[i].node.op.name == "matmul" and problem.items[i].node.inputs[0] is graph.inputs[-1]
    )
    mul = problem.recomputed(sol.choice)[0]
    other = list(sol.choice)  # the same specs: each strategy's recompute twin is half a list away
    other[mul] -= len(problem.items[mul].strategies) // 2
    other[matmul] += len(problem.items[matmul].strategies) // 2
    assert not problem.items[mul].strategies[other[mul]].recompute
    assert problem.items[matmul].strategies[other[matmul]].recompute
    assert problem.memory.peak(other)[0] <= limit
    assert problem.evaluate(other)["total_s"] > sol.objective
    # the two layers' results equal the plan without recomputation
    got = par(_two_layer_step, memory_limit=limit)(p, x)
    want = par(_two_layer_step, recompute="off")(p, x)
    for a, b in zip(leaves(got), leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_ilp_with_recomputation_equals_exhaustive_search():
    p, x = _two_layer_args(batch=64, width=16)
    graph = optimize_for_planning(graphc.trace(_two_layer_step, p, x))
    mesh = Mesh({"dp": 1}, profile=PROFILE)
    options = PlanOptions(shrink=False)
    free = build_problem(graph, mesh, options, ties=state_ties(graph))
    unlimited = free.memory.peak(solve_problem(free, options).choice)[0]
    for limit in (unlimited - 4096, unlimited - 8192):
        limited = dataclasses.replace(options, memory_limit=limit)  # "auto" recomputes under a limit
        problem = build_problem(graph, mesh, limited, ties=state_ties(graph))
        assert len(problem.remat) == 6
        sol = solve_problem(problem, limited)
        best, choice = exhaustive(problem, memory_limit=limit)
        assert problem.recomputed(sol.choice) and problem.memory.peak(sol.choice)[0] <= limit
        assert sol.objective == pytest.approx(best, rel=1e-9)


# --- forced on and off, bad input ------------------------------------------------------------------------


@pytest.mark.slow
def test_recompute_forced_on_and_off():
    forced = par(gpt.train_step, recompute="on", **GPT).compile(*GPT_ARGS, **GPT_KW)
    assert len(_recomputed(forced.plan)) > 50  # no limit: recomputed because it was asked for
    off = par(gpt.train_step, recompute="off", **GPT).plan(*GPT_ARGS, **GPT_KW)
    assert forced.plan.memory.peak_bytes[0] < off.memory.peak_bytes[0]
    assert forced.plan.cost.compute_s > off.cost.compute_s
    want = graphc.jit(gpt.train_step, static_argnames=("n_head",))(*GPT_ARGS, **GPT_KW)
    assert_same_step(forced(*GPT_ARGS, **GPT_KW), want)
    with pytest.raises(GraphcError, match="recompute must be one of 'auto', 'on', 'off'"):
        par(gpt.train_step, recompute="sometimes")


@pytest.mark.slow
def test_a_limit_too_small_even_with_recomputation_names_the_smallest_memory(gpt_unlimited):
    with pytest.raises(PlanError, match="the smallest per-device memory any plan needs") as info:
        par(gpt.train_step, memory_limit=1_000_000, **GPT).plan(*GPT_ARGS, **GPT_KW)
    smallest = info.value.min_memory_bytes
    with pytest.raises(PlanError) as without:
        par(gpt.train_step, memory_limit=1_000_000, recompute="off", **GPT).plan(*GPT_ARGS, **GPT_KW)
    assert smallest < without.value.min_memory_bytes  # counted with recomputation
    fits = par(gpt.train_step, memory_limit=smallest, **GPT).plan(*GPT_ARGS, **GPT_KW)  # and it is enough
    assert fits.memory.peak_bytes[0] <= smallest and _recomputed(fits)


@pytest.mark.slow
def test_a_plan_with_recomputation_round_trips_through_json_and_runs_as_written(gpt_unlimited, tmp_path):
    limit = gpt_unlimited.memory.peak_bytes[0] - 400_000
    plan = par(gpt.train_step, memory_limit=limit, **GPT).plan(*GPT_ARGS, **GPT_KW)
    doc = json.loads(plan.to_json())
    marked = [n for n in doc["nodes"] if n.get("recompute")]
    assert len(marked) == len(_recomputed(plan)) and all(n["recompute_saved_bytes"] > 0 for n in marked)
    assert doc["memory"]["recompute_saved_bytes"] == plan.memory.recompute_saved_bytes > 0
    path = tmp_path / "plan.json"
    plan.save(str(path))
    loaded = ShardingPlan.load(str(path))
    assert loaded == plan
    assert loaded.to_json() == plan.to_json()
    assert "recomputed before the backward pass" in loaded.summary()
    name = marked[0]["name"]
    assert "recomputed before the backward pass" in loaded.explain(name)
    got = graphc.parallelize(gpt.train_step, plan=loaded, **GPT)(*GPT_ARGS, **GPT_KW)
    want = par(gpt.train_step, recompute="off", **GPT)(*GPT_ARGS, **GPT_KW)
    assert_same_step(got, want)


@pytest.mark.slow
def test_graphc_compile_recompute_flag_writes_the_marks_and_prints_them(tmp_path):
    def compile_(*extra):
        out = tmp_path / "plan.json"
        env = dict(os.environ, GRAPHC_CACHE_DIR=str(tmp_path / "cache"))
        target = ("models/gpt.py:train_step", "--example", "example_train_args", "--mesh", "dp=2", "-o", str(out))
        res = subprocess.run(
            [sys.executable, "-m", "graphc.cli", "compile", *target, "--quiet", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout, json.loads(out.read_text())

    text, doc = compile_("--recompute")
    assert doc["options"]["recompute"] == "on"
    marked = [n for n in doc["nodes"] if n.get("recompute")]
    assert marked and f"recomputed before the backward pass: {len(marked)} nodes" in text
    text, doc = compile_("--recompute", "off")
    assert not any(n.get("recompute") for n in doc["nodes"]) and "recomputed" not in text
