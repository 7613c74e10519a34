"""Micro-batched steps keep the memory their plans predict (issue 30 item 4, issue 29 item 1).

Gradient accumulation:
the measured peak of a step run as k micro-batches (runtime/pipeline.py's profile: the inputs
and values a device holds between tasks, the running task's own, the free buffers of its pool)
is within 10% of the plan's predicted peak (passes/microbatch.py's AccumulatingMemory), for k =
1, 2, 4, on one device, dp=2, tp=2 and dp=2 x tp=2, with SGD and Adam, and under a memory limit
(never above the limit by more than the documented 5% slack: docs/remat.md).

Before the fixes the runtime held every micro-batch's forward values through its backward task,
one buffer pool per task and copies of parameters passed between tasks (up to twice the
prediction); Adam's ``b1 * m`` (optimizer state only) ran in every micro-batch's forward task and
was held to the update (1.45x on the GPT step); a task's constants were held all task long where
the model had them live for one node; the profile left out the optimizer state a task does not
read.

Pipelines (pp=2, alone and with dp=2 or tp=2 in each stage): each stage's measured peak is within
10% of its predicted one (passes/pipeline.py ``_stage_memory``, which walks the stage's tasks in
the schedule's order); a limit below it is refused, naming the stage. The estimate before (state,
running sums, activations in flight; the rest shared evenly over a stage's devices) measured up
to 1.9x, and 2x with dp in the stage."""

import numpy as np
import pytest

import graphc
from graphc.core.errors import MemoryLimitError
from graphc.core.mesh import Mesh
from graphc.core.traits import Constant
from graphc.interpreter import bind_arguments
from graphc.models import gpt, mlp
from graphc.passes.microbatch import AccumulatingMemory, meeting_nodes, microbatch
from graphc.passes.options import PlanOptions
from graphc.passes.partition import Pins, build_problem, optimize_for_planning, state_ties

MESHES = [{"dp": 1}, {"dp": 2}, {"tp": 2}, {"dp": 2, "tp": 2}]
IDS = ["one-device", "dp=2", "tp=2", "dp=2,tp=2"]
SLACK = 1.05  # the pool's documented slack over a limit (docs/remat.md; tests/passes/test_recompute_segments.py)


def _peaks(fn, args, kw, mesh, k, static=(), **options):
    """(predicted, measured) peak bytes of the fullest device and the plan, on the first profiled
    run after compiling (an empty pool: the run whose allocations show the plan's peak)."""
    pf = graphc.parallelize(fn, mesh=mesh, microbatches=k, cache=False, static_argnames=static, **options)
    compiled = pf.compile(*args, **kw)
    dyn, dkw, _ = pf.split_static(args, kw)
    compiled.executable.run_flat(bind_arguments(compiled.graph, dyn, dkw), profile=True)
    measured = max(p["peak_bytes"] for p in compiled.executable.last_profile.values())
    plan = compiled.plan
    predicted = plan.peak_bytes if k > 1 else max(plan.memory.held)
    return predicted, measured, plan


def mlp_adam_step(params, opt_state, x, labels, lr=0.01):
    # one Adam step on the MLP's cross-entropy: returns (params, opt_state, loss before the step)
    loss, grads = graphc.value_and_grad(mlp.loss)(params, x, labels)
    params, opt_state = graphc.optim.adam(params, grads, opt_state, lr=lr)
    return params, opt_state, loss


def gpt_sgd_step(params, tokens, targets, n_head, lr=0.1):
    loss, grads = graphc.value_and_grad(gpt.lm_loss)(params, tokens, targets, n_head)
    return graphc.optim.sgd(params, grads, lr), loss


def mlp_case(optimizer):
    (params, x, labels), kw = mlp.example_train_args(batch=4096)  # activations outweigh the parameters
    if optimizer == "sgd":
        return mlp.train_step, (params, x, labels), kw
    return mlp_adam_step, (params, graphc.optim.adam_init(params), x, labels), kw


def gpt_case(optimizer):
    (params, state, tokens, targets), kw = gpt.example_train_args(batch=4, seq=64, d=64, n_layer=2, n_head=4)
    if optimizer == "sgd":
        return gpt_sgd_step, (params, tokens, targets), kw
    return gpt.train_step, (params, state, tokens, targets), kw


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 4])
@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_an_accumulated_mlp_step_measures_its_predicted_peak(mesh, k, optimizer):
    fn, args, kw = mlp_case(optimizer)
    predicted, measured, _plan = _peaks(fn, args, kw, mesh, k)
    assert 0.9 * predicted <= measured <= 1.1 * predicted, (measured, predicted)


