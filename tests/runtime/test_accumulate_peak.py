"""Gradient accumulation keeps the memory its plan predicts (issue 30 item 4, issue 29 item 1):
the measured peak of a step run as k micro-batches (runtime/pipeline.py's profile: the values a
device holds between tasks, the running task's own, the free buffers of its pool) is within 10%
of the plan's predicted peak (passes/microbatch.py's AccumulatingMemory), on one device and on
dp=2, for k = 1, 2, 4. Before the fix the runtime held every micro-batch's forward values through
its backward task, one buffer pool per task and copies of parameters passed between tasks: up to
twice the prediction."""

import pytest

import graphc
from graphc.interpreter import bind_arguments
from graphc.models import gpt, mlp


def _peaks(fn, args, kw, mesh, k, static=()):
    """(predicted, measured) peak bytes of the fullest device, on the first profiled run after
    compiling (an empty pool: the run whose allocations show the plan's peak)."""
    pf = graphc.parallelize(fn, mesh=mesh, microbatches=k, cache=False, static_argnames=static)
    compiled = pf.compile(*args, **kw)
    dyn, dkw, _ = pf.split_static(args, kw)
    compiled.executable.run_flat(bind_arguments(compiled.graph, dyn, dkw), profile=True)
    measured = max(p["peak_bytes"] for p in compiled.executable.last_profile.values())
    plan = compiled.plan
    predicted = plan.peak_bytes if k > 1 else max(plan.memory.held)
    return predicted, measured


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("mesh", [{"dp": 1}, {"dp": 2}], ids=["one-device", "dp=2"])
def test_an_accumulated_mlp_step_measures_its_predicted_peak(mesh, k):
    args, kw = mlp.example_train_args(batch=4096)  # activations outweigh the parameters
    predicted, measured = _peaks(mlp.train_step, args, kw, mesh, k)
    assert 0.9 * predicted <= measured <= 1.1 * predicted, (measured, predicted)


def test_accumulating_lowers_the_measured_peak():
    """The point of accumulating: four micro-batches measure about a quarter of the activations."""
    args, kw = mlp.example_train_args(batch=4096)
    _p1, whole = _peaks(mlp.train_step, args, kw, {"dp": 2}, 1)
    _p4, four = _peaks(mlp.train_step, args, kw, {"dp": 2}, 4)
    assert four < 0.5 * whole


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("mesh", [{"dp": 1}, {"dp": 2}], ids=["one-device", "dp=2"])
def test_an_accumulated_gpt_step_measures_near_its_predicted_peak(mesh, k):
    # 15%, not 10%: state-only optimizer values (Adam's b1 * m) run in every micro-batch's forward
    # task and are held to the update, where the model places them (a known gap, docs/remat.md)
    args, kw = gpt.example_train_args(batch=4, seq=256, d=64, n_layer=2, n_head=4)
    predicted, measured = _peaks(gpt.train_step, args, kw, mesh, k, ("n_head",))
    assert 0.85 * predicted <= measured <= 1.15 * predicted, (measured, predicted)
