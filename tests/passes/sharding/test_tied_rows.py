"""What grows with depth in the sharding ILP of a tied transformer (issue 29), and what is done
once: the state ties of repeated layers give equal rows, added once (passes/sharding/ilp.py
``_add_ties``), with the optimum of the program that has every one of them (with and without a
memory limit, with and without the offload columns); the offload candidates (one per parameter,
passes/sharding/offload_terms.py ``candidates``) found in one pass over the program equal the
per-parameter scans they replace."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, shrink, state_ties
from graphc.passes.sharding import ilp
from graphc.passes.sharding.offload_terms import candidates
from graphc.passes.sharding.roles import update_nodes
from graphc.passes.sharding.zero import param_groups, state_positions
from tests.passes.offload_models import gpt3_tied_tp2_step
from tests.passes.sharding.test_ordered_sums import term_by_term

A100 = get_profile("a100-sxm")  # a host tier: the offload columns exist
MESH = {"tp": 2}


@pytest.fixture(scope="module")
def graph():
    """A 3-layer GPT-3 step in bfloat16 with float32 Adam moments: three tied layers (on ``MESH``)."""
    return gpt3_tied_tp2_step()


def _solve(graph, limit, offload, distinct, monkeypatch):
    monkeypatch.setattr(ilp, "DISTINCT_TIE_ROWS", distinct)
    options = PlanOptions(memory_limit=limit, recompute="off", time_limit=120.0)
    problem = build_problem(graph, Mesh(MESH, profile=A100), options, ties=state_ties(graph))
    groups, of = shrink(problem)
    sol = ilp.solve(problem, groups, of, limit, options.time_limit, offload=offload)
    return sol, problem.memory.peak(sol.choice)[0]


@pytest.fixture(scope="module")
def free_peak(graph):
    with pytest.MonkeyPatch.context() as mp:
        return _solve(graph, None, False, True, mp)[1]


@pytest.mark.parametrize(
    ("share", "offload"),
    [
        (None, False),
        (None, True),
        # a limit that binds: memory rows; the offload columns under a limit take minutes, left out
        pytest.param(0.9, False, marks=pytest.mark.long),  # 12 s loaded
    ],
)
def test_tie_rows_once_keep_the_optimum_of_every_tie_row(graph, free_peak, share, offload, monkeypatch):
    limit = None if share is None else int(share * free_peak)
    reduced, peak = _solve(graph, limit, offload, True, monkeypatch)
    whole, whole_peak = _solve(graph, limit, offload, False, monkeypatch)
    assert reduced.status == whole.status == "optimal"
    assert reduced.objective == pytest.approx(whole.objective, rel=1e-9, abs=1e-15)
    assert reduced.stats["constraints"] < whole.stats["constraints"]  # the layers' equal rows, once
    if limit is not None:
        assert peak <= limit and whole_peak <= limit
        assert reduced.stats["memory_points"] > 0  # the limit binds: memory rows were needed


def _candidates_per_parameter(p):
    """offload_terms.candidates as it was: each parameter's update nodes and live ranges found by a
    scan of the whole program (quadratic in depth); the reference the one-pass version must equal."""
    graph, state = p.graph, state_positions(p)
    update = update_nodes(graph)
    input_item = {it.index: i for i, it in enumerate(p.items) if it.kind == "input"}
    node_item = {it.node: i for i, it in enumerate(p.items) if it.kind == "node"}
    tied = dict(p.ties)
    live = p.memory.live_ranges()
    out = []
    for pg in param_groups(graph, state):
        if pg.param is None or not pg.states or pg.param not in input_item:
            continue
        param = graph.inputs[pg.param]
        mine = {param, *(graph.inputs[k] for k in pg.states), *pg.gradients}
        nodes = []
        for node in graph.nodes:
            if node in update and node.outputs and node.outputs[0].type.shape == param.type.shape:
                if any(v in mine for v in node.inputs):
                    nodes.append(node)
                    mine.update(node.outputs)
        back = tied.get(input_item[pg.param])
        moved = {graph.inputs[k] for k in pg.states} | {o for n in nodes for o in n.outputs}
        if back is not None:
            moved.discard(p.items[back].value)
        entries = tuple(e for e in live if e[0] in moved and e[1] not in p.remat)
        out.append((pg.param, tuple(node_item[n] for n in nodes if n in node_item), entries))
    return out


@pytest.mark.parametrize("zero", [0, 1])
def test_offload_candidates_in_one_pass_equal_the_per_parameter_scans(graph, zero):
    options = PlanOptions(zero=zero)
    p = build_problem(graph, Mesh({"dp": 2, "tp": 2}, profile=A100), options, ties=state_ties(graph))
    got = [(c.param, c.update_items, c.entries) for c in candidates(p)]
    want = _candidates_per_parameter(p)
    assert len(got) == 3 * 12 + 4  # 12 parameters a layer, the embeddings and the final norm's
    assert all(update for _param, update, _entries in got)
    assert got == want


def _edge_terms_per_edge(p, of, maps):
    """The edge terms as they were: every edge's table looked up (``CostModel.edge_table``), its
    terms told apart by their ends' distinct specs, one object per (Strategies object, result or
    operand) then (twins share them now: ``Strategies.twin``)."""
    seen: dict[tuple, list] = {}
    for e in p.edges:
        small, ui, vi = p.costs.edge_table(e)
        mu, mv = maps[e.src], maps[e.dst]
        ends = (id(p.items[e.src].strategies), e.src_out, id(p.items[e.dst].strategies), e.dst_in)
        key = (of[e.src], of[e.dst], id(small), *ends, id(mu), id(mv))
        hit = seen.get(key)
        if hit is None:
            seen[key] = [(of[e.src], of[e.dst]), small, ui[mu], vi[mv], 1]
        else:
            hit[4] += 1
    return seen.values()


def test_edge_tables_made_once_per_strategy_tuple_give_the_same_objective_bit_for_bit(graph, monkeypatch):
    """On a GPU profile fused nodes keep a Strategies object each (problem.py ``_fused``) over one
    shared tuple: the tables are looked up once per tuple, and the objective's vectors and pair
    matrices are the ones every edge's own lookup gives, to the bit."""
    options = PlanOptions(recompute="off")
    fresh = build_problem(graph, Mesh(MESH, profile=A100), options, ties=state_ties(graph))
    groups, of = shrink(fresh)
    calls = []
    lookup = type(fresh.costs).edge_table

    def counted(self, e):
        calls.append(e)
        return lookup(self, e)

    monkeypatch.setattr(type(fresh.costs), "edge_table", counted)
    vec, pair, _maps = ilp.objective_terms(fresh, groups, of)
    once = len(calls)
    other = build_problem(graph, Mesh(MESH, profile=A100), options, ties=state_ties(graph))
    vec0, pair0 = term_by_term(other, *shrink(other), terms=_edge_terms_per_edge)
    assert len(calls) - once == len(other.edges) > 2 * once  # far fewer lookups
    assert len(vec) == len(vec0) and all(np.array_equal(a, b) for a, b in zip(vec, vec0))
    assert pair.keys() == pair0.keys() and all(np.array_equal(pair[k], pair0[k]) for k in pair)


