"""Micro-batching (passes/microbatch.py): a training step split into M micro-batches with
gradient accumulation gives the full-batch step's results, for mean and sum losses; a step that
needs the whole batch at once is refused with its line."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.core.errors import PlanError
from graphc.core.pytree import flatten
from graphc.interpreter import bind_arguments
from graphc.models import gpt, mlp
from graphc.passes.microbatch import batch_inputs, microbatch
from graphc.passes.partition import optimize_for_planning


def graph_of(fn, args, kw):
    return optimize_for_planning(graphc.trace(fn, *args, **kw))


def check(fn, args, kw, m, rtol=1e-4, atol=1e-4):
    g = graph_of(fn, args, kw)
    mb = microbatch(g, m)
    for p in mb.program.devices:
        p.graph.verify()
    got = mb.run_reference(bind_arguments(g, args, kw))
    want = flatten(fn(*args, **kw))[0]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return mb


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_mlp_train_step(m):
    args, kw = mlp.example_train_args(batch=16)
    mb = check(mlp.train_step, args, kw, m)
    if m > 1:
        # the six gradients and the loss meet; the SGD update runs once, after them
        assert len(mb.meeting_points) == 7 and all(p.startswith("all_reduce") for p in mb.meeting_points)
        assert any(mb.step_phase) and not all(mb.step_phase)


@pytest.mark.parametrize("m", [1, 2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_gpt_train_step(m):
    args, kw = gpt.example_train_args(batch=8)
    n_head = kw.pop("n_head")
    step = lambda params, state, tokens, targets, lr: gpt.train_step(params, state, tokens, targets, n_head, lr)  # noqa: E731
    mb = check(step, args, kw, m)
    if m > 1:
        # Adam reads each gradient twice ((1 - b1) * g and g * g): the gradient itself meets, once
        n_params = len(flatten(args[0])[0])
        assert n_params < len(mb.meeting_points) <= n_params + 2


def sum_loss_step(w, x, y):
    # a loss summed (not averaged) over the batch: the accumulated gradient is still the whole batch's
    loss, g = graphc.value_and_grad(lambda w: np.sum((np.tanh(x @ w) - y) ** 2))(w)
    return w - 0.01 * g, loss


def test_sum_loss_accumulates_exactly():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3))
    x = rng.standard_normal((12, 6))
    y = rng.standard_normal((12, 3))
    g = graph_of(sum_loss_step, (w, x, y), {})
    assert batch_inputs(g) == [1, 2]  # w is replaced by an output: state, not split
    for m in (2, 3, 4, 6):
        check(sum_loss_step, (w, x, y), {}, m, rtol=1e-9, atol=1e-12)


def batch_norm_step(w, x):
    # normalising by the batch's own statistics couples every example to the whole batch
    def loss(w):
        h = x @ w
        h = (h - h.mean(axis=0)) / (h.std(axis=0) + 1e-5)
        return np.mean(h**3)

    l, g = graphc.value_and_grad(loss)(w)
    return w - 0.1 * g, l


def test_step_needing_the_whole_batch_is_refused_with_its_line():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    g = graph_of(batch_norm_step, (w, x), {})
    with pytest.raises(PlanError, match=r"test_microbatch\.py:\d+.*needs the whole batch at once"):
        microbatch(g, 2)
    check(batch_norm_step, (w, x), {}, 1)  # one micro-batch is the whole batch


def logits_step(w, x, y):
    # returns the batch's predictions beside the loss, as a step kept for metrics often does
    l, g = graphc.value_and_grad(lambda w: np.mean((np.tanh(x @ w) - y) ** 2))(w)
    return w - 0.1 * g, l, np.tanh(x @ w)[:, :2]  # [B, 2]: no argument has its type (so none is state)


def test_a_result_per_sample_is_refused_as_one():
    """A micro-batch's share of a per-sample result is gathered only to be returned: the error names
    the result, not the line that made it as one reading the whole batch (it did not)."""
    rng = np.random.default_rng(2)
    w, x, y = rng.standard_normal((4, 3)), rng.standard_normal((8, 4)), rng.standard_normal((8, 3))
    g = graph_of(logits_step, (w, x, y), {})
    with pytest.raises(
        PlanError,
        match=r"its result\[2\] \(f64\[8,2\], made at .*test_microbatch\.py:\d+\) is joined from every micro-batch's piece",
    ):
        microbatch(g, 2)
    check(logits_step, (w, x, y), {}, 1)


def test_batch_that_does_not_split_is_refused():
    args, kw = mlp.example_train_args(batch=10)
    g = graph_of(mlp.train_step, args, kw)
    with pytest.raises(PlanError, match=r"input %x of shape \[10, 784\] does not split into 4 micro-batches"):
        microbatch(g, 4)
    with pytest.raises(PlanError, match="positive int"):
        microbatch(g, 0)


def test_linear_operands_are_linear():
    """Every op in the linearity table, on every node of two training steps: splitting the linear
    operands into two random partial sums and adding the two results gives the result."""
    from graphc.interpreter import run_flat
    from graphc.ops.dims import linear_operands

    rng = np.random.default_rng(0)
    checked = set()
    for fn, (args, kw) in (
        (mlp.train_step, mlp.example_train_args(batch=8, sizes=(6, 5, 4))),
        (gpt.train_step, gpt.example_train_args(batch=2, seq=4, d=8, n_head=2, n_vocab=16, n_layer=1)),
    ):
        g = graph_of(fn, args, kw)
        env = dict(zip(g.inputs, bind_arguments(g, args, kw)))
        for node in g.nodes:
            xs = [env[v] for v in node.inputs]
            outs = (
                node.op.impl(run_flat, node.regions, *xs, **node.attrs)
                if node.regions
                else node.op.evaluate(*xs, **node.attrs)
            )
            for o, y in zip(node.outputs, outs):
                env[o] = np.asarray(y)
            for ops in linear_operands(node):
                if any(not np.all(np.abs(np.asarray(xs[i])) < 1e6) for i in ops):
                    continue  # an additive -inf / -1e9 mask: float cancellation, not linearity, is tested
                a, b = list(xs), list(xs)
                for i in ops:
                    x = np.asarray(xs[i])
                    scale = np.abs(x) + np.abs(x).mean() + 1e-30  # independent pieces, no float32 cancellation
                    noise = (rng.standard_normal(x.shape) * scale).astype(x.dtype)
                    a[i], b[i] = xs[i] - noise, noise
                ya, yb = node.op.evaluate(*a, **node.attrs), node.op.evaluate(*b, **node.attrs)
                for y, p, q in zip(outs, ya, yb):
                    np.testing.assert_allclose(
                        np.asarray(p) + np.asarray(q),
                        y,
                        rtol=1e-4,
                        atol=1e-4,
                        err_msg=f"{node.op.name} at {node.loc} in operands {sorted(ops)}",
                    )
                checked.add(node.op.name)
    assert {"add", "mul", "matmul", "transpose", "reshape", "reduce_sum", "scatter_add"} <= checked


# --- the micro-batch program planned on a real mesh (gradient accumulation: passes/accumulate.py) ---------


def _mb_problem(m=4, axes=None):
    from graphc.core.mesh import Mesh
    from graphc.passes.microbatch import AccumulatingMemory, RepeatedCosts, item_weights, meeting_nodes
    from graphc.passes.options import PlanOptions
    from graphc.passes.partition import Pins, build_problem, state_ties

    args, kw = mlp.example_train_args(batch=64, sizes=(32, 64, 64, 8))
    g = graph_of(mlp.train_step, args, kw)
    mb = microbatch(g, m)
    g0 = mb.program.devices[0].graph
    problem = build_problem(g0, Mesh(axes or {"dp": 2}), PlanOptions(zero=0, recompute="off"), Pins(), state_ties(g))
    weights = item_weights(problem, mb.step_phase, m)
    base_costs, base_memory = problem.costs, problem.memory
    meets = set(meeting_nodes(g0))
    sums = frozenset(i for i, it in enumerate(problem.items) if it.kind == "node" and it.index in meets)
    return mb, problem, weights, RepeatedCosts(base_costs, weights), base_memory, AccumulatingMemory(base_memory, sums)


def test_a_step_prices_the_micro_batch_phase_m_times_and_the_update_once():
    from graphc.passes.partition import solve_problem

    mb, problem, weights, repeated, _base, _acc = _mb_problem(m=4)
    for i, it in enumerate(problem.items):
        if it.kind == "node":
            assert weights[i] == (1 if mb.step_phase[it.index] else 4), it.node
        elif it.kind in ("input", "output"):
            assert weights[i] == 1
    assert 4 in weights and 1 in weights
    choice = [0] * len(problem.items)
    once = problem.costs.evaluate(choice)
    got = repeated.evaluate(choice)
    compute = sum(weights[i] * it.strategies[0].compute_s for i, it in enumerate(problem.items))
    comm = sum(weights[e.dst] * problem.costs.edge_time(e, 0, 0) for e in problem.edges)
    assert got["compute_s"] == pytest.approx(compute, rel=1e-12) and got["comm_s"] == pytest.approx(comm, rel=1e-12)
    assert once["total_s"] < got["total_s"] < 4 * once["total_s"]
    # the ILP minimises what RepeatedCosts says a step costs
    problem.costs = repeated
    solution = solve_problem(problem)
    assert solution.objective == pytest.approx(repeated.evaluate(solution.choice)["total_s"], rel=1e-6)


def test_the_running_sums_are_live_while_every_micro_batch_runs():
    """The accumulating memory model is the one-pass model plus, at every program point before a
    meeting point or after the running sum's last reader, that meeting point's running sum (its
    piece on the device): kept while every micro-batch runs, and through the update, which reads
    it as an argument and does not free it (runtime/pipeline.py keeps its buffer for the next step)."""
    _mb, problem, _w, _costs, one_pass, acc = _mb_problem(m=4, axes={"dp": 2, "tp": 2})
    # constants all run in both (a device's tasks share one copy of each: runtime/pipeline.py)
    base = one_pass
    choice = [0] * len(problem.items)
    ranges = {i: (a, b) for _v, i, a, b in base.live_ranges()}
    want = base.profile(choice).copy()
    for i in acc.sums:
        nb = base.value_bytes(problem.items[i].node.outputs[0], i, choice[i])
        assert nb > 0
        first, last = ranges[i]
        want[:first] += nb
        want[last + 1 :] += nb
    np.testing.assert_array_equal(acc.profile(choice), want)
    assert acc.peak(choice)[0] > base.peak(choice)[0]


def lora_step(lora, w, x, y):
    # a frozen base weight w beside trained adapters: an argument the step does not return
    def loss(lora):
        return np.mean((np.tanh(x @ w + (x @ lora["a"]) @ lora["b"]) - y) ** 2)

    l, g = graphc.value_and_grad(loss)(lora)
    return {k: lora[k] - 0.1 * g[k] for k in lora}, l


def test_a_frozen_weight_taken_for_a_batch_input_is_named():
    """An array argument the step does not return replaced is a batch input, split into micro-batches:
    a frozen weight read whole is refused naming it, and returned unchanged it is state and runs."""
    rng = np.random.default_rng(4)
    lora = {"a": rng.standard_normal((6, 2)), "b": rng.standard_normal((2, 6))}
    w, x, y = rng.standard_normal((6, 6)), rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    with pytest.raises(
        PlanError,
        match=r"reads the whole batch at once .*; it joins %w \(.*\), %x \(.*\), split along dim 0 as batch inputs",
    ):
        microbatch(graph_of(lora_step, (lora, w, x, y), {}), 2)

    def returning_w(lora, w, x, y):
        new, l = lora_step(lora, w, x, y)
        return new, w, l

    check(returning_w, (lora, w, x, y), {}, 2, rtol=1e-12, atol=1e-12)


def test_a_step_without_a_forward_pass_is_refused_as_one():
    """A step that takes no gradient (an evaluation returning its state) has no forward pass to
    split: micro-batching it says so (it said "no forward nodes to cut into pipeline stages" on a
    mesh without pipeline stages)."""

    def eval_step(w, x, y):
        return w, np.mean((np.tanh(x @ w) - y) ** 2)

    rng = np.random.default_rng(3)
    w, x, y = rng.standard_normal((4, 3)), rng.standard_normal((8, 4)), rng.standard_normal((8, 3))
    for mesh in ({"dp": 2}, {"pp": 2}):
        with pytest.raises(PlanError, match=r"@eval_step has no forward pass .* run it with microbatches=1"):
            graphc.parallelize(eval_step, mesh=mesh, microbatches=2, cache=False)(w, x, y)


def test_a_step_without_a_forward_pass_is_refused_before_its_weights_are_read_as_batch_inputs():
    """A loss with no gradient taken, whose weight (an argument it does not return, so a batch
    input) does not divide by the count: the error says the step has no forward pass, not that the
    weight "does not split into 2 micro-batches" (nor that a matmul reads the whole batch)."""

    def loss(w, x):
        return np.mean(np.tanh(x @ w))

    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((5, 3)), rng.standard_normal((8, 5))
    for k in (2, 4):
        with pytest.raises(PlanError, match=r"@loss has no forward pass .* run it with microbatches=1") as info:
            graphc.parallelize(loss, mesh={"dp": 2}, microbatches=k, cache=False)(w, x)
        assert "does not split" not in str(info.value)


def test_a_time_major_input_joined_whole_is_named_with_its_shape_and_dim():
    """A recurrent step over a time-major input [T, B, d]: micro-batches split dim 0, time, and the
    recurrence reads every step: the error names the input with its shape and says it was split
    along dim 0 (it said only "it joins %x, split as batch inputs")."""

    def loss(w, x, y):
        h = np.zeros((x.shape[1], w.shape[1]))
        for t in range(x.shape[0]):
            h = np.tanh(x[t] @ w + h)
        return np.mean((h - y) ** 2)

    def step(w, x, y):
        value, g = graphc.value_and_grad(loss)(w, x, y)
        return w - 0.1 * g, value

    rng = np.random.default_rng(4)
    w, x, y = rng.standard_normal((5, 3)), rng.standard_normal((4, 6, 5)), rng.standard_normal((6, 3))
    with pytest.raises(PlanError, match=r"it joins %x \(f64\[4,6,5\]\), split along dim 0 .*time-major"):
        graphc.parallelize(step, mesh={"dp": 1}, microbatches=2, cache=False)(w, x, y)
    # a count dividing the batch (6) but not the time steps (4): the error says dim 0 is what splits,
    # not only that the count "must divide the batch" (it does)
    with pytest.raises(PlanError, match=r"input %x of shape \[4, 6, 5\] does not split into 3 .*time-major"):
        graphc.parallelize(step, mesh={"dp": 1}, microbatches=3, cache=False)(w, x, y)
