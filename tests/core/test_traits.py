"""Op traits (graphc/core/traits.py) are the one source of truth for what an op is: every op
declares how its results relate to its operands' buffers, and what it declares is what its
numpy implementation, the executor's step for it and the planner's memory model all do."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphc.core.ir import OpDef
from graphc.core.traits import (
    Collective,
    Constant,
    ControlFlow,
    DeviceLocal,
    Elementwise,
    FreshResult,
    LinearIn,
    Reduction,
    ShardingConstraint,
    ViewOf,
)
from graphc.ops import OPS, REGISTRY
from graphc.passes.sharding.memory import view_roots
from graphc.runtime.executor import BufferPool, Program
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import quick_share, quiet

# what a result may be, one of these per op: a new buffer, a view of an operand, or an op whose
# results the runtime makes otherwise (a literal, a collective, a device-local step, regions, a
# sharding pin: its operand itself on one device, a redistributed piece on a mesh)
ALIASING = (FreshResult, ViewOf, Constant, Collective, DeviceLocal, ControlFlow, ShardingConstraint)
RUN_ALONE = sorted(n for n, op in REGISTRY.items() if not (op.has(Collective) or op.has(DeviceLocal)))
VIEW_OPS = sorted(n for n, op in REGISTRY.items() if op.has(ViewOf))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_says_what_its_results_are(name):
    op = REGISTRY[name]
    declared = [k.__name__ for k in ALIASING if op.has(k)]
    assert len(declared) == 1, f"{name} declares {declared or 'none'} of {[k.__name__ for k in ALIASING]}"
    assert op.has(Elementwise) == (op.kind == "elementwise")
    assert op.has(Reduction) == (op.kind == "reduction")


TRAIT_CLASSES = sorted({cls for op in REGISTRY.values() for t in op.traits for cls in type(t).__mro__}, key=str)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_has_and_trait_answer_as_isinstance_over_the_traits(name):
    """``has`` and ``trait`` read a table made from the traits (ir.py ``OpDef._kinds``): they
    answer what a scan of the traits with isinstance answers, base classes (Trait) included."""
    op = REGISTRY[name]
    for kind in (*TRAIT_CLASSES, Constant, Reduction):
        first = next((t for t in op.traits if isinstance(t, kind)), None)
        assert op.has(kind) == (first is not None)
        assert op.trait(kind) is first


def test_has_follows_traits_set_after_the_first_question():
    op = OpDef("traits_probe", "elementwise", lambda ts: ts, lambda x: x, traits=(Elementwise(),))
    assert op.has(Elementwise) and not op.has(Reduction)
    op.traits = (Reduction("add"), FreshResult())
    assert op.has(Reduction) and op.trait(Reduction) == Reduction("add") and not op.has(Elementwise)


def test_ops_are_named_once():
    assert OPS.transpose is REGISTRY["transpose"] and OPS.slice_ is OPS.slice
    with pytest.raises(AttributeError, match="no op named 'transpos'"):
        _ = OPS.transpos


def _run_steps(graph, inputs):
    """Every node's operand and result arrays as the executor's steps compute them (not the
    results it hands out, which it copies where they would alias: tests/runtime/test_result_aliasing.py)."""
    program = Program(graph.inputs, graph.nodes, graph.outputs, BufferPool(), {})
    env = dict(zip(graph.inputs, inputs))
    seen = []
    for node in graph.nodes:
        args = [env[v] for v in node.inputs]
        if node.op.has(Constant):
            outs = [node.attrs["value"]]
        else:
            outs = program._make_step(node, {})(*args)  # noqa: SLF001 - the executor's own step function
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        env.update(zip(node.outputs, outs))
        seen.append((node, args, outs))
    return seen


def _check(graph, seed):
    roots = view_roots(graph)  # the planner's memory model: which values look into another's buffer
    for node, args, outs in quiet(_run_steps, graph, random_inputs(graph, seed)):
        for value, out in zip(node.outputs, outs):
            out = np.asarray(out)
            shares = any(np.shares_memory(out, np.asarray(a)) for a in args)
            if node.op.has(FreshResult):
                assert not shares, f"{node.op.name} declares FreshResult but its result is a view of an operand"
                assert value not in roots
            if out.size == 0 or not any(np.asarray(a).size for a in args):
                continue  # nothing to share
            if value in roots:  # the planner counts no bytes for it: it must really be a view
                assert shares, f"the planner counts {node.op.name}'s result as a view, the executor copies"
            elif node.op.has(ViewOf):
                # the planner counts bytes: numpy copied (a reshape of a strided view), or it could not
                # tell that numpy would not (a conservative count, never an under-count)
                operand = node.inputs[node.op.trait(ViewOf).operand]
                assert not shares or (operand in roots or operand.producer is not None), node.op.name


@pytest.mark.parametrize("name", quick_share(RUN_ALONE))
def test_declared_aliasing_is_what_the_executor_does(name):
    # (the fuse pass makes no kernel over empty arrays: passes/fuse.py fusable)
    @settings(max_examples=30, deadline=None)
    @given(random_graphs(max_nodes=4, ops=[name], min_dim=1 if name == "fused" else 0), st.integers(0, 1000))
    def check(graph, seed):
        _check(graph, seed)

    check()


@settings(max_examples=150, deadline=None)
@given(random_graphs(max_nodes=8, ops=[*VIEW_OPS, "add", "convert", "reduce_sum"]), st.integers(0, 1000))
def test_chains_of_views_agree_between_planner_and_executor(graph, seed):
    """Views of views (a transpose then a reshape copies in numpy; a slice of a slice does not),
    and views of what an elementwise op or a reduction made from a view."""
    _check(graph, seed)


@pytest.mark.parametrize(
    "middle",
    [
        "add(%x, %t) : f32[4,3,2]",  # hypothesis found it: the sum is laid out as the transpose
        "convert(%t, dtype=f64) : f64[4,3,2]",
        "reduce_sum(%t, axes=(1,), keepdims=true) : f32[4,1,2]",
    ],
)
def test_reshape_of_a_result_laid_out_as_a_strided_operand_is_counted(middle):
    """numpy's ufuncs and reductions lay a result out as their operands (``order="K"``), so a
    reshape of one made from a transpose copies: the planner must count its bytes."""
    from graphc.textir import parse

    dtype, dims = middle.rsplit(":", 1)[1].strip()[:-1].split("[")
    n = int(np.prod([int(d) for d in dims.split(",")]))
    graph = parse(
        "graph @g(%x : f32[4,3,2], %y : f32[2,3,4]) {\n"
        "  %t = transpose(%y, perm=(2, 1, 0)) : f32[4,3,2]\n"
        f"  %m = {middle}\n"
        f"  %r = reshape(%m, shape=({n},)) : {dtype}[{n}]\n"
        "  return %r\n}"
    )
    reshaped = graph.nodes[-1].outputs[0]
    assert reshaped not in view_roots(graph)
    _check(graph, 0)


def test_linear_operands_come_from_the_trait():
    from graphc.ops.dims import linear_operands

    for name, op in REGISTRY.items():
        if not op.has(LinearIn):
            continue
        assert op.trait(LinearIn).operands or op.trait(LinearIn).of_node is not None, name
    assert OPS.reduce_sum.trait(LinearIn).on_meshes and not OPS.matmul.trait(LinearIn).on_meshes

    class _Node:  # linear_operands only reads the op, operands and results
        op = OPS.add
        inputs = outputs = ()

    assert linear_operands(_Node()) == (frozenset({0, 1}),)
