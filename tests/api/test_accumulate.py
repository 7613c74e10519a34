"""Gradient accumulation on any mesh (passes/accumulate.py): ``microbatches=k`` without a pp axis
runs a training step written for the whole batch as k micro-batches, one after the other, each
sharded on the mesh, the gradients summed in micro-batch order, then one update. Several steps
with the state fed back equal the eager step on the whole batch; data-parallel gradient
all-reduces run once per step; the plan predicts a lower peak than one pass; counts a step
cannot take are errors naming the function."""

from __future__ import annotations

import dataclasses
import json
import linecache
import os
import re
import warnings

import numpy as np
import pytest

import graphc
from graphc.core.errors import GraphcError, PlanError, PlanWarning
from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.core.pytree import flatten
from graphc.models import gpt, mlp
from graphc.passes.accumulate import plan_accumulated
from graphc.passes.options import PlanOptions
from graphc.passes.partition import optimize_for_planning, plan_sharding, state_ties
from graphc.passes.pipeline import PipelinePlan
from tests.helpers import cache_of_its_own
from tests.helpers import graphc_cli as call

PROFILE = get_profile("cpu-here")
F32 = np.finfo(np.float32).eps
# float32 results of a different summation order: the micro-batches' partial sums and the devices'
# pieces regroup every batch reduction and matmul contraction (at most a few hundred terms here).
# Regrouping n terms moves a sum by at most about n * eps of the sum of their magnitudes; a few
# steps of SGD / Adam carry that into the parameters. 2**10 * eps ~ 1.2e-4 bounds it for these sizes.
TOL = 2**10 * F32


def k_steps(step, state: tuple, rest: tuple, kw: dict, k: int) -> list:
    """``k`` training steps, each fed the state the last returned; every step's leaves."""
    seen = []
    for _ in range(k):
        out = step(*state, *rest, **kw)
        state = tuple(out[: len(state)])
        seen.append(flatten(out)[0])
    return seen


def assert_steps_close(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=TOL, atol=TOL)


def mlp_args(batch=32):
    return mlp.example_train_args(batch=batch, sizes=(24, 32, 32, 8))


MESHES = [{"dp": 2}, {"tp": 2}, {"dp": 2, "tp": 2}, {"dp": 1}]