@pytest.mark.parametrize("offload", [False, True])
def test_a_solve_from_the_relaxation_keeps_the_optimum(graph, offload, monkeypatch):
    # without a memory limit the LP relaxation is solved first (memrows.lp_start): when the plan
    # its point rounds to meets its optimum no integer solve runs; the optimum is the same
    from graphc.passes.sharding import memrows

    got = {}
    for first in (True, False):
        monkeypatch.setattr(memrows, "LP_FIRST", first)
        got[first] = _solve(graph, None, offload, True, monkeypatch)[0]
    assert got[True].status == got[False].status == "optimal"
    assert got[True].objective == pytest.approx(got[False].objective, rel=2e-4)  # both within REL_GAP
    assert got[True].bound <= got[True].objective


def test_per_tuple_tables_equal_the_per_item_ones_and_twins_keep_objects_of_their_own(graph):
    """Items over one strategy tuple (fused nodes of repeated layers, their recompute lists, the
    tied state's inputs and outputs: ``Strategies.twin``) share their bytes per strategy
    (``MemoryModel.strategy_bytes``), each equal to ``value_bytes``; each keeps its own object and
    compute-time array (the ILP tells their terms apart by object); ``positions`` is the
    program order's."""
    options = PlanOptions(memory_limit=2**40)  # a limit: recompute "auto" gives recompute lists
    p = build_problem(graph, Mesh(MESH, profile=A100), options, ties=state_ties(graph))
    mem = p.memory
    assert p.remat
    for v, i, _a, _b in mem.live_ranges():
        per = mem.strategy_bytes(v, i)
        assert per.tolist() == [float(mem.value_bytes(v, i, s)) for s in range(len(p.items[i].strategies))]
    by_tuple: dict[int, list] = {}
    for it in p.items:
        by_tuple.setdefault(id(it.strategies.as_tuple), []).append(it.strategies)
    shared = [objs for objs in by_tuple.values() if len({id(o) for o in objs}) > 1]
    assert len(shared) > 10  # twins: tuples held by several objects
    for objs in shared:
        distinct = list({id(o): o for o in objs}.values())
        assert len({id(o.compute_times) for o in distinct}) == len(distinct)
        assert all(np.array_equal(o.compute_times, distinct[0].compute_times) for o in distinct)
    remat_shared = [i for i in p.remat if len(by_tuple[id(p.items[i].strategies.as_tuple)]) > 1]
    assert remat_shared  # recompute lists made once per tuple
    grid = mem.grid
    assert mem.positions() == {item: at if grid is None else int(grid[at]) for at, item in enumerate(p.order)}