def test_accumulating_lowers_the_measured_peak():
    """The point of accumulating: four micro-batches measure about a quarter of the activations."""
    args, kw = mlp.example_train_args(batch=4096)
    _p1, whole, _ = _peaks(mlp.train_step, args, kw, {"dp": 2}, 1)
    _p4, four, _ = _peaks(mlp.train_step, args, kw, {"dp": 2}, 4)
    assert four < 0.5 * whole


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer, k",
    [("adam", 2), ("adam", 4), ("sgd", 4)],
    ids=["adam-k=2", "adam-k=4", "sgd-k=4"],
)
@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_an_accumulated_gpt_step_measures_its_predicted_peak(mesh, k, optimizer):
    fn, args, kw = gpt_case(optimizer)
    predicted, measured, _plan = _peaks(fn, args, kw, mesh, k, ("n_head",))
    assert 0.9 * predicted <= measured <= 1.1 * predicted, (measured, predicted)


@pytest.mark.parametrize(
    "model, optimizer, mesh",
    [
        ("mlp", "sgd", {"tp": 2}),
        ("mlp", "adam", {"tp": 2}),
        ("mlp", "sgd", {"dp": 2, "tp": 2}),
        pytest.param("gpt", "adam", {"tp": 2}, marks=pytest.mark.long),  # ~1 min: the limited ILP
    ],
    ids=["mlp-sgd-tp=2", "mlp-adam-tp=2", "mlp-sgd-dp=2,tp=2", "gpt-adam-tp=2"],
)
def test_under_a_memory_limit_the_measured_peak_stays_near_the_prediction_and_the_limit(mesh, model, optimizer):
    """A limit below the free plan's peak (3% below, which these steps can meet by sharding more:
    the plan must give up something) is met by the plan; the run measures within 10% of the
    plan's prediction and at most the slack above the limit."""
    fn, args, kw = (mlp_case if model == "mlp" else gpt_case)(optimizer)
    static = ("n_head",) if model == "gpt" else ()
    free, _m, _plan = _peaks(fn, args, kw, mesh, 4, static)
    limit = int(0.97 * free)
    predicted, measured, plan = _peaks(fn, args, kw, mesh, 4, static, memory_limit=limit)
    assert predicted <= limit < free
    assert 0.9 * predicted <= measured <= 1.1 * predicted, (measured, predicted)
    assert measured <= SLACK * limit, (measured, limit)


def test_the_memory_model_holds_every_constant_all_run():
    """A device holds one copy of each constant, shared by all its tasks, all step long: the
    accumulating model keeps constants live at every position, like the one-pass model, and is
    otherwise the one-pass model with the running sums live all run."""
    (params, state, tokens, targets), kw = gpt.example_train_args(batch=4, seq=8, d=16, n_layer=1, n_head=2)
    g = optimize_for_planning(graphc.trace(gpt.train_step, params, state, tokens, targets, **kw))
    mb = microbatch(g, 2)
    g0 = mb.program.devices[0].graph
    problem = build_problem(g0, Mesh({"stage": 1}), PlanOptions(zero=0, recompute="off"), Pins(), state_ties(g))
    meets = set(meeting_nodes(g0))
    sums = frozenset(i for i, it in enumerate(problem.items) if it.kind == "node" and it.index in meets)
    acc = AccumulatingMemory(problem.memory, sums)
    end = acc.size - 1
    constants = {
        i
        for i, it in enumerate(problem.items)
        if it.kind == "node" and it.node is not None and it.node.op.has(Constant)
    }
    ranges = {i: (a, b) for _v, i, a, b in acc.live_ranges()}
    assert constants & ranges.keys()
    assert all(ranges[i] == (0, end) for i in constants & ranges.keys())
    assert {(i, a, b) for _v, i, a, b in problem.memory.live_ranges() if i not in sums} == {
        (i, a, b) for _v, i, a, b in acc.live_ranges() if i not in sums
    }