@pytest.mark.parametrize("axes", MESHES, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
def test_mlp_trains_with_micro_batches_as_on_the_whole_batch(axes):
    (params, x, labels), kw = mlp_args()
    pf = graphc.parallelize(
        mlp.train_step, mesh=Mesh(axes, profile=PROFILE), microbatches=4, static_argnames=("lr",), cache=False
    )
    got = k_steps(pf, (params,), (x, labels), kw, 3)
    assert_steps_close(got, k_steps(mlp.train_step, (params,), (x, labels), kw, 3))
    compiled = pf.compile(params, x, labels, **kw)
    assert isinstance(compiled.plan, PipelinePlan) and compiled.plan.accumulates
    assert (compiled.plan.m, compiled.plan.microbatch_size) == (4, 8)
    assert "gradient accumulation" in compiled.plan.summary() and "4 micro-batches of 8 samples" in (
        compiled.plan.summary()
    )
    # k forward and k backward tasks per device, one update
    for dev in range(Mesh(axes).size):
        keys = [key for key in compiled.program.tasks if key[0] == dev]
        assert sorted(k for _d, ph, k in keys if ph == "F") == [0, 1, 2, 3]
        assert sorted(k for _d, ph, k in keys if ph == "B") == [0, 1, 2, 3]
        assert [k for _d, ph, k in keys if ph == "U"] == [-1]


def test_a_compile_micro_batches_the_step_once_and_a_given_plan_once_more(monkeypatch):
    """Planning's micro-batched step is the one the compiled step runs (micro-batching a GPT step
    is a fifth of its compile); a plan given to a new parallelize micro-batches its own graph."""
    import graphc.api.compiled as compiled_mod
    import graphc.passes.pipeline as pipeline_mod

    calls = []
    real = compiled_mod.microbatch
    for mod in (compiled_mod, pipeline_mod):  # wherever a step is micro-batched
        monkeypatch.setattr(mod, "microbatch", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    (params, x, labels), kw = mlp_args()
    pf = graphc.parallelize(mlp.train_step, mesh={"dp": 2}, microbatches=4, static_argnames=("lr",), cache=False)
    got = k_steps(pf, (params,), (x, labels), kw, 2)
    assert calls == [4]
    plan = pf.compile(params, x, labels, **kw).plan
    given = graphc.parallelize(mlp.train_step, mesh={"dp": 2}, plan=plan, static_argnames=("lr",))
    assert_steps_close(k_steps(given, (params,), (x, labels), kw, 2), got)
    assert calls == [4, 4]
    assert_steps_close(got, k_steps(mlp.train_step, (params,), (x, labels), kw, 2))


@pytest.mark.parametrize(
    "axes",
    [{"dp": 2}, *[pytest.param(a, marks=pytest.mark.slow) for a in ({"tp": 2}, {"dp": 2, "tp": 2}, {"dp": 1})]],
    ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()),
)
def test_gpt_trains_with_micro_batches_as_on_the_whole_batch(axes):
    (params, state, tokens, targets), kw = gpt.example_train_args(batch=8, seq=16, n_layer=1)
    pf = graphc.parallelize(
        gpt.train_step,
        mesh=Mesh(axes, profile=PROFILE),
        microbatches=4,
        static_argnames=("n_head", "lr"),
        cache=False,
    )
    got = k_steps(pf, (params, state), (tokens, targets), kw, 2)
    assert_steps_close(got, k_steps(gpt.train_step, (params, state), (tokens, targets), kw, 2))
    if axes == {"dp": 2}:  # one micro-batch's activations: a lower predicted peak than the whole batch's
        # (on sequences long enough that activations outweigh the gradient sums accumulation keeps
        # all step long: at seq=16 they do not, and accumulating needs more memory, not less)
        (params, state, tokens, targets), kw = gpt.example_train_args(batch=8, seq=64, n_layer=1)
        g = graph_of(gpt.train_step, (params, state, tokens, targets), kw)
        mesh = Mesh(axes, profile=PROFILE)
        whole = plan_sharding(g, mesh, ties=state_ties(g), options=PlanOptions(zero=0, recompute="off"))
        acc = plan_accumulated(g, mesh, PlanOptions(zero=0, recompute="off", microbatches=4))
        assert acc.peak_bytes < max(whole.memory.peak_bytes)


def test_data_parallel_gradients_are_summed_once_per_step_after_the_micro_batches():
    """Every all-reduce over dp is in the update task: the micro-batches' gradients are summed on
    each device first (partial sums carried through the meeting points), then synced once."""
    (params, x, labels), kw = mlp.example_train_args(batch=256, sizes=(128, 256, 256, 8))
    pf = graphc.parallelize(
        mlp.train_step, mesh=Mesh({"dp": 2}, profile=PROFILE), microbatches=4, static_argnames=("lr",), cache=False
    )
    compiled = pf.compile(params, x, labels, **kw)
    synced = {ph: 0 for ph in "FBU"}
    for (_dev, ph, _k), task in compiled.program.tasks.items():
        synced[ph] += sum(1 for n in task.graph.nodes if n.op.name == "all_reduce" and n.attrs["axis"] == "dp")
    n_params = len(flatten(params)[0])
    assert synced["F"] == synced["B"] == 0
    assert synced["U"] >= 2 * n_params  # each gradient on each of the 2 devices (and the loss)
    # the micro-batches' own work is split over dp: each device runs 32 of a micro-batch's 64 samples
    forward = compiled.program.tasks[(0, "F", 0)].graph
    assert any(v.type.shape[:1] == (32,) for v in forward.inputs)
    got = compiled(params, x, labels, **kw)
    for a, b in zip(flatten(got)[0], flatten(mlp.train_step(params, x, labels, **kw))[0]):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def graph_of(fn, args, kw):
    return optimize_for_planning(graphc.trace(fn, *args, **kw))


@pytest.mark.parametrize("axes", [{"dp": 2}, {"dp": 2, "tp": 2}], ids=["dp=2", "dp=2,tp=2"])
def test_micro_batches_predict_a_lower_peak_and_price_k_passes(axes):
    """One micro-batch's activations are a quarter of the batch's: the predicted peak drops; the
    predicted step is k passes of the micro-batch program plus one update and one gradient sync."""
    (params, x, labels), kw = mlp.example_train_args(batch=2048, sizes=(256, 512, 512, 8))
    g = graph_of(mlp.train_step, (params, x, labels), kw)
    mesh = Mesh(axes, profile=PROFILE)
    options = PlanOptions(zero=0, recompute="off")
    whole = plan_sharding(g, mesh, ties=state_ties(g), options=options)
    acc = plan_accumulated(g, mesh, PlanOptions(zero=0, recompute="off", microbatches=4))
    assert acc.peak_bytes < max(whole.memory.peak_bytes)
    # the peak is the micro-batch program's plan's, with the running sums kept all along: at least
    # one micro-batch's activations and the gradients' sums together
    assert acc.sub_plan is not None and acc.peak_bytes == max(acc.sub_plan.memory.peak_bytes)
    f, b, u = acc.stage_s[0]
    assert acc.step_s == pytest.approx(4 * (f + b) + u, rel=1e-12)
    # the update and the one gradient sync are priced once; a pass of a quarter of the batch is
    # cheaper than the whole batch's, and four of them cost at least as much compute
    one_pass = acc.sub_plan.cost.compute_s
    assert one_pass < whole.cost.compute_s <= acc.step_s
    doc = json.loads(acc.to_json())
    assert doc["options"]["microbatches"] == 4 and doc["microbatch_size"] == 512


def sum_loss_step(w, x, y):
    # a loss summed (not averaged) over the batch
    loss, g = graphc.value_and_grad(lambda w: np.sum((np.tanh(x @ w) - y) ** 2))(w)
    return w - 0.01 * g, loss


def mean_loss_step(w, x, y):
    loss, g = graphc.value_and_grad(lambda w: np.mean((np.tanh(x @ w) - y) ** 2))(w)
    return w - 0.5 * g, loss


@pytest.mark.parametrize("step", [sum_loss_step, mean_loss_step])
@pytest.mark.parametrize("k", [2, 4, 24])  # 24: micro-batches of one sample
def test_mean_and_sum_losses_accumulate_the_whole_batch_gradient(step, k):
    """In float64 against numpy's eager step: the accumulated gradient is the whole batch's, for a
    loss that is a sum and one that is a mean (whose 1/B the partial sums carry, not 1/(B/k))."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3))
    x = rng.standard_normal((24, 6))
    y = rng.standard_normal((24, 3))
    pf = graphc.parallelize(step, mesh=Mesh({"dp": 2}, profile=PROFILE), microbatches=k, cache=False)
    if k == 24:  # one sample does not split over dp: each device runs it whole, and is told so
        with pytest.warns(PlanWarning, match="replicates the work"):
            got = k_steps(pf, (w,), (x, y), {}, 2)
    else:
        got = k_steps(pf, (w,), (x, y), {}, 2)
    want = k_steps(step, (w,), (x, y), {}, 2)
    eps = np.finfo(np.float64).eps
    for a, b in zip(got, want):
        for p, q in zip(a, b):
            np.testing.assert_allclose(p, q, rtol=2**10 * eps, atol=2**10 * eps)


def momentum_step(w1, w2, v1, v2, x, y):
    def loss(w1, w2):
        return np.mean((np.tanh(x @ w1) @ w2 - y) ** 2)

    value, (g1, g2) = graphc.value_and_grad(loss, argnums=(0, 1))(w1, w2)
    v1, v2 = 0.9 * v1 + g1, 0.9 * v2 + g2  # 0.9 * v: of the optimizer state alone
    return w1 - 0.5 * v1, w2 - 0.5 * v2, v1, v2, value


@pytest.mark.parametrize("axes", [{"dp": 1}, {"dp": 2}, {"pp": 2}], ids=["one device", "dp=2", "pp=2"])
def test_values_of_the_state_alone_run_once_in_the_update(axes):
    """``0.9 * v`` reads no micro-batch and only the update reads it: it runs once, in the update
    task of the stage that makes the new velocity (not in every micro-batch's forward task, held
    until the update, as before); the steps equal numpy's. A node reading only the step's inputs
    and constants has no stage of its own: it takes its readers' (at first it took the
    constants', -1, and its reader waited for it forever; then stage 0's, sending it on)."""
    rng = np.random.default_rng(0)
    w1, w2, v1, v2 = (rng.standard_normal(s) for s in ((6, 5), (5, 3), (6, 5), (5, 3)))
    x, y = rng.standard_normal((8, 6)), rng.standard_normal((8, 3))
    pf = graphc.parallelize(momentum_step, mesh=Mesh(axes, profile=PROFILE), microbatches=2, cache=False)
    got = k_steps(pf, (w1, w2, v1, v2), (x, y), {}, 2)
    want = k_steps(momentum_step, (w1, w2, v1, v2), (x, y), {}, 2)
    eps = np.finfo(np.float64).eps
    for a, b in zip(got, want):
        for p, q in zip(a, b):
            np.testing.assert_allclose(p, q, rtol=2**10 * eps, atol=2**10 * eps)
    program = pf.compile(w1, w2, v1, v2, x, y).program
    for v in (2, 3):  # the velocities: read by the update task of the stage making the new velocity
        read_in = {(ph, program.stage_of(d)) for (d, ph, _k), t in program.tasks.items() if v in t.in_ids}
        assert read_in == {("U", program.owner(program.out_ids[v]))}, (v, read_in)


@pytest.mark.parametrize("axes", [{"dp": 1}, {"dp": 2}], ids=["one device", "dp=2"])
def test_micro_batches_of_one_sample(axes):
    (params, x, labels), kw = mlp_args(batch=8)
    pf = graphc.parallelize(
        mlp.train_step, mesh=Mesh(axes, profile=PROFILE), microbatches=8, static_argnames=("lr",), cache=False
    )
    if axes["dp"] > 1:  # one sample does not split over dp: each device runs it whole, and is told so
        with pytest.warns(PlanWarning, match="replicates the work"):
            got = k_steps(pf, (params,), (x, labels), kw, 2)
    else:
        got = k_steps(pf, (params,), (x, labels), kw, 2)
    assert_steps_close(got, k_steps(mlp.train_step, (params,), (x, labels), kw, 2))
    assert pf.compile(params, x, labels, **kw).plan.microbatch_size == 1


def test_the_plan_file_keeps_the_count_and_runs_as_written(tmp_path):
    (params, x, labels), kw = mlp_args()
    mesh = Mesh({"dp": 2}, profile=PROFILE)
    pf = graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=4, static_argnames=("lr",), cache=False)
    plan = pf.plan(params, x, labels, **kw)
    path = tmp_path / "plan.json"
    plan.save(str(path))
    loaded = PipelinePlan.load(str(path))
    assert isinstance(loaded, PipelinePlan) and loaded.accumulates
    with pytest.raises(PlanError, match=r"plan\.json: not a graphc plan \(a graphc pipeline document\)"):
        graphc.Plan.load(str(path))  # the sharding plan's reader names what the file is, not its version
    assert (loaded.m, loaded.microbatch_size, loaded.mesh.axis_names) == (4, 8, ("dp",))
    assert loaded.to_json() == plan.to_json()
    run = graphc.parallelize(mlp.train_step, plan=loaded, static_argnames=("lr",), cache=False)
    assert run.options.microbatches == 4
    assert_steps_close(
        k_steps(run, (params,), (x, labels), kw, 2), k_steps(mlp.train_step, (params,), (x, labels), kw, 2)
    )
    # asking for another count than the plan's, or micro-batches of a one-pass plan, is refused
    with pytest.raises(PlanError, match="microbatches=4, but microbatches=2 was asked for"):
        graphc.parallelize(mlp.train_step, plan=loaded, microbatches=2)
    one_pass = graphc.parallelize(mlp.train_step, mesh=mesh, static_argnames=("lr",), cache=False)
    with pytest.raises(PlanError, match="microbatches=4 was asked for, but the plan given is a sharding plan"):
        graphc.parallelize(mlp.train_step, plan=one_pass.plan(params, x, labels, **kw), microbatches=4)
    # a file whose count was edited (its stages and tasks are of 4) is refused when it meets the step
    doc = json.loads(path.read_text())
    doc["options"]["microbatches"] = 2
    path.write_text(json.dumps(doc))
    edited = graphc.parallelize(mlp.train_step, plan=PipelinePlan.load(str(path)), static_argnames=("lr",))
    with pytest.raises(PlanError, match=r"2 micro-batches of 8 samples do not make its batch of 32 .*edited"):
        edited(params, x, labels, **kw)


# --- counts a step cannot take: errors, never ignored ----------------------------------------------------


def batch_norm_step(w, x):
    def loss(w):
        h = x @ w
        h = (h - h.mean(axis=0)) / (h.std(axis=0) + 1e-5)  # the batch's own statistics
        return np.mean(h**3)

    l, g = graphc.value_and_grad(loss)(w)
    return w - 0.1 * g, l


def max_scaled_step(w, x):
    l, g = graphc.value_and_grad(lambda w: np.mean((x @ w) ** 2))(w)
    return w - 0.1 * g * np.max(x), l  # the update reads the whole batch's maximum


def no_batch_step(w):
    return w * 0.5, np.sum(w)


@pytest.mark.parametrize("axes", [{"dp": 1}, {"dp": 2}], ids=["one device", "dp=2"])
def test_counts_a_step_cannot_take_are_errors_naming_the_function(axes):
    mesh = Mesh(axes, profile=PROFILE)
    (params, x, labels), kw = mlp_args(batch=10)
    pf = graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=4, static_argnames=("lr",), cache=False)
    with pytest.raises(PlanError, match=r"@train_step: input %x of shape \[10, 24\] does not split into 4 micro-") as e:
        pf(params, x, labels, **kw)
    # the user's file:line that first reads the batch input (models/mlp.py's forward)
    where = re.match(r"(\S+mlp\.py):(\d+): @train_step", str(e.value))
    assert where, str(e.value)
    assert re.search(r"\bx\b", linecache.getline(where[1], int(where[2])))
    w = np.ones((4, 3), np.float32)
    with pytest.raises(PlanError, match="microbatches=2: @no_batch_step has no batch input"):
        graphc.parallelize(no_batch_step, mesh=mesh, microbatches=2, cache=False)(w)
    rng = np.random.default_rng(1)
    w, xb = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    with pytest.raises(PlanError, match=r"@batch_norm_step: .* at .*test_accumulate\.py:\d+.*needs the whole batch"):
        graphc.parallelize(batch_norm_step, mesh=mesh, microbatches=2, cache=False)(w, xb)
    with pytest.raises(PlanError, match=r"@max_scaled_step: reduce_max at .*test_accumulate\.py:\d+ reads the whole"):
        graphc.parallelize(max_scaled_step, mesh=mesh, microbatches=2, cache=False)(w, xb)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PlanError, match="microbatches must be a positive int"):
            graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=bad)
    with pytest.raises(PlanError, match="micro-batched steps do not shard their state with ZeRO"):
        graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=2, zero=2)
    with pytest.raises(PlanError, match="micro-batched steps do not recompute"):
        graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=2, recompute="on")
    with pytest.raises(GraphcError, match="pins are not followed on micro-batched steps"):
        graphc.parallelize(mlp.train_step, mesh=mesh, microbatches=2, in_specs=("R",))


def test_a_memory_limit_is_met_by_the_micro_batch_plan():
    """Under a memory limit the micro-batch program's plan (with the running sums) fits it."""
    (params, x, labels), kw = mlp.example_train_args(batch=1024, sizes=(256, 512, 512, 8))
    g = graph_of(mlp.train_step, (params, x, labels), kw)
    mesh = Mesh({"dp": 2}, profile=PROFILE)
    free = plan_accumulated(g, mesh, PlanOptions(microbatches=4, zero=0, recompute="off"))
    limit = int(free.peak_bytes * 1.05)
    fitted = plan_accumulated(g, mesh, PlanOptions(microbatches=4, zero=0, recompute="off", memory_limit=limit))
    assert fitted.peak_bytes <= limit
    with pytest.raises(PlanError):
        plan_accumulated(g, mesh, PlanOptions(microbatches=4, zero=0, recompute="off", memory_limit=1024))
    with pytest.raises(PlanError, match="use plan_pipeline"):
        plan_accumulated(g, {"pp": 2}, PlanOptions(microbatches=4))


