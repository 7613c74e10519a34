"""The ILP backends (passes/sharding/milp.py) and bounded planning time: answers equal exhaustive
search, a time limit returns the best plan so far with its gap, Ctrl-C stops a solve at once and
leaves no thread behind, and nothing is printed."""

import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import graphc
from graphc.models import gpt
from graphc.passes.sharding.milp import Milp, solve_milp
from tests.helpers import assert_adam_step_close

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def pairwise(n: int, k: int, deg: int, seed: int) -> tuple[Milp, list[np.ndarray], list, list, np.ndarray]:
    """The shape of a sharding ILP: one-hot choices per group, linearized pair costs; and a
    feasible point of it (every group's first choice)."""
    rng = np.random.default_rng(seed)
    m = Milp()
    unary = [rng.random(k) for _ in range(n)]
    xs = []
    for g in range(n):
        x = m.add_vars(unary[g], integer=True)
        m.add_row(x, np.ones(k), 1.0, 1.0)
        xs.append(x)
    pairs = []
    first = [(x[0], 1.0) for x in xs]  # the point's nonzero columns
    for g in range(n):
        for h in rng.choice(n, min(n, deg), replace=False):
            if h <= g:
                continue
            c = rng.random((k, k)) * 3
            y = m.add_vars(c.reshape(-1), integer=False).reshape(k, k)
            for s in range(k):
                m.add_row(np.concatenate([y[s], [xs[g][s]]]), np.concatenate([np.ones(k), [-1.0]]), 0.0, 0.0)
            for t in range(k):
                m.add_row(np.concatenate([y[:, t], [xs[h][t]]]), np.concatenate([np.ones(k), [-1.0]]), 0.0, 0.0)
            pairs.append((g, h, c))
            first.append((y[0, 0], 1.0))
    start = np.zeros(m.n)
    for column, value in first:
        start[column] = value
    return m, xs, unary, pairs, start


def brute_force(n, k, unary, pairs) -> float:
    best = np.inf
    for combo in itertools.product(range(k), repeat=n):
        cost = sum(unary[g][combo[g]] for g in range(n)) + sum(c[combo[g], combo[h]] for g, h, c in pairs)
        best = min(best, cost)
    return best


