"""A plan's alternatives priced when first read (issue 29; passes/sharding/pending.py,
build.py): the plan, its JSON and every explanation equal those of the plan whose alternatives
are priced while it is made, on a 12-layer GPT training step whose gradient buckets the plan
re-prices after solving (so the cost model the alternatives need is gone from the problem by
the time they are read); a plan made holds its problem until read, or until the next plan is
made; it pickles as the priced tuples."""

from __future__ import annotations

import gc
import json
import pickle

import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.models import gpt
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, solve_problem, state_ties
from graphc.passes.sharding import build
from graphc.passes.sharding.build import plan_from_solution
from graphc.passes.sharding.pending import LazyAlternatives

OPTIONS = PlanOptions(bucket_bytes=2**30)


@pytest.fixture(scope="module")
def solved():
    """(graph, mesh, solution) of a 12-layer GPT step on dp=2,tp=2."""
    args, kw = gpt.example_train_args(batch=4, seq=8, d=32, n_layer=12, n_head=2)
    step = graphc.parallelize(
        gpt.train_step, mesh=Mesh("dp=2,tp=2", profile=MachineProfile.default()), static_argnames=("n_head", "lr")
    )
    graph = step.trace_optimized(*args, **kw)[1]
    problem = build_problem(graph, step.mesh, OPTIONS, ties=state_ties(graph))
    return graph, step.mesh, solve_problem(problem, OPTIONS)


def _plan(solved, now: bool):
    graph, mesh, sol = solved
    problem = build_problem(graph, mesh, OPTIONS, ties=state_ties(graph))  # each plan its own problem
    share = problem.costs.bucket_share_bytes
    plan = plan_from_solution(problem, sol, OPTIONS, 0.0, explain_now=now)
    return plan, share, problem.costs.bucket_share_bytes


def _doc(plan) -> dict:
    doc = json.loads(plan.to_json(alternatives=True))  # whatever the plan's size
    doc["solver"].pop("seconds")  # the only field that is a measurement
    return doc


def test_lazy_alternatives_equal_those_priced_while_planning(solved):
    eager, _, _ = _plan(solved, now=True)
    lazy, solver_share, plan_share = _plan(solved, now=False)
    assert solver_share != plan_share  # the solver's bucket estimate is re-priced by the plan
    assert isinstance(lazy.nodes[0].alternatives, LazyAlternatives)
    assert _doc(lazy) == _doc(eager)  # choices, costs, alternatives: the whole file
    assert lazy.cost == eager.cost and lazy.summary() == eager.summary()
    explained = [x.name for x in lazy.inputs[:3]] + [n.name for n in lazy.nodes if len(n.alternatives) > 1][:20]
    assert len(explained) > 10
    for name in explained:
        assert lazy.explain(name) == eager.explain(name)
    assert any(a.step_delta_s != a.delta_s for n in lazy.nodes for a in n.alternatives)  # buckets priced apart


def test_a_plan_holds_its_problem_until_read_or_the_next_plan(solved):
    first, _, _ = _plan(solved, now=False)
    pending = first.nodes[0].alternatives._pending
    assert not pending.priced
    second, _, _ = _plan(solved, now=False)  # making another plan prices the unread one
    assert pending.priced and pending._price is None  # and lets its problem go
    assert not second.nodes[0].alternatives._pending.priced
    assert [n.alternatives for n in first.nodes] == [n.alternatives for n in second.nodes]
    del second
    gc.collect()
    assert build._UNREAD and build._UNREAD[0]() is None  # a plan dropped unread is never priced


def test_lazy_alternatives_pickle_as_tuples(solved):
    plan, _, _ = _plan(solved, now=False)
    node = next(n for n in plan.nodes if n.alternatives)
    copy = pickle.loads(pickle.dumps(node))
    assert type(copy.alternatives) is tuple and copy == node and copy.alternatives == node.alternatives
    assert hash(copy) == hash(node)