# --- the command line -------------------------------------------------------------------------------------

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TARGET = [os.path.join(ROOT, "models", "mlp.py:train_step"), "--example", "example_train_args"]


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no_profile.json"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_compile_and_run_take_micro_batches_on_a_mesh_without_pp(cli_env):
    plan = cli_env / "plan.json"
    code, out, err = call("compile", *TARGET, "--mesh", "dp=2", "--microbatches", "4", "-o", str(plan), "--quiet")
    assert code == 0, err
    assert "gradient accumulation on mesh dp=2: 4 micro-batches of 16 samples" in out
    doc = json.loads(plan.read_text())
    assert (doc["kind"], doc["options"]["microbatches"], doc["microbatch_size"]) == ("pipeline", 4, 16)
    code, out, err = call("compile", *TARGET, "--mesh", "dp=2", "--microbatches", "4", "--explain", "%x", "--quiet")
    assert code == 0 and "%x" in out, err
    code, out, err = call("run", *TARGET, "--plan", str(plan))
    assert code == 0, err
    assert "result equals graphc's interpreter: yes" in out and "4 micro-batches of 16 samples" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--microbatches", "0"], "argument --microbatches: expected a positive integer, got '0'"),
        (["--microbatches", "3"], "@train_step: input %x of shape [64, 784] does not split into 3 micro-batches"),
        (["--microbatches", "2", "--zero", "1"], "micro-batched steps do not shard their state with ZeRO"),
    ],
    ids=["zero micro-batches", "not dividing the batch", "forced ZeRO"],
)
def test_counts_the_command_cannot_take_exit_2(cli_env, flags, message):
    code, out, err = call("compile", *TARGET, "--mesh", "dp=2", *flags, "-o", str(cli_env / "p.json"))
    assert code == 2, (code, out, err)
    assert message in err and "Traceback" not in err
    assert not (cli_env / "p.json").exists()