def _csr_of(rows) -> tuple:
    """The CSR arrays of ``rows`` made in one go, as ``Milp.csr`` made them before it kept them."""
    lens = np.array([len(r[0]) for r in rows], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    index = np.concatenate([np.asarray(r[0], np.int32) for r in rows]) if rows else np.zeros(0, np.int32)
    value = np.concatenate([np.asarray(r[1], np.float64) for r in rows]) if rows else np.zeros(0)
    return start, index, value, np.array([r[2] for r in rows], float), np.array([r[3] for r in rows], float)


def test_csr_is_kept_and_grows_with_the_rows_added_after():
    # the rows' arrays are made once and extended by the rows added since (the lazy memory rows,
    # the LP rounds'), equal to making them afresh, with the same dtypes; a restricted copy makes its own
    m, _xs, _unary, _pairs, start = pairwise(5, 3, 2, seed=0)
    rows = [(r[0].tolist(), r[1].tolist(), r[2], r[3]) for r in m._rows]
    first = m.csr()
    assert m.csr() is first  # kept while no row is added
    for a, b in zip(first, _csr_of(rows)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    extra = [([0, 4, 7], [1.0, -2.5, 0.5], -np.inf, 3.0), ([], [], 0.0, 0.0), ([2], [1.0], 1.0, np.inf)]
    for idx, val, lo, hi in extra:
        m.add_row(idx, val, lo, hi)
        rows.append((idx, val, lo, hi))
        for a, b in zip(m.csr(), _csr_of(rows)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert not m.csr()[1].flags.writeable
    assert m.broken_rows(start).tolist() == [m.num_rows - 1]  # x[2] >= 1: the start has x[2] = 0
    r = m.restricted(m.upper)
    r.add_row([1], [1.0], 0.0, 1.0)
    assert len(r.csr()[0]) == len(m.csr()[0]) + 1


@pytest.mark.parametrize("backend", ["highs", "cpsat", "CBC"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backends_find_the_exhaustive_optimum(backend, seed):
    m, xs, unary, pairs, _ = pairwise(6, 3, 3, seed)
    res = solve_milp(m, backend, 30.0, rel_gap=0.0)
    assert res.status == "optimal" and res.x is not None
    assert res.objective == pytest.approx(brute_force(6, 3, unary, pairs), rel=1e-7)
    assert res.bound <= res.objective + 1e-9
    assert m.violation(res.x) < 1e-6


@pytest.mark.parametrize("seed", [0, 1])
def test_a_start_meeting_a_known_bound_is_optimal_without_a_solve(seed, monkeypatch):
    # the LP relaxation's optimum is a proven bound (memrows.add_lp_rows): a feasible start that
    # meets it within the gap is the optimum, and no solver runs; one above it is solved as before
    m, _xs, _unary, _pairs, _ = pairwise(6, 3, 3, seed)
    best = solve_milp(m, "highs", 30.0, rel_gap=0.0)
    from graphc.passes.sharding import milp

    def no_solver(*_a, **_k):
        raise AssertionError("the solver ran")

    with monkeypatch.context() as mp:
        mp.setattr(milp, "_highs", no_solver)
        res = solve_milp(m, "highs", 30.0, start=best.x, known_bound=best.objective)
        assert res.status == "optimal" and res.x is best.x and res.objective == pytest.approx(best.objective)
        assert res.bound <= res.objective
        with pytest.raises(AssertionError, match="the solver ran"):  # a bound the start does not meet
            solve_milp(m, "highs", 30.0, start=best.x, known_bound=best.objective * (1 - 1e-2))
        broken = best.x.copy()
        broken[np.flatnonzero(broken)[0]] = 0.0  # breaks its group's one-hot row: not a plan
        with pytest.raises(AssertionError, match="the solver ran"):
            solve_milp(m, "highs", 30.0, start=broken, known_bound=float(m.cost @ broken) + m.offset)


def test_an_empty_program_and_an_unknown_backend():
    assert solve_milp(Milp(), "highs").status == "optimal"
    m, *_ = pairwise(2, 2, 1, 0)
    with pytest.raises(graphc.PlanError, match="unknown ILP solver 'gurobi'"):
        solve_milp(m, "gurobi")


@pytest.mark.parametrize("backend", ["highs", "cpsat"])
def test_a_time_limit_returns_the_incumbent_and_a_proven_bound(backend):
    m, _xs, _unary, _pairs, start = pairwise(40, 6, 6, 0)  # HiGHS and CP-SAT need minutes to close this gap
    assert m.violation(start) < 1e-9
    t0 = time.perf_counter()
    res = solve_milp(m, backend, 0.5, start=start)  # an incumbent from the start, however slow the machine
    # HiGHS sees its limit (and the cancel at limit + 0.05 s) between simplex passes, CP-SAT its
    # StopSearch between presolve steps: about 0.5 s late here, 2-3 s with both cores busy; not
    # the minutes the solve needs
    assert time.perf_counter() - t0 < 0.5 + 5.0
    assert res.status == "time limit"
    assert res.x is not None and m.violation(res.x) < 1e-6
    assert res.objective <= float(m.cost @ start) + m.offset + 1e-9  # the incumbent, at least the start
    assert res.bound < res.objective


def test_ctrl_c_cancels_the_solve_and_joins_its_thread(monkeypatch):
    import highspy

    m, *_ = pairwise(40, 6, 6, 1)  # HiGHS needs minutes for it
    solving = threading.Event()  # the solver's thread runs and this one waits for it
    wait = highspy.Highs.wait

    def waiting(self, timeout=-1.0):
        solving.set()
        return wait(self, timeout)

    monkeypatch.setattr(highspy.Highs, "wait", waiting)
    sent = []

    def interrupt_when_solving():
        if solving.wait(120):
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)

    before = threading.active_count()
    interrupter = threading.Thread(target=interrupt_when_solving)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        solve_milp(m, "highs", 60.0)
    stopped = time.perf_counter()
    interrupter.join()
    assert sent, "the solve never started"
    # HiGHS sees the cancel at its next interrupt callback, between simplex passes: about 0.5 s
    # here, 2-3 s with both cores busy; without it the solve would run to its 60 s limit
    assert stopped - sent[0] < 10.0
    assert threading.active_count() == before


def test_ctrl_c_stops_cpsat_and_joins_its_thread(monkeypatch):
    from ortools.sat.python import cp_model

    m, *_ = pairwise(40, 6, 6, 1)  # CP-SAT needs minutes for it
    solving = threading.Event()
    solve = cp_model.CpSolver.solve

    def solving_now(self, *args, **kwargs):
        solving.set()
        return solve(self, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "solve", solving_now)
    sent = []

    def interrupt_when_solving():
        if solving.wait(120):
            time.sleep(0.2)  # inside the search, past the model's loading
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)

    before = threading.active_count()
    interrupter = threading.Thread(target=interrupt_when_solving)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):  # CP-SAT's own SIGINT handler would swallow it: it is off
        solve_milp(m, "cpsat", 60.0)
    stopped = time.perf_counter()
    interrupter.join()
    assert sent, "the solve never started"
    assert stopped - sent[0] < 10.0  # StopSearch is seen within a presolve step; the solve needs minutes
    assert threading.active_count() == before, threading.enumerate()


def test_cpsat_rows_with_fractional_coefficients_hold_as_given():
    """CP-SAT takes integer rows: a memory row in MiB (bytes / 2**20) is scaled back to bytes
    exactly, and a row still fractional at 2**20 is rounded to a tighter one."""
    from graphc.passes.sharding.milp import _integral_row

    coeffs, lo, hi = _integral_row(np.array([3 * 2**-20, 5.0, 2**-19]), -np.inf, 7 + 2**-20)
    assert coeffs == [3, 5 * 2**20, 2] and hi == 7 * 2**20 + 1 and lo < -(2**61)
    coeffs, lo, hi = _integral_row(np.array([1 / 3, -1 / 3]), 0.1, 0.2)
    assert coeffs == [349526, -349526]  # 2**20 / 3 = 349525.33, away from zero
    assert lo == math.ceil(0.1 * 2**20) and hi == math.floor(0.2 * 2**20)
    # the same knapsack-shaped problem, with byte counts in MiB, solved by both backends
    sizes = np.array([3, 5, 7, 11, 13, 17]) * 2**18 + 1  # not whole MiB
    values = np.array([4.0, 6.0, 8.0, 13.0, 14.0, 20.0])
    m = Milp()
    x = m.add_vars(-values, integer=True)
    m.add_row(x, sizes / 2**20, -np.inf, float(sizes[[0, 2, 4]].sum()) / 2**20)  # exactly full at {0, 2, 4}
    res = {b: solve_milp(m, b, 30.0, rel_gap=0.0) for b in ("highs", "cpsat")}
    assert res["cpsat"].objective == pytest.approx(res["highs"].objective, rel=1e-12)
    for r in res.values():
        assert r.x is not None and m.violation(r.x) <= 1e-12


def test_highs_prints_nothing(capfd):
    m, *_ = pairwise(5, 3, 2, 0)
    solve_milp(m, "highs", 10.0)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.slow
def test_a_time_limit_that_runs_out_before_the_solver_still_gives_a_correct_plan():
    (params, opt_state, tokens, targets), kw = gpt.example_train_args(batch=4, seq=8, d=32, n_layer=2)
    step = graphc.parallelize(
        gpt.train_step, mesh="dp=2,tp=2", static_argnames=("n_head",), time_limit=1e-3, cache=False
    )
    plan = step.plan(params, opt_state, tokens, targets, **kw)
    assert plan.solver.status == "time limit"  # tracing alone took longer: the local search's plan
    assert 0.0 < plan.solver.gap <= 1.0 and plan.solver.bound_s <= plan.solver.objective_s
    got = step(params, opt_state, tokens, targets, **kw)
    want = gpt.train_step(params, opt_state, tokens, targets, **kw)
    assert_adam_step_close(got, want, lr=kw["lr"], terms=4 * 32)  # the longest sum: the MLP's 4d products


def _compile(tmp_path, *args):
    env = dict(os.environ, GRAPHC_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.Popen(
        [sys.executable, "-m", "graphc.cli", "compile", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_cli_time_limit_writes_the_best_plan_with_its_gap(tmp_path):
    out = tmp_path / "plan.json"
    args = ("models/gpt.py:train_step", "--example", "example_train_args", "--mesh", "dp=2,tp=2")
    proc = _compile(tmp_path, *args, "--time-limit", "0.001", "-o", str(out))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "stopped at the time limit" in stderr and "gap" in stdout
    assert "it had 0.0 s of the 0.001 s limit (tracing and building the problem took the rest" in stderr
    assert graphc.Plan.load(str(out)).solver.status == "time limit"
    bad = _compile(tmp_path, *args, "--time-limit", "0", "-o", str(out))
    _out, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "argument --time-limit: expected a positive number of seconds" in err
    assert "Traceback" not in err


def test_cli_ctrl_c_exits_130_with_one_line_and_no_plan(tmp_path):
    out = tmp_path / "plan.json"
    proc = _compile(
        tmp_path,
        "models/llama.py:train_step",
        "--example",
        "example_train_specs_8b",
        "--mesh",
        "dp=8,tp=8",
        "-o",
        str(out),
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the first progress line: compiling has begun
    assert "tracing" in line, line
    proc.send_signal(signal.SIGINT)
    t0 = time.perf_counter()
    _stdout, stderr = proc.communicate(timeout=30)
    assert time.perf_counter() - t0 < 1.0
    assert proc.returncode == 130
    assert stderr.strip() == "graphc: interrupted"
    assert not out.exists()


def test_cpsat_plans_what_highs_plans():
    """The whole planner on CP-SAT (memory limit and lazy rows included) finds HiGHS's objective."""
    from graphc.models import mlp
    from graphc.passes.sharding.milp import REL_GAP

    args, kw = mlp.example_train_args(batch=8, sizes=(16, 32, 8))
    plans = {}
    for solver in ("highs", "cpsat"):
        step = graphc.parallelize(mlp.train_step, mesh="tp=2", static_argnames=tuple(kw), solver=solver, cache=False)
        plans[solver] = step.plan(*args, **kw)
    assert plans["cpsat"].solver.name == "cpsat" and plans["cpsat"].solver.status == "optimal"
    assert plans["cpsat"].solver.objective_s == pytest.approx(plans["highs"].solver.objective_s, rel=2 * REL_GAP)


@pytest.mark.parametrize("seed", range(4))
def test_pair_classes_number_rows_as_np_unique_does(seed):
    """``ilp._classes``: the class of every row and their count as ``np.unique(axis=0)`` gives them
    (the ILP's pair columns are made in that order), on cost matrices with repeated rows, rows
    equal but for one entry, -0.0 against 0.0, one row and one column."""
    from graphc.passes.sharding.ilp import _classes

    rng = np.random.default_rng(seed)
    base = rng.choice([0.0, 1.5e-6, 2.5e-6, 1e-3], size=(5, 4))
    m = base[rng.integers(0, 5, size=12)]
    m[3, 2] += 1e-12  # equal to another row but for one entry
    m[m == 0.0] = np.where(rng.random((m == 0.0).sum()) < 0.5, -0.0, 0.0)
    for mat in (m, m.T, m[:1], m[:, :1], m[:0]):
        _u, want = np.unique(mat, axis=0, return_inverse=True)
        got, n = _classes(mat)
        assert got.tolist() == want.reshape(-1).tolist()
        assert n == len(_u)
