"""ZeRO stages 1, 2 and 3 as sharding choices along a data axis (passes/sharding/zero.py).

The model: an MLP classifier trained with Adam (graphc.optim.adam), seven layers so that no one
weight dominates, in float64 so that a data-parallel step equals one device's to 1e-9 (Adam's
division by sqrt(v) magnifies float32 rounding in a reordered gradient sum). ``P`` below is the
bytes of the parameters; the Adam state is ``2 P``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import graphc
from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profiles import MachineProfile
from graphc.core.pytree import flatten
from graphc.models import mlp
from tests.helpers import cache_of_its_own, mpiexec_path

DEFAULT = MachineProfile.default()  # planned for one fixed machine, not this one's calibration
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SIZES = (64, 256, 256, 256, 256, 256, 256, 8)


def train_step(params, opt_state, x, labels):
    loss, grads = graphc.value_and_grad(mlp.loss)(params, x, labels)
    params, opt_state = graphc.optim.adam(params, grads, opt_state, lr=1e-2)
    return params, opt_state, loss


def example(batch=64, sizes=SIZES, seed=0):
    rng = np.random.default_rng(seed)
    params = mlp.init_params(rng, sizes, dtype=np.float64)
    x = rng.standard_normal((batch, sizes[0]))
    labels = rng.integers(0, sizes[-1], size=batch)
    return params, graphc.optim.adam_init(params), x, labels


def param_bytes(params) -> int:
    return sum(a.nbytes for a in flatten(params)[0])


def par(**kw):
    return graphc.parallelize(train_step, mesh=Mesh("dp=4", profile=DEFAULT), cache=False, **kw)


def one_device_steps(args, steps):
    params, state, x, labels = args
    losses = []
    for _ in range(steps):
        params, state, loss = train_step(params, state, x, labels)
        losses.append(float(loss))
    return params, state, losses


def parallel_steps(pf, args, steps):
    params, state, x, labels = args
    losses = []
    for _ in range(steps):
        params, state, loss = pf(params, state, x, labels)
        losses.append(float(loss))
    return params, state, losses


def assert_trains_like_one_device(pf, args, steps=3):
    want_p, want_s, want_losses = one_device_steps(args, steps)
    got_p, got_s, got_losses = parallel_steps(pf, args, steps)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-9)
    for got, want in zip(flatten((got_p, got_s))[0], flatten((want_p, want_s))[0]):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9, atol=1e-12)


def state_inputs(plan):
    return [x for x in plan.inputs if x.name.startswith(("%params.", "%opt_state.m.", "%opt_state.v."))]


def weights(plan):
    return [x for x in state_inputs(plan) if x.name.endswith(".w")]


def collectives(plan) -> Counter:
    return Counter((c.kind, c.part) for c in plan.collectives)


# --- the solver picks ZeRO to fit ------------------------------------------------------------------


@pytest.mark.slow
def test_solver_picks_zero_3_to_fit_a_limit_that_no_other_stage_meets_and_trains_like_one_device():
    args = example()
    P = param_bytes(args[0])
    limit = 2 * P  # the Adam state alone: no replicated copy of it fits
    replicated = par(zero=0).plan(*args)
    assert replicated.memory.peak_bytes[0] > 3 * limit  # params, Adam state, gradients and the update's values
    for stage in (0, 1, 2):  # every stage below 3 keeps whole parameters (and gathers the updated ones)
        with pytest.raises(PlanError) as err:
            par(zero=stage, memory_limit=limit).plan(*args)
        assert err.value.min_memory_bytes > limit
    pf = par(memory_limit=limit)
    plan = pf.plan(*args)
    assert plan.memory.peak_bytes[0] <= limit
    stages = {x.name: x.zero for x in state_inputs(plan)}
    square = [x.name for x in weights(plan) if x.type.endswith("[256,256]")]  # 96% of the parameters
    assert len(square) == 15 and {stages[n] for n in square} == {3}, stages
    # ZeRO-3's collectives: the weights gathered before their use, the gradients reduce-scattered
    kinds = collectives(plan)
    assert kinds[("all_gather", "forward")] >= 5 and kinds[("all_gather", "backward")] >= 5
    assert kinds[("reduce_scatter", "update")] >= 5
    assert sum(x.zero_saved_bytes for x in state_inputs(plan)) > P
    assert_trains_like_one_device(pf, args, steps=3)


def test_the_memory_model_matches_what_the_devices_hold_for_each_stage():
    args = example()
    flat = flatten(args)[0]
    measured = {}
    for stage in (0, 1, 2, 3):
        compiled = par(zero=stage).compile(*args)
        compiled.executable.run_flat(flat, profile=True)
        measured[stage] = max(p["peak_bytes"] for p in compiled.executable.last_profile.values())
        predicted = compiled.plan.memory.peak_bytes[0]
        # the runtime adds a little (its buffer pool, a redistribution's copy in flight); ZeRO-3
        # without a gather per use would hold 1.17 times its prediction
        assert 0.9 * predicted <= measured[stage] <= 1.12 * predicted, (stage, measured[stage], predicted)
    assert measured[3] < 0.6 * measured[2] and measured[2] < 0.6 * measured[0]


# --- forced stages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [1, pytest.param(2, marks=pytest.mark.slow), 3])
def test_a_forced_stage_is_planned_as_asked_and_trains_like_one_device(stage):
    args = example()
    pf = par(zero=stage)
    plan = pf.plan(*args)
    split = {x.name: any(p.is_split for p in x.spec) for x in state_inputs(plan)}
    assert {x.zero for x in state_inputs(plan)} == {stage}
    assert all(split[x.name] for x in state_inputs(plan) if x.name.startswith("%opt_state"))
    assert all(split[x.name] == (stage == 3) for x in state_inputs(plan) if x.name.startswith("%params"))
    kinds = collectives(plan)
    gradient_all_reduces = kinds[("all_reduce", "update")]
    if stage == 1:  # gradients all-reduced whole, the updated parameters gathered
        assert gradient_all_reduces >= 14 and kinds[("reduce_scatter", "update")] == 0
        assert kinds[("all_gather", "update")] >= 14
    else:  # gradients reduce-scattered (the first layer's may be made whole: its batch is 64 features
        # wide; at stage 2 the last layer's too, its logits gathered so that the loss, whose
        # all-reduce is priced alone, is computed whole)
        assert gradient_all_reduces == 0 and kinds[("reduce_scatter", "update")] >= 11
    if stage == 2:
        assert kinds[("all_gather", "update")] >= 14
    if stage == 3:  # no updated parameter is gathered; every use gathers it
        assert kinds[("all_gather", "update")] == 0 and kinds[("all_gather", "backward")] >= 5
    assert_trains_like_one_device(pf, args, steps=2)


def test_zero_2_reduce_scatters_each_gradient_where_it_is_made_and_zero_3_gathers_per_use():
    args = example()
    for stage in (2, 3):
        program = par(zero=stage).compile(*args).program.devices[0].graph
        nodes = program.nodes
        made_at = {o: k for k, n in enumerate(nodes) for o in n.outputs}
        readers: dict = {}
        for k, n in enumerate(nodes):
            for v in n.inputs:
                readers.setdefault(v, []).append(k)
        scatters = [k for k, n in enumerate(nodes) if n.op.name == "reduce_scatter"]
        assert len(scatters) >= 11  # see the forced stages above
        for k in scatters:  # right after the backward node that makes the gradient
            assert made_at[nodes[k].inputs[0]] >= k - 2, nodes[k]
        gathers = [n for n in nodes if n.op.name == "all_gather" and n.inputs[0] in program.inputs]
        if stage == 3:  # one gathered copy per reader: each is freed after its one use
            # the 14 parameters for the forward, the 6 weights again for the backward (no gradient
            # flows out of layer 0)
            assert len(gathers) == 14 + 6
            assert all(len(readers[n.outputs[0]]) == 1 for n in gathers)
        else:
            assert not gathers


def test_a_forced_stage_that_cannot_fit_names_the_smallest_memory_it_needs():
    args = example()
    P = param_bytes(args[0])
    with pytest.raises(PlanError, match="smallest per-device memory") as err:
        par(zero=1, memory_limit=2 * P).plan(*args)
    need = err.value.min_memory_bytes
    assert need > 2 * P and str(need) in str(err.value)
    plan = par(zero=1, memory_limit=need).plan(*args)  # the number is right: that much fits
    assert plan.memory.peak_bytes[0] <= need
    assert {x.zero for x in state_inputs(plan)} == {1}


def test_bad_zero_values_and_a_mesh_without_a_data_axis_are_plan_errors():
    args = example(sizes=(8, 16, 4), batch=8)
    with pytest.raises(PlanError, match="zero must be one of"):
        par(zero=4)
    with pytest.raises(PlanError, match="data-parallel axis"):
        graphc.parallelize(train_step, mesh="tp=2", cache=False, zero=2).plan(*args)


# --- left to the solver ----------------------------------------------------------------------------


def test_without_a_limit_the_solver_shards_only_the_updates_that_pay_for_it():
    # The update is elementwise work over the parameters and the Adam state: sharded along dp
    # each device does a quarter of it, and a reduce-scatter plus an all-gather move what one
    # all-reduce moves. So for the 256 x 256 weights ZeRO is cheaper even without a limit; for
    # the biases (1 KiB) the fixed cost of two more collectives is not worth a quarter of a
    # tiny update, and they stay replicated, their gradients in one all-reduce bucket.
    args = example()
    auto = par().plan(*args)
    off = par(zero=0).plan(*args)
    assert auto.cost.total_s < off.cost.total_s
    stages = {x.name: x.zero for x in state_inputs(auto)}
    big = [n for n in stages if n.endswith(".w") and "layers.0." not in n and "layers.6." not in n]
    assert all(stages[n] >= 2 for n in big), stages
    assert all(stages[n] == 0 for n in stages if n.endswith(".b")), stages


def test_zero_3_state_stays_on_the_devices_between_steps_with_sharded_state():
    args = example()
    pf = par(zero=3, sharded_state=True)
    params, state, losses = parallel_steps(pf, args, 3)
    leaves = flatten((params, state["m"], state["v"]))[0]
    assert all(isinstance(a, graphc.ShardedArray) and any(p.is_split for p in a.spec) for a in leaves)
    want_p, _want_s, want_losses = one_device_steps(args, 3)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
    for got, want in zip(flatten(params)[0], flatten(want_p)[0]):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9, atol=1e-12)


# --- the plan document and the command line --------------------------------------------------------


def test_plan_json_and_summary_show_each_inputs_stage_and_what_it_saves():
    args = example()
    plan = par(zero=2).plan(*args)
    doc = json.loads(plan.to_json())
    entries = {d["name"]: d for d in doc["inputs"]}
    assert all("zero" in d and "zero_saved_bytes" in d for d in doc["inputs"])
    w = entries["%opt_state.m.layers.1.w"]
    assert w["zero"] == 2 and w["zero_saved_bytes"] == 256 * 256 * 8 * 3 // 4
    p = entries["%params.layers.1.w"]  # replicated itself; saves its gradient's three quarters
    assert p["zero"] == 2 and p["zero_saved_bytes"] == 256 * 256 * 8 * 3 // 4
    assert entries["%x"]["zero"] == 0
    again = graphc.Plan.from_json(plan.to_json())
    assert [(x.zero, x.zero_saved_bytes) for x in again.inputs] == [(x.zero, x.zero_saved_bytes) for x in plan.inputs]
    assert "ZeRO: stage 2: 42 state input(s)" in plan.summary()
    assert "ZeRO stage 2 (saves 384.00 KiB per device)" in plan.explain("%params.layers.1.w")


MODEL = """
import numpy as np
import graphc
from tests.passes.sharding.test_zero import train_step, example