def _bf16_step(w, m, v, x, y):
    """A two-layer linear bfloat16 step with Adam's float32 moments: it widens its gradients, as
    mixed precision does, and reads them twice (``m`` and ``v``)."""

    def loss(w, x, y):
        d = (x @ w[0]) @ w[1] - y
        return (d * d).astype(np.float32).sum() / x.shape[0]

    gs = [g.astype(np.float32) for g in graphc.grad(loss)(w, x, y)]
    m = [0.9 * a + 0.1 * g for a, g in zip(m, gs)]
    v = [0.99 * a + 0.01 * g * g for a, g in zip(v, gs)]
    w = [p - (1e-3 * a / (np.sqrt(b) + 1e-8)).astype(p.dtype) for p, a, b in zip(w, m, v)]
    return w, m, v


@pytest.mark.parametrize("m", [4, 64])
def test_bfloat16_gradients_widened_by_the_step_accumulate_in_float32(m):
    """A 16-bit gradient the step widens is accumulated after the widening: each micro-batch's
    piece is rounded to bfloat16 once (by the matmul that makes it) and the pieces are summed in
    float32. Summed in bfloat16 the running sum rounded at every micro-batch, so its error grew
    with their number (0.36% at 4, 0.99% at 64 on a GPT-3-style step) and a micro-batch's share
    under half its last bit was lost. So the micro-batched gradient (Adam's first moment, from
    zero: 0.1 g) is within one rounding of each piece of the one-pass gradient, whatever the
    count: |g_m - g_1| <= u (sum_k |g_k| + |g_1|) elementwise, u = 2^-8 (bfloat16's unit
    roundoff: 8 significant bits), the pieces g_k computed one by one. The data are small
    integers and quarters, so every float32 product and sum is exact whatever the BLAS's order:
    the only roundings are bfloat16's, of exact values, the same on any machine."""
    bf = graphc.bfloat16
    rng = np.random.default_rng(5)
    B, d, h = 64, 24, 16
    w = [(rng.integers(-2, 3, s) / 4).astype(bf) for s in ((d, h), (h, 3))]
    zeros = [np.zeros(a.shape, np.float32) for a in w]
    x, y = (rng.integers(-2, 3, s).astype(bf) for s in ((B, d), (B, 3)))
    one = graphc.jit(_bf16_step)(w, zeros, zeros, x, y)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)  # summed in float32: nothing to warn of
        got = graphc.parallelize(_bf16_step, mesh={"dp": 1}, microbatches=m, cache=False)(w, zeros, zeros, x, y)[1]
    k = B // m
    pieces = [graphc.jit(_bf16_step)(w, zeros, zeros, x[i : i + k], y[i : i + k])[1] for i in range(0, B, k)]
    u = 2.0**-8
    for j in (0, 1):
        g1 = one[j].astype(np.float64)
        parts = sum(np.abs(p[j].astype(np.float64)) * (k / B) for p in pieces)  # a piece of the mean: k/B of its own
        bound = u * (parts + np.abs(g1)) + 4 * m * 2.0**-24 * parts  # and the float32 sums' own rounding
        assert np.all(np.abs(got[j] - g1) <= bound), float(np.max(np.abs(got[j] - g1) - bound))


