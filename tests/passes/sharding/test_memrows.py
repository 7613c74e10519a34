"""Memory rows found on the LP relaxation before the integer solve (passes/sharding/memrows.py):
the rows are the memory model's, term for term; adding them (and the rows of the LP point's
rounded plan), starting from repaired plans and passing each lazy round's bound on change no
optimum; and the integer solve then needs no (or fewer) lazy rounds."""

from __future__ import annotations

import dataclasses
import types
import warnings

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profiles import MachineProfile, get_profile
from graphc.core.pytree import static_argnames
from graphc.models import gpt
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, shrink, solve_problem, state_ties
from graphc.passes.sharding import ilp, memrows, milp
from graphc.passes.sharding.memrows import MemoryRows, held_over, lp_memory_points, rounded, runs_over
from graphc.passes.sharding.milp import Milp, solve_milp
from graphc.passes.sharding.offload_terms import use
from tests.passes.sharding.test_remat import _two_layer_args, _two_layer_step
from tests.passes.sharding.test_zero import example, train_step

PROFILE = MachineProfile.default()
H100 = get_profile("h100-sxm")
TIME = 600.0  # seconds: every solve here is proven optimal, however loaded the machine


def _gpt_graph():
    args, kw = gpt.example_train_args(batch=2, seq=8, d=16, n_layer=1)
    return optimize_for_planning(graphc.trace(gpt.train_step, *args, **kw))


def _problem(graph, mesh: Mesh, options: PlanOptions):
    problem = build_problem(graph, mesh, options, ties=state_ties(graph))
    groups, of = shrink(problem, options.shrink)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    return problem, ilp._Model(problem, groups, of, vec, pair, maps, "highs")


def _cases():
    """(graph, mesh, options) with recomputation twins and checkpoints (a limit, recompute auto),
    with ZeRO-3's gathered copies, tied and untied."""
    p, x = _two_layer_args(batch=256, width=64)
    two = optimize_for_planning(graphc.trace(_two_layer_step, p, x))
    mlp = optimize_for_planning(graphc.trace(train_step, *example(batch=16, sizes=(16, 32, 32, 8))))
    return [
        (two, Mesh({"dp": 2}, profile=PROFILE), PlanOptions(memory_limit=10**9, time_limit=TIME)),
        (two, Mesh({"dp": 2}, profile=PROFILE), PlanOptions(memory_limit=10**9, shrink=False, time_limit=TIME)),
        (mlp, Mesh({"dp": 4}, profile=PROFILE), PlanOptions(memory_limit=10**9, zero=3, time_limit=TIME)),
        (_gpt_graph(), Mesh({"tp": 2}, profile=PROFILE), PlanOptions(memory_limit=10**9, time_limit=TIME)),
        # a host tier: below the smallest peak without offload, the solver offloads Adam state
        (mlp, Mesh({"dp": 2}, profile=H100), PlanOptions(memory_limit=10**9, time_limit=TIME)),
    ]


@pytest.fixture(scope="module")
def cases():
    return _cases()


def test_the_rows_are_the_memory_model_term_for_term(cases):
    rng = np.random.default_rng(0)
    for graph, mesh, options in cases:
        problem, model = _problem(graph, mesh, options)
        rows = MemoryRows(model)
        assert problem.remat or problem.memory.transient_terms()  # the case has the terms it is for
        for _ in range(5):
            gchoice = [int(rng.integers(g.size)) for g in model.groups]
            choice = [0] * len(problem.items)
            for gi, g in enumerate(model.groups):
                for i, m in g.members:
                    choice[i] = int(m[gchoice[gi]])
            np.testing.assert_array_equal(rows.profile(model.point(gchoice)), problem.memory.profile(choice))
        for at in rng.choice(rows.size, size=min(rows.size, 25), replace=False):
            const, idx, nb = rows.row(int(at))
            want_const, want = model.memory_expr(int(at))
            assert const == pytest.approx(want_const, abs=0.5)
            got = dict(zip(idx.tolist(), nb.tolist()))
            want = {int(model.x[g][s]): b for (g, s), b in want.items() if b}
            assert got == pytest.approx(want)


def test_runs_over_gives_each_runs_peak_largest_first():
    prof = np.array([0, 5, 9, 7, 0, 3, 12, 4, 0, 6], dtype=float)
    assert runs_over(prof, 4.0, 8) == [6, 2, 9]
    assert runs_over(prof, 4.0, 2) == [6, 2]
    assert runs_over(prof, 12.0, 8) == []
    assert runs_over(np.zeros(0), 0.0, 8) == []