def example_args():
    return example(sizes=(32, 64, 64, 8), batch=32), {}
"""


def test_compile_zero_flag_forces_the_stage_and_explain_shows_it(tmp_path):
    model = tmp_path / "zmodel.py"
    model.write_text(MODEL)
    out = tmp_path / "plan.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "graphc", "compile", f"{model}:train_step", "--mesh", "dp=4", "--no-cache"]
    res = subprocess.run(
        [*cmd, "--zero", "3", "-o", str(out), "--explain", "%params.layers.1.w", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "ZeRO stage 3" in res.stdout and "ZeRO: stage 3" in res.stdout
    doc = json.loads(out.read_text())
    assert {d["zero"] for d in doc["inputs"] if d["name"].startswith("%opt_state.m")} == {3}
    assert doc["options"]["zero"] == 3
    bad = subprocess.run([*cmd, "--zero", "5"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert bad.returncode != 0 and "--zero" in bad.stderr


# --- MPI: the same programs, one process per device -------------------------------------------------

needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="the MPI backend needs mpi4py and mpiexec: pip install -e '.[mpi]'",
)


def mpi_job(out: str) -> None:
    """Every rank: two ZeRO-3 steps on dp=4 under MPI, state passed back as ShardedArrays; rank
    0 writes the gathered results to ``out``."""
    args = example(sizes=(32, 64, 64, 8), batch=32)
    pf = graphc.parallelize(train_step, mesh=Mesh("dp=4", profile=DEFAULT), cache=False, zero=3, backend="mpi")
    params, state, _loss = pf(*args)
    params, state, loss = pf(params, state, args[2], args[3])
    whole = [x.gather(0) for x in flatten((params, state, loss))[0]]
    if pf.world.rank == 0:
        assert all(x.zero == 3 for x in pf.compile(*args).plan.inputs if x.name.startswith("%opt_state.m"))
        np.savez(out, *whole)
    print(f"ok {pf.world.rank}", flush=True)


@pytest.mark.long  # 15 s loaded; tests/models/test_unseen_runtime.py runs ZeRO-3 under MPI in the full run
@needs_mpi
def test_zero_3_under_mpi_equals_one_device(tmp_path):
    out = tmp_path / "out.npz"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env["GRAPHC_CACHE_DIR"] = cache_of_its_own(tmp_path / "cache")
    res = subprocess.run(
        [str(mpiexec_path()), "-n", "4", sys.executable, os.path.abspath(__file__), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(re.findall(r"ok (\d)", res.stdout)) == ["0", "1", "2", "3"], res.stdout  # lines may interleave
    params, state, losses = one_device_steps(example(sizes=(32, 64, 64, 8), batch=32), 2)
    got = np.load(out)
    want = flatten((params, state, np.float64(losses[-1])))[0]
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[f"arr_{k}"], w, rtol=1e-9, atol=1e-12)


if __name__ == "__main__":  # a rank of test_zero_3_under_mpi_equals_one_device
    mpi_job(sys.argv[1])


def test_a_problems_parameter_groups_are_made_once_and_are_param_groups():
    """``problem_groups``: the groups ``param_groups`` finds for the problem's state and update,
    made by the first to ask (the offload candidates, the plan's ZeRO report) and handed out as
    a list of one's own."""
    from graphc.passes.partition import build_problem, state_ties
    from graphc.passes.sharding import zero
    from graphc.passes.sharding.roles import update_nodes

    pf = par()
    graph = pf.trace_optimized(*example())[1]
    problem = build_problem(graph, pf.mesh, pf.options, ties=state_ties(graph))
    want = zero.param_groups(graph, zero.state_positions(problem), update_nodes(graph))
    assert sum(g.param is not None and len(g.states) == 2 for g in want) == 2 * (len(SIZES) - 1)  # w and b
    first = zero.problem_groups(problem)
    assert first == want
    first.clear()
    assert zero.problem_groups(problem) == want
    assert zero.problem_update(problem) is zero.problem_update(problem) == update_nodes(graph)