def _bf16_grads(w, x, y):
    """The weights (state: returned unchanged) and the bfloat16 gradients of a two-layer linear
    step's mean loss, never widened: returned as they are summed."""

    def loss(w, x, y):
        d = (x @ w[0]) @ w[1] - y
        return (d * d).astype(np.float32).sum() / x.shape[0]

    return w, graphc.grad(loss)(w, x, y)


@pytest.mark.parametrize("m", [4, 64])
def test_bfloat16_gradients_never_widened_accumulate_in_float32_too(m):
    """A 16-bit gradient the step never widens meets in float32 all the same (passes/microbatch.py
    ``widen_sums``: Megatron-LM's float32 ``main_grad``): the running sum rounds to bfloat16 once,
    after the last micro-batch, not at each of them. So, as for a widened gradient above, within
    one rounding of each piece, of the one-pass gradient and of the result: |g_m - g_1| <= u
    (sum_k |g_k| + |g_1| + |g_m|) elementwise, u = 2^-8, on data whose float32 arithmetic is
    exact. Summed in bfloat16 (before) it broke that bound at 64 micro-batches."""
    bf = graphc.bfloat16
    rng = np.random.default_rng(5)
    B, d, h = 64, 24, 16
    w = [(rng.integers(-2, 3, s) / 4).astype(bf) for s in ((d, h), (h, 3))]
    x, y = (rng.integers(-2, 3, s).astype(bf) for s in ((B, d), (B, 3)))
    one = graphc.jit(_bf16_grads)(w, x, y)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)  # summed in float32: nothing to warn of
        pf = graphc.parallelize(_bf16_grads, mesh={"dp": 1}, microbatches=m, cache=False)
        got = pf(w, x, y)[1]
    assert not pf.compile(w, x, y).plan.warnings
    k = B // m
    pieces = [graphc.jit(_bf16_grads)(w, x[i : i + k], y[i : i + k])[1] for i in range(0, B, k)]
    u = 2.0**-8
    for j in (0, 1):
        assert got[j].dtype == bf
        g1, gm = one[j].astype(np.float64), got[j].astype(np.float64)
        parts = sum(np.abs(p[j].astype(np.float64)) * (k / B) for p in pieces)
        bound = u * (parts + np.abs(g1) + np.abs(gm)) + 4 * m * 2.0**-24 * parts
        assert np.all(np.abs(gm - g1) <= bound), float(np.max(np.abs(gm - g1) - bound))


