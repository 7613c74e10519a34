"""Optimization passes: golden IR, numeric equality with the reference interpreter, idempotence,
and hypothesis-generated random graphs, for every pass and for the default pipeline."""

import importlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
from graphc.passes import DEFAULT_PASSES, PASSES, run_passes
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import assert_adam_step_close, assert_arrays_close, assert_same_pytree, quiet

GOLDEN = Path(__file__).parents[1] / "golden" / "passes"


@pytest.mark.parametrize("name", ["simplify", "cse_fold"])
def test_golden(name):
    graph = graphc.parse((GOLDEN / f"{name}.gir").read_text())
    optimized = graphc.optimize(graph, passes=["fold_constants", "simplify", "cse", "dce"], verify=True)
    assert str(optimized) == (GOLDEN / f"{name}.expected.gir").read_text()


@pytest.mark.parametrize("name", sorted(PASSES))
def test_pass_preserves_semantics_on_random_graphs(name):
    @settings(max_examples=60, deadline=None)
    @given(random_graphs(max_nodes=12), st.integers(0, 1000))
    def check(graph, seed):
        out = PASSES[name](graph)
        out.verify()
        inputs = random_inputs(graph, seed)
        assert_arrays_close(quiet(graphc.evaluate, out, *inputs), quiet(graphc.evaluate, graph, *inputs), 1e-5, 1e-6)
        again = PASSES[name](out)
        assert str(again) == str(out), f"{name} is not idempotent"
        assert str(graph) == str(graph)  # the input graph is not mutated (still prints)

    check()


@settings(max_examples=80, deadline=None)
@given(random_graphs(max_nodes=14), st.integers(0, 1000))
def test_default_pipeline_on_random_graphs(graph, seed):
    before = str(graph)
    result = run_passes(graph, verify=True)
    assert str(graph) == before, "a pass mutated its input"
    inputs = random_inputs(graph, seed)
    assert_arrays_close(
        quiet(graphc.evaluate, result.graph, *inputs), quiet(graphc.evaluate, graph, *inputs), 1e-5, 1e-6
    )
    assert len(result.graph.nodes) <= len(graph.nodes) + 2  # x**3 -> x*x*x may add one node


def gpt_grads(params, tokens, targets, n_head):
    from graphc.models import gpt

    return graphc.value_and_grad(gpt.lm_loss)(params, tokens, targets, n_head)


MODELS = [
    ("graphc.models.mlp", "mlp", "example_args"),
    ("graphc.models.mlp", "train_step", "example_train_args"),
    ("graphc.models.gpt", "gpt", "example_args"),
    ("graphc.models.gpt", "lm_loss", "example_loss_args"),
    ("graphc.models.cnn", "cnn", "example_args"),
    ("graphc.models.cnn", "train_step", "example_train_args"),
    ("graphc.models.llama", "train_step", "example_train_args"),
]


@pytest.mark.parametrize("module, func, example", MODELS + [("graphc.models.gpt", gpt_grads, "example_loss_args")])
def test_pipeline_on_models(module, func, example):
    mod = importlib.import_module(module)
    fn = getattr(mod, func) if isinstance(func, str) else func
    args, kwargs = getattr(mod, example)()
    graph = graphc.trace(fn, *args, **kwargs)
    result = run_passes(graph, verify=True)
    assert len(result.graph.nodes) < len(graph.nodes)
    got, want = graphc.evaluate(result.graph, *args, **kwargs), graphc.evaluate(graph, *args, **kwargs)
    if (module, func) == ("graphc.models.llama", "train_step"):  # an Adam step
        assert_adam_step_close(got, want, lr=kwargs["lr"], terms=160)  # the longest sum: the FFN's 160 products
    else:
        assert_same_pytree(got, want)
    again = run_passes(result.graph)
    assert str(again.graph) == str(result.graph), "the pipeline is not idempotent"


def test_gpt_gelu_cube_becomes_multiplies():
    from graphc.models import gpt

    args, kwargs = gpt.example_args()
    graph = graphc.optimize(graphc.trace(gpt.gpt, *args, **kwargs))
    assert not any(n.op.name == "pow" for n in graph.nodes)


def test_fold_builds_one_constant_from_constants():
    def f(x):
        scale = np.ones_like(x) * 2.0  # traced ops whose operands are all constants
        mask = np.triu(np.ones_like(x), k=1) * -1e9
        return x * scale + mask

    x = np.ones((3, 3))
    graph = graphc.trace(f, x)
    optimized = graphc.optimize(graph, passes=["fold_constants", "simplify", "cse", "dce"], verify=True)
    assert [n.op.name for n in optimized.nodes] == ["constant", "constant", "mul", "add"]
    np.testing.assert_array_equal(graphc.evaluate(optimized, x), f(x))


def test_passes_run_inside_regions():
    def f(x):
        if x.sum() > 0:
            y = np.exp(x) + np.exp(x) + x**2 * 1.0
        else:
            y = x
        return y

    graph = graphc.trace(f, np.ones(3))
    optimized = graphc.optimize(graph, verify=True)
    cond = next(n for n in optimized.nodes if n.op.name == "cond")
    from graphc.core.ir import walk

    names = [n.op.name for n in walk(cond.regions[0].nodes)]
    assert names.count("exp") == 1 and "pow" not in names and "fused" in names
    for x in (np.ones(3), -np.ones(3)):
        np.testing.assert_array_equal(graphc.evaluate(optimized, x), f(x))


