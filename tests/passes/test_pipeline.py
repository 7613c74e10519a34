"""Pipeline parallelism (passes/pipeline.py, runtime/pipeline.py): stages, schedules, and the
threaded runtime against eager numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphc
from graphc.core.errors import MemoryLimitError
from graphc.core.profile import MachineProfile
from graphc.core.pytree import flatten
from graphc.interpreter import bind_arguments
from graphc.models import gpt, mlp
from graphc.passes.partition import optimize_for_planning
from graphc.passes.pipeline import PipelinePlan, assign_stages, schedule_tasks
from graphc.passes.sharding.records import MFU_FORMULA
from tests.helpers import pipeline_executable, quick_share

PROFILE = MachineProfile.default()


def graph_of(fn, args, kw):
    return optimize_for_planning(graphc.trace(fn, *args, **kw))


def gpt_step():
    args, kw = gpt.example_train_args(batch=8)
    n_head = kw.pop("n_head")

    def step(params, state, tokens, targets, lr):
        return gpt.train_step(params, state, tokens, targets, n_head, lr)

    return step, args, kw


def run_pipeline(fn, args, kw, stages, m, schedule, profile=False):
    g = graph_of(fn, args, kw)
    pe = pipeline_executable(g, stages, m, schedule, PROFILE, timeout_s=30)
    return pe, pe.run_flat(bind_arguments(g, args, kw), profile=profile)


def assert_matches(got, want):
    want = flatten(want)[0]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    "stages, m", quick_share([(2, 1), (2, 4), (2, 8), (4, 1), (4, 4), (4, 8)], every=3, several=True)
)
def test_mlp_train_step(stages, m, schedule):
    args, kw = mlp.example_train_args(batch=16)
    _pe, got = run_pipeline(mlp.train_step, args, kw, stages, m, schedule)
    assert_matches(got, mlp.train_step(*args, **kw))


@pytest.mark.parametrize(
    "stages, m, schedule",
    [(2, 1, "1f1b")]
    + [
        pytest.param(*case, marks=pytest.mark.slow)
        for case in [(2, 4, "1f1b"), (2, 8, "gpipe"), (4, 4, "gpipe"), (4, 8, "1f1b")]
    ],
)
def test_gpt_train_step(stages, m, schedule):
    step, args, kw = gpt_step()
    _pe, got = run_pipeline(step, args, kw, stages, m, schedule)
    assert_matches(got, step(*args, **kw))


def test_k_steps_equal_eager_steps():
    args, kw = mlp.example_train_args(batch=16)
    g = graph_of(mlp.train_step, args, kw)
    pe = pipeline_executable(g, 2, 4, "1f1b", PROFILE)
    params, x, labels = args
    eager = params
    flat = bind_arguments(g, args, kw)
    n_state = len(flatten(params)[0])
    for _ in range(3):
        outs = pe.run_flat(flat)
        flat = outs[:n_state] + flat[n_state:]
        eager, _loss = mlp.train_step(eager, x, labels, **kw)
    for a, b in zip(flat[:n_state], flatten(eager)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, m", [(1, 1), (2, 3), (4, 8), (4, 2)])
def test_schedules(schedule, stages, m):
    for s in range(stages):
        tasks = schedule_tasks(schedule, stages, m, s)
        assert tasks[-1] == ("U", -1)
        body = tasks[:-1]
        assert sorted(body) == sorted([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
        live, most = set(), 0
        for ph, k in body:
            if ph == "F":
                live.add(k)
            else:
                assert k in live, "a backward before its forward"
                live.remove(k)
            most = max(most, len(live))
        assert most == (m if schedule == "gpipe" else min(m, stages - s))


@pytest.mark.parametrize("stages", [2, 4])
def test_data_flows_forward_along_the_stage_line(stages):
    """On the line F0 .. F(S-1) B(S-1) .. B0, every edge between forward/backward nodes goes
    forward (no stage waits for a later position of a micro-batch)."""
    from graphc.passes.microbatch import microbatch

    step, args, kw = gpt_step()
    mb = microbatch(graph_of(step, args, kw), 2)
    g = mb.program.devices[0].graph
    a = assign_stages(g, mb.step_phase, stages, PROFILE)
    pos = {}
    for k, n in enumerate(g.nodes):
        if a.phase[k] in ("F", "B"):
            p = a.stage[k] if a.phase[k] == "F" else 2 * stages - 1 - a.stage[k]
            for o in n.outputs:
                pos[o] = p
            for v in n.inputs:
                assert pos.get(v, -1) <= p, f"{n.op.name} at {n.loc}"
    assert {a.stage[k] for k in range(len(g.nodes)) if a.phase[k] == "F"} == set(range(stages))
    assert all(t > 0 for t in a.forward_s)


def test_memory_limit_needs_two_stages():
    """Each layer's weights fit a device, the whole model does not: one stage is refused with
    the memory the step needs, two stages are found."""
    from graphc.passes.microbatch import microbatch

    args, kw = mlp.example_train_args(batch=8, sizes=(512, 512, 512, 8))
    mb = microbatch(graph_of(mlp.train_step, args, kw), 2)
    g = mb.program.devices[0].graph
    whole = sum(v.type.nbytes for v in g.inputs)
    limit = int(whole * 0.75)
    with pytest.raises(MemoryLimitError, match="no cut of the step into 1 pipeline stages fits"):
        assign_stages(g, mb.step_phase, 1, PROFILE, memory_limit=limit)
    a = assign_stages(g, mb.step_phase, 2, PROFILE, memory_limit=limit)
    assert all(b <= limit for b in a.state_bytes)


def test_a_stage_cut_refused_on_a_sub_mesh_names_the_limit_per_device():
    """On pp=2 x dp=2 a stage's memory is shared by its 2 devices, and the cut is sized against
    2 x the limit; refused, it names the limit the user gave per device, not the stage's (it used
    to say "the memory limit of 2 x L bytes per device")."""
    args, kw = mlp.example_train_args(batch=8, sizes=(512, 512, 512, 8))
    limit = 2**18  # one [512, 512] float32 weight is 1 MiB: no cut fits
    pf = graphc.parallelize(mlp.train_step, mesh={"pp": 2, "dp": 2}, microbatches=2, memory_limit=limit, cache=False)
    with pytest.raises(MemoryLimitError, match="no cut of the step into 2 pipeline stages") as err:
        pf.compile(*args, **kw)
    assert f"memory limit of {limit:,} bytes per device" in str(err.value), str(err.value)
    assert "over each stage's 2 devices" in str(err.value)


def test_1f1b_holds_fewer_activations_than_gpipe():
    """Measured by the runtime: stage 0 of 2 holds 2 micro-batches' activations under 1F1B, all 8
    under GPipe (a batch-heavy step, so activations dominate its peak)."""
    args, kw = mlp.example_train_args(batch=1024, sizes=(32, 128, 128, 10))
    held, peak = {}, {}
    for schedule in ("gpipe", "1f1b"):
        pe, got = run_pipeline(mlp.train_step, args, kw, 2, 8, schedule, profile=True)
        assert_matches(got, mlp.train_step(*args, **kw))
        held[schedule] = pe.last_profile[0]["held_bytes"]
        peak[schedule] = pe.last_profile[0]["peak_bytes"]
    assert held["1f1b"] < 0.5 * held["gpipe"]
    assert peak["1f1b"] < peak["gpipe"]


def test_failing_stage_names_its_device_and_line():
    step, args, kw = gpt_step()
    params, state, tokens, targets = args
    g = graph_of(step, args, kw)
    pe = pipeline_executable(g, 2, 2, "1f1b", PROFILE, timeout_s=10)
    bad = tokens.copy()
    bad[5, 3] = 10_000  # out of the vocabulary
    with pytest.raises(IndexError, match=r"device 0 \(mesh \{'pp': 0\}\).*gpt\.py:\d+"):
        pe.run_flat(bind_arguments(g, (params, state, bad, targets), kw))


# --- graphc.parallelize on meshes with a pp axis: k steps equal k eager steps ---------------------

MESHES = [{"pp": 2}, {"pp": 4}, {"pp": 2, "dp": 2}, {"pp": 2, "tp": 2}, {"pp": 2, "dp": 2, "tp": 2}]


def k_steps(step, params, rest, kw, k, n_state=1):
    """``k`` steps feeding the first ``n_state`` results back as the first arguments."""
    state = params
    for _ in range(k):
        out = step(*state, *rest, **kw)
        state = out[:n_state]
    return state


def assert_trees_close(a, b):
    for x, y in zip(flatten(a)[0], flatten(b)[0]):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", quick_share([1, 4, 8], every=3))
@pytest.mark.parametrize("axes", MESHES, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
def test_parallelize_mlp_pipeline_steps(axes, m):
    (params, x, labels), kw = mlp.example_train_args(batch=32, sizes=(24, 32, 32, 8))
    pf = graphc.parallelize(
        mlp.train_step, mesh=graphc.Mesh(axes, profile=PROFILE), microbatches=m, static_argnames=("lr",), cache=False
    )
    got = k_steps(pf, (params,), (x, labels), kw, 2)
    want = k_steps(mlp.train_step, (params,), (x, labels), kw, 2)
    assert_trees_close(got, want)


# the quick profile (-m "not slow"): one micro-batch on pp=2 and on pp=4
@pytest.mark.parametrize("m", [1, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "axes",
    [a if len(a) == 1 else pytest.param(a, marks=pytest.mark.slow) for a in MESHES],
    ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()),
)
def test_parallelize_gpt_pipeline_steps(axes, m):
    (params, state, tokens, targets), kw = gpt.example_train_args(batch=8)
    pf = graphc.parallelize(
        gpt.train_step,
        mesh=graphc.Mesh(axes, profile=PROFILE),
        microbatches=m,
        static_argnames=("n_head", "lr"),
        cache=False,
    )
    got = k_steps(pf, (params, state), (tokens, targets), kw, 2, n_state=2)
    want = k_steps(gpt.train_step, (params, state), (tokens, targets), kw, 2, n_state=2)
    assert_trees_close(got, want)
    compiled = pf.compile(params, state, tokens, targets, **kw)
    assert "stage 1" in compiled.plan.summary()
    assert compiled.ir("tasks").count("graph @") >= 2 * axes["pp"]


@pytest.mark.parametrize("mesh", [{"pp": 2}, {"dp": 2}, {"pp": 2, "dp": 2}])
def test_a_pipeline_or_accumulation_plan_states_its_whole_steps_mfu(mesh):
    """A pipeline or gradient accumulation plan gives the MFU of its whole step (every
    micro-batch, the bubble, the update), not only its micro-batch program's: the step's model
    flops are the one-device plan's, over the plan's step time, devices and peak; the JSON states
    the formula, and reads back."""
    args, kw = mlp.example_train_args(batch=16)
    plan = graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=4, cache=False).plan(*args, **kw)
    whole = graphc.parallelize(mlp.train_step, mesh={"dp": 1}, cache=False).plan(*args, **kw)
    m = plan.mfu
    assert m.model_flops == whole.cost.model_flops and m.peak_dtype == whole.cost.peak_dtype == "float32"
    assert m.step_s == plan.step_s and m.devices == plan.mesh.size and m.peak_flops == PROFILE.matmul_rate("float32")
    assert m.value == pytest.approx(m.model_flops / (plan.step_s * plan.mesh.size * m.peak_flops), rel=1e-12)
    doc = json.loads(plan.to_json())
    assert doc["mfu"]["formula"] == MFU_FORMULA and doc["mfu"]["value"] == m.value
    assert json.loads(whole.to_json())["cost"]["mfu_formula"] == MFU_FORMULA
    assert PipelinePlan.from_json(plan.to_json()).mfu == m
    assert f"MFU {m.value:.1%} of the whole step" in plan.summary()


def test_one_micro_batch_runs_the_update_on_its_parameters_stages():
    """With one micro-batch nothing meets, yet the update is the step phase all the same: it runs
    once, after the backward, on its parameters' stages, as with more micro-batches. It used to
    run in the backward tasks wherever its operands were, so Adam's state-only values crossed the
    stages (on this GPT at pp=2: 13x the stage transfers of two micro-batches). Only activations
    cross now: twice two micro-batches' (the whole batch is one micro-batch). Equal to one device."""
    args, kw = gpt.example_train_args(batch=4, seq=8, d=32, n_layer=4)
    plans = {}
    for m in (1, 2):
        pf = graphc.parallelize(
            gpt.train_step, mesh={"pp": 2}, microbatches=m, cache=False, static_argnames=("n_head", "lr")
        )
        compiled = pf.compile(*args, **kw)
        plans[m] = compiled.plan
        got, want = flatten(pf(*args, **kw))[0], flatten(gpt.train_step(*args, **kw))[0]
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        g0 = compiled.mb.program.devices[0].graph
        update = [k for k, n in enumerate(g0.nodes) if n.part == "update" and n.op.name != "all_reduce"]
        assert update and all(compiled.plan.assignment.phase[k] == "U" for k in update)
    assert plans[1].transfer_s <= 2.05 * plans[2].transfer_s, (plans[1].transfer_s, plans[2].transfer_s)