def _bf16_sgd_logging_a_gradient_sum(w, x, y):
    """Pure bfloat16 SGD that also returns a sum of one gradient (a logged statistic, linear in
    the gradient, so it could be summed over the micro-batches on its own) and that gradient."""

    def loss(w, x, y):
        d = (x @ w[0]) @ w[1] - y
        return np.mean(d * d)

    g = graphc.grad(loss)(w, x, y)
    return [p - 0.25 * gi for p, gi in zip(w, g)], np.sum(g[0]), g[0]


@pytest.mark.parametrize(("axes", "m"), [({"dp": 1}, 8), ({"dp": 1}, 64), ({"pp": 2}, 8)])
def test_a_gradient_also_read_by_a_linear_statistic_meets_in_float32(axes, m):
    """A bfloat16 gradient the update takes whole and a linear statistic (np.sum(g)) would keep
    partial: the micro-batches still meet at its float32 running sum, and the statistic is of the
    gradient so summed. Before, the narrowing convert stayed before the meeting for the sake of
    the statistic, so the gradient the update and the step returned was summed in bfloat16,
    rounding at every micro-batch (the guard PlanWarning fired; the gradient broke the bound at
    64 micro-batches). The bound is the one above, |g_m - g_1| <= u (sum_k |g_k| + |g_1| + |g_m|),
    and the statistic is the bfloat16 sum of the returned gradient, as on one pass."""
    bf = graphc.bfloat16
    rng = np.random.default_rng(2)
    B = 64
    w = [(rng.integers(-2, 3, s) / 4).astype(bf) for s in ((8, 4), (4, 3))]
    x, y = (rng.integers(-2, 3, s).astype(bf) for s in ((B, 8), (B, 3)))
    one = graphc.jit(_bf16_sgd_logging_a_gradient_sum)(w, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)  # summed in float32: nothing to warn of
        pf = graphc.parallelize(_bf16_sgd_logging_a_gradient_sum, mesh=axes, microbatches=m, cache=False)
        got = pf(w, x, y)
    meets = [ln for ln in pf.compile(w, x, y).ir("microbatch").splitlines() if "all_reduce(" in ln and '"mb"' in ln]
    assert meets and all(ln.rstrip().split(" : ")[-1].startswith("f32") for ln in meets), meets
    k = B // m
    pieces = [graphc.jit(_bf16_sgd_logging_a_gradient_sum)(w, x[i : i + k], y[i : i + k])[2] for i in range(0, B, k)]
    u = 2.0**-8
    g1, gm = one[2].astype(np.float64), got[2].astype(np.float64)
    parts = sum(np.abs(p.astype(np.float64)) * (k / B) for p in pieces)
    bound = u * (parts + np.abs(g1) + np.abs(gm)) + 4 * m * 2.0**-24 * parts
    assert np.all(np.abs(gm - g1) <= bound), float(np.max(np.abs(gm - g1) - bound))
    assert float(got[1]) == float(graphc.jit(np.sum)(got[2]))