def test_dump_dir_has_one_file_per_stage(tmp_path):
    from graphc.models import mlp

    args, _ = mlp.example_args(batch=4, sizes=(5, 4, 3))
    run_passes(graphc.trace(mlp.mlp, *args), dump_dir=str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{i:02d}-{n}.gir" for i, n in enumerate(("traced", *DEFAULT_PASSES))]
    for p in tmp_path.iterdir():
        graphc.parse(p.read_text())


def test_unknown_pass_is_an_error():
    from graphc.models import mlp

    args, _ = mlp.example_args(batch=4, sizes=(5, 4, 3))
    with pytest.raises(
        graphc.GraphcError,
        match="unknown pass 'nope'; passes: fold_constants, simplify, cse, batch_projections, batch_products, batch_windows",
    ):
        graphc.optimize(graphc.trace(mlp.mlp, *args), passes=["nope"])


def test_cli_stage():
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "graphc.cli", "ir", "models/gpt.py:gpt", "--after", "dce"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "pow(" not in res.stdout and res.stdout.startswith("graph @gpt(")
    fused = subprocess.run(
        [sys.executable, "-m", "graphc.cli", "ir", "models/gpt.py:gpt", "--after", "fuse"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fused.returncode == 0 and "fused(" in fused.stdout


def _kind(node):
    """What ``find_clusters`` reads of a node, asked of the functions themselves."""
    from graphc.passes.fuse import fusable, is_row_reduction, touches_bfloat16

    return (not node.regions and fusable(node), touches_bfloat16(node), is_row_reduction(node))


def _facts(kind):
    return (kind.fusable, kind.low, kind.row_reduction)


@given(random_graphs(max_nodes=12), st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_kinds_remembered_agree_with_the_node_on_random_graphs(graph, _seed):
    """``find_clusters`` remembers ``node_kind`` (fusable, touches bfloat16, a row reduction) per
    (op, operand and result types, reduced axes): all it reads of a node, so the remembered
    answer is the node's own."""
    from graphc.passes.fuse import _kinds_remembered

    kind_of = _kinds_remembered()
    for node in graph.nodes:
        assert _facts(kind_of(node)) == _kind(node)


def test_kinds_remembered_tell_apart_what_the_node_kind_reads():
    """Nodes of one op on one operand type that ``node_kind`` tells apart by their reduced axes
    (a row reduction or not) or their result type (float16 has no kernel), asked in both orders,
    and a bfloat16 training step's nodes each asked twice (the second answer from the memo)."""
    from graphc.models import gpt3
    from graphc.passes.fuse import _kinds_remembered

    def f(x):
        return x.sum(axis=1), x.sum(axis=0), x.astype(np.float64), x.astype(np.float16)

    graph = graphc.trace(f, np.ones((4, 4), np.float32))
    want = [_kind(node) for node in graph.nodes]
    assert [w[0] for w in want] == [True, False, True, False]
    assert [w[2] for w in want] == [True, False, False, False]
    assert [_facts(_kinds_remembered()(node)) for node in graph.nodes] == want
    kind_of = _kinds_remembered()
    assert [_facts(kind_of(node)) for node in reversed(graph.nodes)] == want[::-1]
    args, kw = gpt3.example_train_specs_small()
    graph = graphc.trace(gpt3.train_step, *args, **kw)
    kind_of = _kinds_remembered()
    want = [_kind(node) for node in graph.nodes]
    assert any(w[1] for w in want) and not all(w[1] for w in want)  # bfloat16 parameters, float32 moments
    assert [_facts(kind_of(node)) for node in graph.nodes] == want == [_facts(kind_of(n)) for n in graph.nodes]


def test_optimize_leaves_no_dropped_nodes_for_the_collector(monkeypatch):
    """``optimize`` unlinks the nodes its passes made and later dropped from their results (a node
    and its results hold each other): with the traced and the optimized graph still alive, the
    cycle collector finds no node left behind; both graphs still verify and compute the same."""
    import gc

    from graphc.core.ir import Node
    from graphc.models import mlp
    from graphc.passes import manager

    args, kwargs = mlp.example_train_args()
    graph = graphc.trace(mlp.train_step, *args, **kwargs)

    def nodes_left_behind(release) -> tuple[int, int]:
        monkeypatch.setattr(manager, "release_dropped", release)
        trace = manager.run_passes(graph)  # how many nodes the passes made that the output lacks
        made = {n for s in trace.snapshots[1:-1] for n in s.graph.nodes} - set(graph.nodes) - set(trace.graph.nodes)
        del trace
        gc.collect()
        was = gc.isenabled()
        gc.disable()
        try:
            out = graphc.optimize(graph)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = sum(isinstance(o, Node) for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            if was:
                gc.enable()
        out.verify()
        graph.verify()
        assert_same_pytree(graphc.evaluate(out, *args, **kwargs), graphc.evaluate(graph, *args, **kwargs))
        return len(made), left

    made, left = nodes_left_behind(manager.release_dropped)
    assert made > 0 and left == 0
    assert nodes_left_behind(lambda trace: None) == (made, made)  # what the release spares the collector