def _values_only(p, choice, limit, at_most=8):
    """``ilp.held_over`` without the redistribution buffers (module doc of the test below): the
    values of a plan that reaches it fit, so nothing is over."""
    return []


def test_held_over_gives_each_runs_peak_per_buffer_level_largest_first():
    """Values [5, 6, 5, 9, 2, 7, 7], buffers of 4 held over positions 0-3 and 1-2 and of 1 over
    5-6: held [9, 14, 13, 13, 2, 8, 8]. Over 10 at 1-3, one run at two buffer levels (8 at 1-2,
    4 at 3): a row for the peak of each, largest first; nowhere over 14 (at it is not over)."""

    class Memory:
        def profile(self, choice):
            return np.array([5, 6, 5, 9, 2, 7, 7], dtype=float)

        def redistribution_buffers(self, choice):
            return [(4, 0, 3), (1, 5, 6), (4, 1, 2)]

    p = types.SimpleNamespace(memory=Memory())
    assert held_over(p, [], 10) == [(14, 1, 8), (13, 3, 4)]
    assert held_over(p, [], 10, at_most=1) == [(14, 1, 8)]
    assert held_over(p, [], 14) == []
    p.memory.profile = lambda choice: np.zeros(0)
    assert held_over(p, [], 0) == []


def _solve(problem, options, fast: bool, monkeypatch):
    """The solution, with the number of integer solves it took in ``stats["integer_solves"]`` and
    how many of them were given the last round's bound in ``stats["bounded_solves"]``. ``fast``:
    as ``solve_problem`` runs (LP rows, their rounding, repaired starts, known bounds); else lazy
    rounds alone."""
    solves = []

    def counted(*a, **k):
        if not fast:
            k.pop("known_bound", None)
        solves.append(k.get("known_bound") is not None)
        return solve_milp(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(ilp, "held_over", _values_only)
        m.setattr(ilp, "solve_milp", counted)
        if not fast:
            m.setattr(memrows, "lp_memory_points", lambda *a, **k: ([], None))
            m.setattr(memrows, "ROUNDED", False)
            m.setattr(ilp, "repaired", lambda *a, **k: None)
        sol = solve_problem(problem, options)
    sol.stats["integer_solves"] = len(solves)
    sol.stats["bounded_solves"] = sum(solves)
    return sol


@pytest.mark.parametrize("share", [0.95, 0.8, 0.6, 0.45])
def test_the_optimum_is_the_same_with_the_lp_rows_and_known_bounds(cases, share, monkeypatch):
    """Every LP row (of the relaxation's point or of the plan it rounds to) holds for every plan
    whose values fit, and a lazy round's optimum is at least the last round's bound (its rows are a
    subset), so the optimum under the limit is the one the lazy rounds alone find, and the solve
    needs no more integer rounds. Four problems, one of them offloading on a GPU profile below
    the smallest peak without offload. (The redistribution buffers' rows are left out here: each
    is this plan's buffers taken off the limit, not a row every plan that fits satisfies, so with
    them the plan found depends on the order the rows come in: docs/remat.md.)"""
    for graph, mesh, options in cases[:3] + cases[4:]:  # the GPT step's solves take a minute on a loaded machine
        free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
        unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
        limited = dataclasses.replace(options, memory_limit=int(share * unlimited))
        problem = build_problem(graph, mesh, limited, ties=state_ties(graph))
        try:
            lazy = _solve(problem, limited, False, monkeypatch)
        except graphc.PlanError as e:  # no plan fits: the same answer either way
            with pytest.raises(graphc.PlanError) as again:
                _solve(problem, limited, True, monkeypatch)
            assert again.value.min_memory_bytes == e.min_memory_bytes
            continue
        both = _solve(problem, limited, True, monkeypatch)
        assert lazy.status == both.status == "optimal" and bool(lazy.offload) == bool(both.offload)
        assert bool(both.offload) == (mesh is cases[4][1] and share < 0.5)  # the MLP on h100-sxm offloads at 45%
        assert both.objective == pytest.approx(lazy.objective, rel=2e-4)  # both within REL_GAP of the optimum
        assert problem.memory.peak(both.choice)[0] <= limited.memory_limit
        assert both.stats["integer_solves"] <= lazy.stats["integer_solves"]


@pytest.mark.parametrize("share", [0.45, 0.3])
def test_a_misvalued_start_of_an_offload_solve_is_kept_without_presolve_and_keeps_the_optimum(
    cases, share, monkeypatch
):
    """A start HiGHS's presolve misvalues (milp.py ``_highs``) is kept in the programs with offload
    columns, solved again without presolve: on the MLP on h100-sxm below its smallest peak without
    offload, every started solve is made to see its start misvalued, and the optimum is the one of
    the solves that drop such a start (within REL_GAP)."""
    graph, mesh, options = cases[4]
    free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
    unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
    limited = dataclasses.replace(options, memory_limit=int(share * unlimited))
    calls: list[tuple[bool, bool, bool]] = []  # per HiGHS solve: (kept, has a start, presolved)
    original, improved = milp._highs, milp._Watch.improved

    def misvalued(watch, e):  # the first solution presolved HiGHS reports from a start is "misvalued"
        if watch.started and not watch.found and calls[-1][2]:
            watch.misvalued_start = True
            return
        improved(watch, e)

    def solutions(keep: bool):
        def highs(m, time_limit_s, rel_gap, start, known_bound=None, presolve=True):
            m.keep_misvalued_start = m.keep_misvalued_start and keep
            calls.append((m.keep_misvalued_start, start is not None, presolve))
            return original(m, time_limit_s, rel_gap, start, known_bound, presolve)

        calls.clear()
        with monkeypatch.context() as mp:
            mp.setattr(milp, "_highs", highs)
            if keep:
                mp.setattr(milp._Watch, "improved", misvalued)
            problem = build_problem(graph, mesh, limited, ties=state_ties(graph))
            return problem, _solve(problem, limited, True, monkeypatch)

    problem, kept = solutions(True)
    assert any(k and started and not presolved for k, started, presolved in calls)  # the start was kept
    _, dropped = solutions(False)
    assert not any(k for k, _, _ in calls)
    assert kept.offload and dropped.offload and kept.status == dropped.status == "optimal"
    assert kept.objective == pytest.approx(dropped.objective, rel=2e-4)  # both within REL_GAP of the optimum
    assert problem.memory.peak(kept.choice)[0] <= limited.memory_limit


def offloading_model(case, offload):
    """The ILP model (with its problem) of ``case`` = (graph, mesh, options) with the offload
    columns ``offload`` asks for (True: the optimizer state; "activations": the stashes too)."""
    graph, mesh, options = case
    if offload == "activations":  # stashes are forward values nothing may recompute
        options = dataclasses.replace(options, recompute="off")
    problem = build_problem(graph, mesh, options, ties=state_ties(graph))
    groups, of = shrink(problem, options.shrink)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    return problem, ilp._Model(problem, groups, of, vec, pair, maps, "highs", offload=offload)


@pytest.mark.parametrize("offload", [True, "activations"])
def test_a_rounded_point_is_a_plan_and_its_profile_the_memory_models(cases, offload):
    """``rounded`` of a plan's columns (strategies, offloaded candidates or stashes and their
    products) is that plan, and of a fractional point the plan its largest columns choose; the
    rows' profile of it is the memory model's with those candidates or stashes offloaded."""
    problem, model = offloading_model(cases[4], offload)  # the MLP on h100-sxm, dp=2
    rows = MemoryRows(model)
    off_cols = np.concatenate([model.offload.o, model.offload.a]).astype(np.int64)
    moved = [*model.offload.cands, *model.offload.stashes]
    assert len(off_cols) >= 2 and (offload is True or len(model.offload.a))  # the case offloads
    rng = np.random.default_rng(1)
    for _ in range(5):
        gchoice = [int(rng.integers(g.size)) for g in model.groups]
        off = rng.random(len(off_cols)) < 0.5
        z = model.point(gchoice)
        z[off_cols] = off
        for g, o, w in model.offload.shares():
            z[w[gchoice[g]]] = z[o]
        np.testing.assert_array_equal(rounded(model, z), z)
        blurred = 0.6 * z + 0.4 * rng.random(model.milp.n) * 0.5  # largest column and o >= 1/2 unchanged
        np.testing.assert_array_equal(rounded(model, blurred), z)
        choice = [0] * len(problem.items)
        for gi, g in enumerate(model.groups):
            for i, m in g.members:
                choice[i] = int(m[gchoice[gi]])
        use(problem, tuple(c for c, on in zip(moved, off) if on))
        try:
            np.testing.assert_allclose(rows.profile(z), problem.memory.profile(choice), atol=1e-3)
        finally:
            use(problem, ())


def test_a_repaired_plan_meets_every_row_and_keeps_the_groups_outside_them(cases, monkeypatch):
    """``repaired``: the cheapest plan (local search, no memory in mind) breaks the memory rows of a
    limit; a repair meets every row, and every group with no column in a broken row keeps its
    strategy. Four problems at 90% and 70% of their free peak."""
    monkeypatch.setattr(memrows, "REPAIR_FREE", 1.0)
    done = 0
    for graph, mesh, options in cases[:3] + cases[4:]:
        free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
        unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
        for share in (0.9, 0.7):
            problem, model = _problem(graph, mesh, options)
            memrows.add_lp_rows(model, int(share * unlimited), 60.0, [])
            z = model.point(model.local_search())
            broken = model.milp.broken_rows(z)
            fixed = memrows.repaired(model, z, TIME)
            if fixed is None:  # the groups outside the broken rows may pin them (ties, recompute pairs)
                continue
            assert not len(model.milp.broken_rows(fixed))
            touched = np.zeros(model.milp.n, dtype=bool)
            for r in broken:
                touched[model.milp.row_columns(int(r))] = True
            for xs in model.x:
                if xs is not None and not touched[xs].any():
                    np.testing.assert_array_equal(fixed[xs], z[xs])
            done += 1
            monkeypatch.setattr(memrows, "REPAIR_FREE", 0.0)  # more free groups than allowed: not tried
            assert memrows.repaired(model, z, TIME) is None
            monkeypatch.setattr(memrows, "REPAIR_FREE", 1.0)
    assert done >= 4  # of the 8 (6 when written)


def _knapsack(n: int = 24, seed: int = 3) -> Milp:
    """A 0-1 knapsack (as a minimization) HiGHS must branch on."""
    rng = np.random.default_rng(seed)
    m = Milp()
    value, weight = rng.integers(10, 100, n).astype(float), rng.integers(10, 100, n).astype(float)
    xs = m.add_vars(-value, integer=True)
    m.add_row(xs, weight, -np.inf, weight.sum() / 3)
    return m


def test_a_known_bound_stops_the_solve_at_the_optimum_and_is_reported():
    """``known_bound`` (a lower bound proven elsewhere) lets HiGHS stop as soon as its incumbent is
    within the gap of it: the same optimum, called optimal, with that bound. A bound below the
    optimum changes nothing but the reported bound when it is the better one."""
    m = _knapsack()
    plain = solve_milp(m, time_limit_s=TIME)
    assert plain.status == "optimal"
    exact = solve_milp(m, time_limit_s=TIME, known_bound=plain.objective)
    assert exact.status == "optimal" and exact.bound == plain.objective
    assert exact.objective == pytest.approx(plain.objective, rel=1e-4)
    loose = solve_milp(m, time_limit_s=TIME, known_bound=plain.objective - 1000.0)
    assert loose.status == "optimal" and loose.objective == pytest.approx(plain.objective, rel=1e-4)
    assert loose.bound >= plain.objective - 1000.0


def test_lazy_rounds_pass_on_their_bound(cases, monkeypatch):
    """Every integer solve after the first of a limited solve gets the last round's bound."""
    graph, mesh, options = cases[0]
    free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
    unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
    limited = dataclasses.replace(options, memory_limit=int(0.8 * unlimited))
    problem = build_problem(graph, mesh, limited, ties=state_ties(graph))
    with monkeypatch.context() as m:
        m.setattr(memrows, "lp_memory_points", lambda *a, **k: ([], None))  # lazy rounds only, so there are some
        sol = _solve(problem, limited, True, monkeypatch)
    assert sol.stats["integer_solves"] >= 2
    assert sol.stats["bounded_solves"] == sol.stats["integer_solves"] - 1


def test_an_infeasible_limit_names_the_smallest_peak_with_and_without_the_speed_ups(cases, monkeypatch):
    """A limit no plan fits is "no plan fits" with ``min_memory``'s figure, the same with the LP rows,
    their rounding and the known bounds as without; that figure is a plan's peak: a limit one byte
    under it has no plan, at it one."""
    graph, mesh, options = cases[0]
    tiny = dataclasses.replace(options, memory_limit=1000)
    figures = []
    for fast in (True, False):
        with pytest.raises(graphc.PlanError, match="no plan fits") as info:
            _solve(build_problem(graph, mesh, tiny, ties=state_ties(graph)), tiny, fast, monkeypatch)
        figures.append(info.value.min_memory_bytes)
    assert figures[0] == figures[1] and figures[0] > 1000
    under = dataclasses.replace(options, memory_limit=figures[0] - 1)
    with pytest.raises(graphc.PlanError, match="no plan fits") as info:
        _solve(build_problem(graph, mesh, under, ties=state_ties(graph)), under, True, monkeypatch)
    assert info.value.min_memory_bytes == figures[0]
    at = dataclasses.replace(options, memory_limit=figures[0])
    problem = build_problem(graph, mesh, at, ties=state_ties(graph))
    assert problem.memory.peak(_solve(problem, at, True, monkeypatch).choice)[0] <= figures[0]


def test_the_lp_needs_no_rows_when_the_limit_is_loose(cases):
    graph, mesh, options = cases[0]
    problem, model = _problem(graph, mesh, options)
    assert lp_memory_points(model, 10**12, 10.0)[0] == []


def test_a_limit_below_a_problem_with_nothing_to_choose_names_its_peak():
    """One device, nothing to recompute: every item has one strategy, the ILP no column. A limit below
    the only plan's peak is "no plan fits" with that peak (it used to be "the time limit ran out":
    a program with no columns was called optimal whatever its rows said)."""
    x = np.ones((4, 4), np.float32)
    free = graphc.parallelize(lambda x: np.tanh(x) * 2, mesh={"dp": 1}, cache=False).plan(x)
    peak = free.memory.peak_bytes[0]
    # 16 bytes under it (memory rows are in MiB: a start point within 1e-6 MiB of a row counts as on it)
    pf = graphc.parallelize(lambda x: np.tanh(x) * 2, mesh={"dp": 1}, memory_limit=peak - 16, cache=False)
    with pytest.raises(graphc.PlanError, match="no plan fits") as info:
        pf.plan(x)
    assert info.value.min_memory_bytes == peak
    at_peak = graphc.parallelize(lambda x: np.tanh(x) * 2, mesh={"dp": 1}, memory_limit=peak, cache=False)
    assert at_peak.plan(x).memory.peak_bytes == (peak,)


@pytest.mark.long  # 20-25 s: the fallback at 54% runs the held-buffer rounds out
def test_a_plan_whose_held_buffers_break_the_limit_says_so(tmp_path, monkeypatch):
    """ilp.solve's fallback (docs/remat.md): when the held-buffer rows leave no plan, the last plan
    whose values fit stands, and its held peak may be over the limit. The plan then says so in its
    warnings (and parallelize warns): the limit is never broken silently. A plan held within the
    limit has no such warning."""
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no_profile.json"))  # the default profile, not a calibration
    args, kw = gpt.example_train_args(batch=2, seq=8, d=16, n_layer=1, n_head=2)

    def plan(limit):
        step = graphc.parallelize(
            gpt.train_step, mesh={"tp": 2}, memory_limit=limit, static_argnames=static_argnames(kw), cache=False
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return step.plan(*args, **kw)

    free = plan(None).memory.peak_bytes[0]
    seen = set()
    for share in (0.9, 0.54):
        limit = int(share * free)
        p = plan(limit)
        over = p.memory.held_bytes[0] > limit
        said = [w for w in p.warnings if "redistribution buffers" in w]
        assert bool(said) == over, (share, p.memory.held_bytes[0], limit, said)
        if over:
            assert f"{p.memory.held_bytes[0] / limit:.0%} of the limit" in said[0]
        seen.add(over)
    # both sides are exercised: the fallback at 54% on this step (at 60% before the memory model
    # counted gradient buckets as the runtime holds them: its plans at 56-60% now hold within the limit)
    assert seen == {False, True}


def test_a_held_round_re_solves_to_the_held_gap_and_the_rest_to_the_solvers_gap(cases, monkeypatch):
    """The re-solve after a held-buffer round (its rows are the last plan's buffers, docs/remat.md)
    stops at ``milp.HELD_GAP``; every other integer solve at ``milp.REL_GAP``. The plan reports
    a gap within the one it was solved to, against a bound that holds."""
    # ZeRO-3: held buffers over the limit at 90% (at 80% while the model counted each gathered
    # copy twice, as a transient and as a buffer: tests/passes/sharding/test_held_measured.py)
    graph, mesh, options = cases[2]
    free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
    unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
    limited = dataclasses.replace(options, memory_limit=int(0.9 * unlimited))
    events: list[tuple[str, float]] = []

    def held(*a, **k):
        rows = held_over(*a, **k)
        events.append(("held", len(rows)))
        return rows

    def solved(m, backend, time_limit_s, rel_gap=milp.REL_GAP, **k):
        events.append(("solve", rel_gap))
        return solve_milp(m, backend, time_limit_s, rel_gap, **k)

    monkeypatch.setattr(ilp, "held_over", held)
    monkeypatch.setattr(ilp, "solve_milp", solved)
    sol = solve_problem(build_problem(graph, mesh, limited, ties=state_ties(graph)), limited)
    gaps = [g for kind, g in events if kind == "solve"]
    after_held = [g for (kind, n), (_, g) in zip(events, events[1:]) if kind == "held" and n]
    assert after_held and all(g == milp.HELD_GAP for g in after_held), events
    assert gaps.count(milp.HELD_GAP) == len(after_held) and gaps[0] == milp.REL_GAP, events
    assert milp.HELD_GAP > milp.REL_GAP
    assert sol.status == "optimal" and sol.bound <= sol.objective and sol.gap <= milp.HELD_GAP


@pytest.mark.parametrize("mesh", [{"tp": 2}, {"dp": 2, "tp": 2}])
def test_without_a_limit_an_integral_relaxation_is_the_plan_and_no_integer_solve_runs(mesh, monkeypatch):
    """lp_start: without a memory limit the LP relaxation's optimum is the known bound and its
    rounded point a start; the tiny GPT's relaxations are integral, so the plan is the LP's, proven
    optimal with no integer solve, at the objective of the integer solve it replaces."""
    graph = _gpt_graph()
    options = PlanOptions(time_limit=TIME)
    calls: list[int] = []
    highs = milp._highs

    def counted(*a, **k):
        calls.append(1)
        return highs(*a, **k)

    def solve():
        problem = build_problem(graph, Mesh(mesh, profile=PROFILE), options, ties=state_ties(graph))
        groups, of = shrink(problem, options.shrink)
        return ilp.solve(problem, groups, of, None, TIME)

    monkeypatch.setattr(milp, "_highs", counted)
    first = solve()
    assert first.status == "optimal" and not calls and not first.stats.get("lp_memory_points")
    with monkeypatch.context() as m:
        m.setattr(memrows, "LP_FIRST", False)  # as before: the integer solve alone
        before = solve()
    assert calls and before.status == "optimal"
    # the same program's optimum: neither below the other's proven bound
    assert first.objective >= before.bound * (1 - 1e-9) and before.objective >= first.bound * (1 - 1e-9)
    assert first.objective == pytest.approx(before.objective, rel=milp.REL_GAP)


def test_the_relaxation_runs_before_the_local_search_so_a_short_limit_goes_to_it(monkeypatch):
    """The local search takes no time limit: run before the LP relaxation, a slow one left the LP
    no time (at 1,000 layers its 0.5 s did, and its plan, 16% off, was the one written). Here it
    uses up the whole limit (the solver's clock moved on by it), and the plan the LP's point
    rounds to is still proven optimal by the LP's bound: the same plan as with time to spare."""
    graph = _gpt_graph()
    options = PlanOptions(time_limit=TIME)
    problem = build_problem(graph, Mesh({"tp": 2}, profile=PROFILE), options, ties=state_ties(graph))
    groups, of = shrink(problem, options.shrink)
    want = ilp.solve(problem, groups, of, None, TIME)
    now = [0.0]
    search = ilp._Model.local_search

    def slow(self, *args, **kwargs):
        now[0] += 2 * TIME
        return search(self, *args, **kwargs)

    monkeypatch.setattr(ilp, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(ilp._Model, "local_search", slow)
    got = ilp.solve(problem, groups, of, None, TIME)
    assert now[0] == 2 * TIME and want.status == got.status == "optimal"
    assert got.choice == want.choice and got.objective == want.objective