def test_a_pipeline_plans_own_warnings_go_with_its_file_and_its_runs(tmp_path):
    """A pipeline plan's own warnings (``PipelinePlan.warnings``: a 16-bit sum micro-batching
    could not widen) are in its JSON, and a step run from the plan file warns with them, once."""
    (params, x, labels), kw = mlp_args()
    pf = graphc.parallelize(mlp.train_step, mesh={"dp": 2}, microbatches=4, static_argnames=("lr",), cache=False)
    plan = dataclasses.replace(pf.plan(params, x, labels, **kw), warnings=("a warning of the plan's own",))
    path = tmp_path / "p.json"
    plan.save(str(path))
    assert json.loads(path.read_text())["warnings"] == ["a warning of the plan's own"]
    loaded = graphc.PipelinePlan.load(str(path))
    assert loaded.warnings == plan.warnings
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        given = graphc.parallelize(mlp.train_step, mesh={"dp": 2}, plan=loaded, static_argnames=("lr",))
        given(params, x, labels, **kw)
    assert [str(w.message) for w in ws if issubclass(w.category, PlanWarning)] == ["a warning of the plan's own"]


def _mixed_step_returning_a_bf16_loss(w, m, x, y):
    def loss(w, x, y):
        d = x @ w - y
        return np.mean(d * d)  # bfloat16

    value, g = graphc.value_and_grad(loss)(w, x, y)
    m = 0.9 * m + g.astype(np.float32)  # the gradient widened: summed in float32
    new_w = (w.astype(np.float32) - 0.01 * m).astype(w.dtype)
    return new_w, m, value