@pytest.mark.parametrize("mesh", [{"dp": 1}, {"dp": 2}], ids=["one-device", "dp=2"])
def test_a_devices_tasks_share_one_copy_of_each_constant(mesh):
    """The k forward and k backward tasks of a device (and its update) read one read-only array
    per distinct constant, not one copy each; counting every task's constant arrays (each memory
    block once) is what the profile counts, and the peak is within 10% of the prediction."""
    fn, args, kw = gpt_case("sgd")
    pf = graphc.parallelize(fn, mesh=mesh, microbatches=4, cache=False, static_argnames=("n_head",))
    compiled = pf.compile(*args, **kw)
    ex = compiled.executable
    dyn, dkw, _ = pf.split_static(args, kw)
    ex.run_flat(bind_arguments(compiled.graph, dyn, dkw), profile=True)
    for d in ex.comms:
        arrays = [c for (dev, _ph, _k), e in ex.executables.items() if dev == d for _s, c in e.program.constants]
        shared = 0
        for i, x in enumerate(arrays):
            assert not x.flags.writeable
            for y in arrays[i + 1 :]:
                same = x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                assert same == (x is y), (x.shape, x.dtype)  # equal constants are one array
                assert same or not np.shares_memory(x, y)
                shared += x is y
        assert shared >= 3  # the forward tasks' constants at least (the causal mask: 4 readers)
        blocks: dict[int, int] = {}
        for x in arrays:
            blocks[id(x)] = x.nbytes
        assert sum(blocks.values()) <= sum(c.nbytes for c in ex.constants[d].arrays())
    measured = max(p["peak_bytes"] for p in ex.last_profile.values())
    predicted = compiled.plan.peak_bytes
    assert 0.9 * predicted <= measured <= 1.1 * predicted, (measured, predicted)


# --- pipelines ------------------------------------------------------------------------------------


def _stage_peaks(fn, args, kw, mesh, k, schedule, static=(), **options):
    """(predicted, measured) peak bytes per stage: the plan's, and the fullest device of each
    stage on the first profiled run after compiling."""
    pf = graphc.parallelize(
        fn, mesh=mesh, microbatches=k, schedule=schedule, cache=False, static_argnames=static, **options
    )
    compiled = pf.compile(*args, **kw)
    dyn, dkw, _ = pf.split_static(args, kw)
    compiled.executable.run_flat(bind_arguments(compiled.graph, dyn, dkw), profile=True)
    prof = compiled.executable.last_profile
    plan = compiled.plan
    measured = [max(prof[d]["peak_bytes"] for d in plan.stage_devices(s)) for s in range(plan.n_stages)]
    return list(plan.memory_bytes), measured


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 4])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_pipeline_stage_measures_its_predicted_peak(optimizer, k, schedule):
    fn, args, kw = mlp_case(optimizer)
    predicted, measured = _stage_peaks(fn, args, kw, {"pp": 2}, k, schedule)
    for p, got in zip(predicted, measured):
        assert 0.9 * p <= got <= 1.1 * p, (predicted, measured)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(
    "mesh", [{"pp": 2}, {"pp": 2, "dp": 2}, {"pp": 2, "tp": 2}], ids=["pp=2", "pp=2,dp=2", "pp=2,tp=2"]
)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_gpt_pipeline_stage_measures_its_predicted_peak(optimizer, mesh, schedule):
    fn, args, kw = gpt_case(optimizer)
    predicted, measured = _stage_peaks(fn, args, kw, mesh, 4, schedule, ("n_head",))
    for p, got in zip(predicted, measured):
        assert 0.9 * p <= got <= 1.1 * p, (predicted, measured)


def test_a_pipeline_under_a_memory_limit_stays_under_it_or_is_refused():
    """At its predicted peak the pipeline plans and measures at most the slack above it; below it,
    the plan is refused, naming the stage whose tasks need more (the stage cut counts only state
    and activations: before, such a plan ran 28% over its limit on tests/passes/test_search.py's
    step)."""
    fn, args, kw = mlp_case("adam")
    predicted, _measured = _stage_peaks(fn, args, kw, {"pp": 2}, 4, "1f1b")
    limit = max(predicted)
    _p, measured = _stage_peaks(fn, args, kw, {"pp": 2}, 4, "1f1b", memory_limit=limit)
    assert max(measured) <= SLACK * limit, (measured, limit)
    stage = predicted.index(limit)
    with pytest.raises(MemoryLimitError, match=f"pipeline stage {stage} needs {limit:,} bytes per device at its peak"):
        _stage_peaks(fn, args, kw, {"pp": 2}, 4, "1f1b", memory_limit=limit - 1)
