"""Tying repeated layers (one ILP variable per structure class, its strategy stamped on every
layer of the class: passes/sharding/groups.py ``shrink_groups``) against every item with its own
variable: on small models the tied plan costs what the untied one costs, within the solver's
stopping gap, and the tied plan's results equal numpy's."""

import pytest

import graphc
from graphc.models import gpt, gpt3, llama
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, solve_problem, state_ties
from graphc.passes.sharding.groups import shrink_groups
from graphc.passes.sharding.milp import REL_GAP
from tests.helpers import assert_adam_step_close

CASES = {
    "gpt tp=2": (gpt.train_step, gpt.example_train_args(batch=4, seq=8, d=32, n_layer=3), {"tp": 2}, 0.999),
    "gpt3 tp=2": (gpt3.train_step, gpt3.example_train_args(batch=2, seq=8, d=32, n_layer=3), {"tp": 2}, 0.95),
    "gpt3 dp=2,tp=2": (
        gpt3.train_step,
        gpt3.example_train_args(batch=4, seq=8, d=32, n_layer=3),
        {"dp": 2, "tp": 2},
        0.95,
    ),
    "llama tp=2": (
        llama.train_step,
        llama.example_train_args(batch=2, seq=8, d=32, n_layer=3, n_head=4, n_kv_head=2, ffn=64),
        {"tp": 2},
        0.999,
    ),
}


def _step(name):
    fn, (args, kw), axes, b2 = CASES[name]
    static = tuple(k for k in kw if k in ("n_head", "n_kv_head"))
    return graphc.parallelize(fn, mesh=axes, static_argnames=static, cache=False), fn, args, kw, b2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt tp=2", "gpt3 tp=2", "llama tp=2"])
def test_tied_layers_cost_what_untied_ones_cost(name):
    step, _fn, args, kw, _b2 = _step(name)
    graph = step.trace_optimized(*args, **kw)[1]
    problem = build_problem(graph, step.mesh, PlanOptions(), ties=state_ties(graph))
    groups, _of = shrink_groups(problem)
    assert len(groups) < len(problem.items) / 2  # three blocks, most of them one class
    untied = solve_problem(problem, PlanOptions(shrink=False))
    tied = solve_problem(problem, PlanOptions(shrink=True))
    assert untied.status == tied.status == "optimal"
    # tying restricts the choices: never below what the untied solve proved; and here (interior
    # layers alike, the boundary layers their own classes) no dearer than its stopping gap
    assert tied.objective >= untied.bound * (1 - 1e-12)
    assert tied.objective <= untied.objective * (1 + 2 * REL_GAP)
    assert problem.evaluate(tied.choice)["total_s"] == pytest.approx(tied.objective, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt3 dp=2,tp=2"])
def test_the_tied_plan_runs_equal_to_numpy(name):
    step, fn, args, kw, b2 = _step(name)
    plan = step.plan(*args, **kw)
    assert plan.solver.sizes["groups"] < plan.solver.sizes["items"] / 2  # the blocks were tied
    got = step(*args, **kw)
    want = fn(*args, **kw)
    d = args[0]["wte"].shape[1]
    assert_adam_step_close(got, want, lr=kw.get("lr", 6e-5), terms=4 * 4 * d, b2=b2)


def _classes_by_tuples(problem, rounds):
    """``structure_classes`` as its definition reads: each round interns the tuple (label, the
    in-edges by operand position, the out-edges sorted) of every item."""
    from graphc.passes.sharding.groups import _Interner, _item_label, _layer_names

    intern, strategy_labels, names = _Interner(), {}, _layer_names(problem)
    label = [_item_label(it, intern, strategy_labels, names) for it in problem.items]
    ins: list[list] = [[] for _ in problem.items]
    outs: list[list] = [[] for _ in problem.items]
    for e in problem.edges:
        ins[e.dst].append((e.dst_in, e.src_out, e.src))
        outs[e.src].append((e.src_out, e.dst_in, e.dst))
    for x in ins:
        x.sort()
    for _ in range(rounds):
        label = [
            intern(
                (
                    label[i],
                    tuple((a, b, label[s]) for a, b, s in ins[i]),
                    tuple(sorted((a, b, label[d]) for a, b, d in outs[i])),
                )
            )
            for i in range(len(problem.items))
        ]
    return label


def _partition(labels):
    first: dict = {}
    return [first.setdefault(x, len(first)) for x in labels]


@pytest.mark.parametrize("name", ["gpt3 dp=2,tp=2", "llama tp=2"])
def test_structure_classes_are_the_tuple_refinement(name):
    """The array refinement (``_refine``) splits the items exactly as interning the tuples does,
    round by round (the classes differ between rounds, so every round is checked)."""
    from graphc.passes.sharding.groups import structure_classes

    step, _fn, args, kw, _b2 = _step(name)
    graph = step.trace_optimized(*args, **kw)[1]
    problem = build_problem(graph, step.mesh, PlanOptions(), ties=state_ties(graph))
    sizes = []
    for rounds in range(5):
        want = _partition(_classes_by_tuples(problem, rounds))
        assert _partition(structure_classes(problem, rounds)) == want
        sizes.append(max(want) + 1)
    assert sizes[0] < sizes[-1] < len(problem.items)  # refinement split classes, and layers still tie