def test_a_bfloat16_loss_the_step_returns_is_summed_in_float32_too():
    """A step that widens its gradients but returns its bfloat16 loss: the loss's sum over the
    micro-batches is float32 too, rounded to bfloat16 once (it rounded at every micro-batch, and
    a warning told the user to widen it): within one rounding of each piece, of the one-pass loss
    and of the result, u = 2^-8, on data whose float32 arithmetic is exact."""
    bf = graphc.bfloat16
    rng = np.random.default_rng(3)
    B, m = 64, 32
    w = (rng.integers(-2, 3, (8, 2)) / 4).astype(bf)
    x, y = (rng.integers(-2, 3, s).astype(bf) for s in ((B, 8), (B, 2)))
    state = np.zeros((8, 2), np.float32)
    one = float(graphc.jit(_mixed_step_returning_a_bf16_loss)(w, state, x, y)[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)  # summed in float32: nothing to warn of
        pf = graphc.parallelize(_mixed_step_returning_a_bf16_loss, mesh={"dp": 1}, microbatches=m, cache=False)
        got = pf(w, state, x, y)[2]
    assert got.dtype == bf
    k = B // m
    parts = sum(
        abs(float(graphc.jit(_mixed_step_returning_a_bf16_loss)(w, state, x[i : i + k], y[i : i + k])[2])) * (k / B)
        for i in range(0, B, k)
    )
    u = 2.0**-8
    assert abs(float(got) - one) <= u * (parts + abs(one) + abs(float(got))) + 4 * m * 2.0**-24 * parts


def test_graphc_run_shows_a_pipeline_plans_own_warnings(cli_env):
    """graphc silences only the PlanWarning its summary prints; a pipeline plan's own warnings
    are shown as ``graphc: warning: ...`` when its file is run."""
    plan = cli_env / "plan.json"
    code, _out, err = call("compile", *TARGET, "--mesh", "dp=2", "--microbatches", "4", "-o", str(plan), "--quiet")
    assert code == 0 and "graphc: warning" not in err, err
    doc = json.loads(plan.read_text())
    assert doc["warnings"] == []
    plan.write_text(json.dumps({**doc, "warnings": ["a warning of the plan's own"]}))
    code, _out, err = call("run", *TARGET, "--plan", str(plan))
    assert code == 0, err
    assert re.findall(r"graphc: warning: (.*)", err) == ["a warning of the plan's own"], err


@pytest.mark.parametrize("step", ["widened", "never widened"])
def test_no_float32_round_trip_runs_in_every_micro_batch(step):
    """``widen_sums`` widens only the 16-bit values the micro-batches meet at: a bfloat16 gradient
    that Adam widens before the meeting gets no float32 round trip of its own (it was given one,
    run in every micro-batch for nothing), and a never-widened one meets between its two converts.
    No convert to a 16-bit float reads a convert from it directly, and every sum is float32."""
    from graphc.passes.microbatch import microbatch

    bf = graphc.bfloat16
    rng = np.random.default_rng(5)
    w = [(rng.integers(-2, 3, s) / 4).astype(bf) for s in ((6, 4), (4, 3))]
    x, y = (rng.integers(-2, 3, s).astype(bf) for s in ((8, 6), (8, 3)))
    if step == "widened":
        zeros = [np.zeros(a.shape, np.float32) for a in w]
        fn, args = _bf16_step, (w, zeros, zeros, x, y)
    else:
        fn, args = _bf16_grads, (w, x, y)
    graph = graphc.parallelize(fn, mesh={"dp": 1}, cache=False).trace_optimized(*args)[1]
    g0 = microbatch(graph, 4).program.devices[0].graph
    sums = [n for n in g0.nodes if n.op.name == "all_reduce"]
    assert sums and all(n.outputs[0].type.dtype == np.float32 for n in sums)
    round_trips = [
        n
        for n in g0.nodes
        if n.op.name == "convert"
        and n.outputs[0].type.dtype == bf
        and n.inputs[0].producer is not None
        and n.inputs[0].producer.op.name == "convert"
        and n.inputs[0].producer.inputs[0].type.dtype == bf
    ]
    assert not round_trips, [str(n.loc) for n in round_trips]


def _untied_loss(params, tokens, targets):
    # an embedding table read only by its gather (untied from the head): its gradient is a
    # scatter_add into zeros of the table's shape, left unfolded (``broadcast_to``) when large
    x = params["emb"][tokens]  # [B, T, d]
    logits = np.tanh(x) @ params["head"]  # [B, T, V]
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    onehot = np.arange(logits.shape[-1]) == targets[..., None]
    return -np.sum(np.where(onehot, logp, 0)) / tokens.size


def _untied_step(params, tokens, targets):
    value, grads = graphc.value_and_grad(_untied_loss)(params, tokens, targets)
    return graphc.tree_map(lambda p, g: p - 0.5 * g, params, grads), value


@pytest.mark.parametrize("axes", [{"dp": 1}, {"dp": 2}], ids=["dp=1", "dp=2"])
def test_a_large_untied_embedding_accumulates_its_scatter_add(axes):
    """The embedding's gradient adds into zeros of [V, d]: over 1 MiB, constant folding leaves
    them a ``broadcast_to`` of a scalar, which the micro-batches' propagation took for a value of
    the step (no partial copy of its own), so it gathered every micro-batch's tokens to scatter
    them once: "reads the whole batch at once" for any GPT with untied embeddings and a real
    vocabulary. The zeros are the same in every micro-batch: each adds its own tokens into them."""
    rng = np.random.default_rng(5)
    V, d = 8192, 32  # float64 [V, d]: 2 MiB of zeros, over the folding limit
    params = {"emb": rng.standard_normal((V, d)), "head": rng.standard_normal((d, V)) * 0.1}
    tokens, targets = rng.integers(0, V, (8, 4)), rng.integers(0, V, (8, 4))
    want = k_steps(_untied_step, (params,), (tokens, targets), {}, 2)
    pf = graphc.parallelize(_untied_step, mesh=Mesh(axes, profile=PROFILE), microbatches=4, cache=False)
    got = k_steps(pf, (params,), (tokens, targets), {}, 2)
    assert_steps_close(got, want)
    assert pf.compile(params, tokens, targets).plan.m == 4
