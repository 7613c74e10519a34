"""The sharding ILP's sums made in one pass (issue 29; passes/sharding/ilp.py ``objective_terms``:
``_edge_sums``, ``_ordered_sums``, ``_compute_vectors``; offload_terms.py ``_compute_expr``) equal,
to the bit and in the same order, the term-by-term sums over every edge they replace:
floating-point addition is not associative, and the plans must not change."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, shrink, state_ties
from graphc.passes.sharding import ilp
from tests.passes.offload_models import gpt3_tied_tp2_step

A100 = get_profile("a100-sxm")  # a host tier: the offload columns exist


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()  # -0.0 and 0.0 told apart


def test_ordered_sums_add_each_entry_term_by_term():
    rng = np.random.default_rng(7)
    shapes = [(1, 3), (4, 2), (2, 2), (5, 1)]
    slot = {(k, k + 10): k for k in range(len(shapes))}
    parts, counts, at = [], [], []
    for _ in range(300):  # magnitudes far apart: the order of the additions shows in the sums
        k = int(rng.integers(len(shapes)))
        parts.append(rng.standard_normal(shapes[k][0] * shapes[k][1]) * 10.0 ** rng.integers(-9, 9))
        counts.append(int(rng.integers(1, 4)))
        at.append(k)
    parts[0][0] = -0.0  # a first term's negative zero is kept (the matrix is the term itself)
    counts[0] = 1
    start = np.cumsum([0] + [len(x) for x in parts])[:-1]
    got = ilp._ordered_sums(slot, shapes, np.concatenate(parts), start, counts, at)
    want: dict = {}
    for part, n, k in zip(parts, counts, at):
        m = (part * n).reshape(shapes[k])
        key = (k, k + 10)
        want[key] = want[key] + m if key in want else m
    assert list(got) == list(slot)
    assert all(_bits(got[key]) == _bits(want[key]) for key in want)
    assert ilp._ordered_sums({}, [], np.zeros(0), [], [], []) == {}


def test_numbered_numbers_rows_in_their_lexicographic_order():
    """``ilp._numbered``'s numbers are the rows' ranks among the distinct rows, whether a column is
    its own digit (small non-negative integers) or numbered by its distinct values first (object
    ids, negative numbers), and when the radix passes 2**62 on the way."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 200))
        cols = [
            rng.integers(0, 3, n),  # small: a digit of its own (every combination of these shows)
            rng.integers(0, 3, n),
            rng.integers(-3, 5, n),  # negative: numbered first
            rng.integers(0, 4 * n + 40, n),  # may pass the small bound: either way
            rng.integers(2**40, 2**40 + 6, n),  # ids: numbered first
            *(rng.integers(0, 2**20, n) for _ in range(4)),  # large radices: renumbered before 2**62
        ]
        want = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)[1].reshape(-1)
        assert ilp._numbered(cols).tolist() == want.tolist()


@pytest.fixture(scope="module")
def problem():
    """A 3-layer GPT-3 step with three tied layers on tp=2 (offload candidates on the A100 profile)."""
    graph = gpt3_tied_tp2_step()
    return build_problem(graph, Mesh({"tp": 2}, profile=A100), PlanOptions(), ties=state_ties(graph))


def edge_terms(p, of, maps):
    """(group pair, cost table, its rows and columns, edge count) per distinct edge term, in the
    order first met, edge by edge (each edge's table looked up on its own): the loop
    ``ilp._edge_sums`` replaces."""
    seen: dict = {}
    for e in p.edges:
        small, ui, vi = p.costs.edge_table(e)
        mu, mv = maps[e.src], maps[e.dst]
        ends = (id(p.items[e.src].strategies), e.src_out, id(p.items[e.dst].strategies), e.dst_in)
        key = (of[e.src], of[e.dst], id(small), *ends, id(mu), id(mv))
        if key in seen:
            seen[key][4] += 1
        else:
            seen[key] = [(of[e.src], of[e.dst]), small, ui[mu], vi[mv], 1]
    return seen.values()


def term_by_term(p, groups, of, terms=edge_terms):
    """objective_terms as it was: each distinct term's matrix added to its pair's, one at a time."""
    maps = {i: m for g in groups for i, m in g.members}
    seen: dict = {}  # equal terms counted, then added once times their count
    for i, m in maps.items():
        times = p.costs.compute_times(i)
        seen.setdefault((of[i], id(times), id(m)), [times, m, 0])[2] += 1
    vec = [np.zeros(g.size) for g in groups]
    for (gi, _t, _m), (times, m, n) in seen.items():
        vec[gi] += n * times[m]
    pair: dict = {}
    for (gu, gv), small, rows, cols, n in terms(p, of, maps):
        if gu == gv:
            vec[gu] += n * small[rows, cols]
            continue
        sub = small[rows[:, None], cols]
        if not sub.any():
            continue
        m = sub * n
        if gu > gv:
            gu, gv, m = gv, gu, m.T
        pair[(gu, gv)] = pair[(gu, gv)] + m if (gu, gv) in pair else m
    ilp.fold_single_sides(groups, vec, pair)  # the same fold (not what is checked: the sums)
    return vec, pair


@pytest.mark.parametrize("tied", [True, False])
def test_objective_terms_equal_the_term_by_term_sums(problem, tied):
    groups, of = shrink(problem, tied)
    vec, pair, _maps = ilp.objective_terms(problem, groups, of)
    want_vec, want_pair = term_by_term(problem, groups, of)
    assert [_bits(v) for v in vec] == [_bits(v) for v in want_vec]
    assert list(pair) == list(want_pair)  # the local search visits the pairs in this order
    assert all(_bits(pair[k]) == _bits(want_pair[k]) for k in pair)
    if tied:
        assert any(len(g.members) == 3 for g in groups)  # the layers' items share groups: sums of repeats


def test_the_backward_compute_expression_equals_the_loop_over_items(problem):
    groups, of = shrink(problem)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    model = ilp._Model(problem, groups, of, vec, pair, maps, "highs", offload=True)
    terms = model.offload
    items = [i for i, it in enumerate(problem.items) if it.kind == "node" and it.node.part == "backward"]
    const, coef = terms._compute_expr(items)
    want_const, want = 0.0, {}
    for i in items:
        vals = (problem.costs.compute_times(i) * model.SCALE)[maps[i]]
        xs = model.x[of[i]]
        if xs is None:
            want_const += float(vals[0])
            continue
        for s, val in enumerate(vals):
            if val:
                want[int(xs[s])] = want.get(int(xs[s]), 0.0) + float(val)
    assert const == want_const and list(coef.items()) == list(want.items())
    assert len(terms.cands) and len(set(terms.o.tolist())) < len(terms.cands)  # tied candidates share binaries
