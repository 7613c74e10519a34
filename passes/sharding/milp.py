"""A 0-1 linear program in matrix form, and the solvers that run it.

``Milp`` holds ``min cost . x + offset`` subject to ``lower <= A x <= upper`` and ``0 <= x <= 1``,
with some columns integer: the shape every planning ILP here has (one-hot strategy choices,
the linearized pair products, memory rows). ``solve_milp`` hands it to a backend:

* ``highs`` (default): HiGHS through ``highspy``. The matrix goes in as CSR arrays in one call
  (building the 8B model through OR-Tools' row-by-row API took seconds), and the solve runs in
  HiGHS's own thread while this one waits in 0.1 s steps: Ctrl-C cancels it (HiGHS stops at its
  next callback and keeps its incumbent), and the thread is joined before ``KeyboardInterrupt``
  propagates. A starting solution seeds the incumbent, so a time limit always leaves a plan.
* ``cpsat``: OR-Tools' CP-SAT (``_cpsat``): interruptible the same way (``StopSearch`` from this
  thread), the starting solution as its hint, one worker per core. Slower than HiGHS on the
  planning ILPs on this 2-core machine, so not the default (docs/solver.md has the figures).
* ``CBC`` and ``SCIP``: OR-Tools' pywraplp, for comparison (they honour the time limit but
  not Ctrl-C while inside the solver).

OR-Tools' own HiGHS build cannot be interrupted (``InterruptSolve`` returns False; MathOpt's
interrupter is ignored): measured, see docs/solver.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from graphc.core.errors import PlanError
from graphc.passes.options import SOLVERS


class Milp:
    """Columns and rows of a mixed 0-1 program, added in blocks."""

    def __init__(self) -> None:
        self.n = 0
        self.offset = 0.0
        self._cost: list[np.ndarray] = []
        self._integer: list[np.ndarray] = []
        self._upper: list[np.ndarray] = []
        self._rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []
        self._csr: tuple[list, int, tuple[np.ndarray, ...]] | None = None  # (the rows, how many, ``csr``'s arrays)
        # a start HiGHS's presolve misvalues is kept, solving again without presolve, rather than
        # dropped (``_highs``: the offload columns' programs, passes/sharding/offload_terms.py)
        self.keep_misvalued_start = False
        # binary columns a solve from a start may fix at 0 by probing (``probed``: the offload's, offload_terms.py)
        self.probe = np.zeros(0, dtype=np.int64)
        # per probed column, its LP relaxation's optimum at 1 when probed: rows are only ever added, so
        # it stays a lower bound on every plan with the column at 1 (``probed``)
        self.probe_values: dict[int, float] = {}

    def add_vars(self, cost, integer: bool, upper: float = 1.0) -> np.ndarray:
        """New columns in ``[0, upper]`` with these costs; returns their indices."""
        cost = np.asarray(cost, dtype=np.float64).reshape(-1)
        idx = np.arange(self.n, self.n + cost.size)
        self.n += cost.size
        self._cost.append(cost)
        self._integer.append(np.full(cost.size, integer))
        self._upper.append(np.full(cost.size, float(upper)))
        return idx

    def add_row(self, idx, val, lower: float, upper: float) -> None:
        """``lower <= sum(val * x[idx]) <= upper`` (either bound may be +-inf)."""
        self._rows.append((np.asarray(idx, dtype=np.int32), np.asarray(val, dtype=np.float64), lower, upper))

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    @property
    def cost(self) -> np.ndarray:
        return np.concatenate(self._cost) if self._cost else np.zeros(0)

    @property
    def upper(self) -> np.ndarray:
        return np.concatenate(self._upper) if self._upper else np.zeros(0)

    @property
    def integer(self) -> np.ndarray:
        return np.concatenate(self._integer) if self._integer else np.zeros(0, dtype=bool)

    def csr(self) -> tuple[np.ndarray, ...]:
        """(start, index, value, lower, upper) of the rows (read-only: kept until a row is added;
        rows are only ever added, so a later call makes only theirs)."""
        rows = self._rows
        done = self._csr if self._csr is not None and self._csr[0] is rows else None
        if done is not None and done[1] == len(rows):
            return done[2]
        k = done[1] if done is not None else 0
        new = rows[k:]
        lens = np.array([len(r[0]) for r in new], dtype=np.int64)
        parts = (
            np.cumsum(lens),
            np.concatenate([r[0] for r in new]) if new else np.zeros(0, np.int32),
            np.concatenate([r[1] for r in new]) if new else np.zeros(0),
            np.array([r[2] for r in new], dtype=np.float64),
            np.array([r[3] for r in new], dtype=np.float64),
        )
        if done is not None and k:  # the rows made before, then the new ones
            start, index, value, lower, upper = done[2]
            parts = (start[-1] + parts[0], *parts[1:])
            start = np.concatenate([start, parts[0]]).astype(np.int32)
            arrays = (start, *(np.concatenate([a, b]) for a, b in zip((index, value, lower, upper), parts[1:])))
        else:
            arrays = (np.concatenate([[0], parts[0]]).astype(np.int32), *parts[1:])
        for a in arrays:
            a.setflags(write=False)
        self._csr = (rows, len(rows), arrays)
        return arrays

    def broken_rows(self, x: np.ndarray) -> np.ndarray:
        """The rows ``x`` breaks by more than 1e-6."""
        start, index, value, lower, upper = self.csr()
        a = np.bincount(np.repeat(np.arange(self.num_rows), np.diff(start)), value * x[index], self.num_rows)
        return np.flatnonzero((lower - a > 1e-6) | (a - upper > 1e-6))

    def row_columns(self, r: int) -> np.ndarray:
        return self._rows[r][0]

    def cheapest_feasible(self, points: list[np.ndarray]) -> np.ndarray | None:
        """The cheapest of ``points`` that breaks no row by more than 1e-6, or None."""
        fits = [z for z in points if not len(self.broken_rows(z))]
        return min(fits, key=lambda z: float(self.cost @ z)) if fits else None

    def restricted(self, upper: np.ndarray) -> Milp:
        """The same program with the columns' upper bounds ``upper`` (0 fixes a column at 0)."""
        m = Milp()
        m.n, m.offset, m._rows = self.n, self.offset, list(self._rows)
        m._cost, m._integer, m._upper = [self.cost], [self.integer], [np.asarray(upper, dtype=np.float64)]
        m.keep_misvalued_start, m.probe = self.keep_misvalued_start, self.probe
        return m

    def violation(self, x: np.ndarray) -> float:
        """The largest amount by which ``x`` breaks a row."""
        worst = 0.0
        for idx, val, lo, hi in self._rows:
            a = float(val @ x[idx])
            worst = max(worst, lo - a, a - hi)
        return worst


@dataclass
class MilpResult:
    status: str  # "optimal", "time limit", "infeasible", or the backend's word
    x: np.ndarray | None  # None: no feasible point known
    objective: float
    bound: float  # best proven lower bound (== objective when optimal)
    seconds: float
    found: list[np.ndarray] = field(default_factory=list)  # HiGHS: its improving points, last (best) first


# The relative gap at which the solver stops: a plan within 0.01% of the optimum is optimal enough
# (the cost model is not that exact), and proving the last fraction can take most of the time.
REL_GAP = 1e-4
# The relative gap a held-buffer round's re-solve stops at (``ilp.solve``; the other solves stop at
# REL_GAP). Its rows are the last plan's buffers, a heuristic bound on the runtime's peak, not
# a row every plan that fits must meet, so proving the last 0.1% buys little; the re-solve starts
# from the last plan repaired, within 0.05-0.1% of the last bound, and used to spend 2-6 s of CPU
# closing that to 1e-4 on the sequence-parallel test model (docs/remat.md).
HELD_GAP = 1e-3


def solve_milp(
    m: Milp,
    backend: str = "highs",
    time_limit_s: float = 60.0,
    rel_gap: float = REL_GAP,
    start: np.ndarray | None = None,
    known_bound: float | None = None,
) -> MilpResult:
    """Minimize ``m`` within ``time_limit_s`` seconds; stop at relative gap ``rel_gap``. ``start``
    (a feasible point, if given) seeds the incumbent. ``known_bound``: a lower bound on the
    optimum proven elsewhere (the optimum of a program with fewer rows: ``ilp.solve``'s lazy
    rounds); HiGHS stops as soon as its incumbent is within ``rel_gap`` of it, optimal."""
    t0 = time.perf_counter()
    if m.n == 0:  # nothing to choose: its rows hold or they do not (a memory row over the limit)
        if m.violation(np.zeros(0)) > 1e-9:
            return MilpResult("infeasible", None, math.inf, -math.inf, time.perf_counter() - t0)
        return MilpResult("optimal", np.zeros(0), m.offset, m.offset, 0.0)
    time_limit_s = max(0.0, float(time_limit_s))
    if start is not None and known_bound is not None and not len(m.broken_rows(start)) and (start <= m.upper).all():
        value = float(m.cost @ start) + m.offset
        if _within(value, known_bound, rel_gap):  # the start meets a proven bound: optimal as it is
            return MilpResult("optimal", start, value, min(value, known_bound), time.perf_counter() - t0)
    if backend == "highs" and start is not None and len(m.probe):
        upper = probed(m, start, PROBE_SHARE * time_limit_s)
        if upper is not None:
            m = m.restricted(upper)
        time_limit_s = max(0.0, time_limit_s - (time.perf_counter() - t0))
    if backend == "highs":
        res = _highs(m, time_limit_s, rel_gap, start, known_bound)
    elif backend == "cpsat":
        res = _cpsat(m, time_limit_s, rel_gap, start)
    elif backend in ("CBC", "SCIP"):
        res = _ortools(m, backend, time_limit_s, rel_gap)
    else:
        raise PlanError(f"unknown ILP solver {backend!r}: expected one of {', '.join(SOLVERS)} (passes/options.py)")
    res.seconds = time.perf_counter() - t0
    return res


# The share of a solve's time ``probed`` may take.
PROBE_SHARE = 0.05


def probed(m: Milp, start: np.ndarray, time_limit_s: float) -> np.ndarray | None:
    """``m``'s upper bounds with every probe column (``Milp.probe``) fixed at 0 that ``start`` leaves
    at 0 and whose LP relaxation with it at 1 costs more than ``start``: no plan with it at 1 is
    cheaper than ``start``, so the optimum is the same. None when none is fixed. The LP is solved
    warm from its last basis after each bound change (a few pivots), within ``time_limit_s``.
    Each column is probed once per program (``Milp.probe_values``): a later solve (a lazy round,
    with more rows) fixes it again when its value still exceeds that solve's start, and does not
    probe it again when it did not. On the SP test model at 80-84% of its free peak it fixed 3 of
    16 candidates, whose LP costs 404.9-453.8 us against a start's 364.8 (81%; docs/remat.md)."""
    deadline = time.perf_counter() + time_limit_s
    cost = float(m.cost @ start)  # the LP's objective has no offset
    upper = m.upper
    lp: LpRelaxation | None = None
    fixed = False
    for col in map(int, m.probe):
        if start[col] > 0.5:
            continue
        if col not in m.probe_values:
            left = deadline - time.perf_counter()
            if left <= 0:  # no time to probe it: the values known still fix
                continue
            if lp is None:
                lp = LpRelaxation(m)
                if lp.solve(left) is None:
                    return None
                left = deadline - time.perf_counter()
            value = lp.value_with(col, 1.0, left, upper[col])
            if value is None:
                continue
            m.probe_values[col] = value
        if m.probe_values[col] - cost > PROBE_MARGIN * max(1.0, abs(cost)):
            upper[col], fixed = 0.0, True
            if lp is not None:
                lp.h.changeColBounds(col, 0.0, 0.0)  # the later probes within what is left
    return upper if fixed else None


# ``probed`` fixes a column only when its LP costs more than the start by this share (HiGHS's dual
# feasibility tolerance is 1e-7: an LP value is exact to about that).
PROBE_MARGIN = 1e-6


_BANNER_LOCK = threading.Lock()
_banner_printed = False  # HiGHS prints its banner at the first construction in a process


def _quiet_highs():
    """A ``highspy.Highs`` that prints nothing. The first ``Highs()`` of a process writes HiGHS's
    banner to the C library's stdout before any option can be set, so that construction runs
    with file descriptor 1 pointed at /dev/null (for its few microseconds; Python's own stdout
    is flushed first); later ones print nothing, and the output flag silences the solves."""
    import highspy

    global _banner_printed
    with _BANNER_LOCK:
        if _banner_printed:
            h = highspy.Highs()
        else:
            with _stdout_fd_silenced():
                h = highspy.Highs()
            _banner_printed = True
    h.setOptionValue("output_flag", False)
    return h


@contextlib.contextmanager
def _stdout_fd_silenced():
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


# HiGHS's sub-MIP heuristics (RINS, RENS) took half the time of a sharding ILP under a memory
# limit and found nothing the root's cuts and its other heuristics did not; its restarts (after
# reduced-cost fixing at the root) re-ran the root's cuts on a smaller problem that ended at the
# same node. Measured on the solves of the sequence-parallel test model at 97% and 90% of its free
# peak and of LLaMA-3-8B at 40 GiB (docs/remat.md, "Solve time under a limit"), the same models
# given to HiGHS, two runs each: without RINS and RENS the same optima (within REL_GAP) in 0.58x
# (97%), 0.93x (90%), 0.71x and 1.0x (LLaMA's two limited solves) the CPU time; without restarts
# as well, 0.61x (97%), 0.80x and 0.90x (the two solves at 90%), 0.88x and 1.0x (LLaMA) the time
# without RINS and RENS alone. The unlimited solves took the same either way.
# HiGHS's symmetry detection runs when the search leaves the root: on LLaMA-3-8B in bf16 on
# h100-sxm, 64 x 4096 tokens on dp=8,tp=8 under 80 GiB (73k columns: the offload columns of 32
# tied layers give 226 generators), it took 7.6 s of an 17.8 s solve and the search ended after
# 3 nodes; that solve alone (dumped, two runs each, loaded) took 11.8-12.5 s of CPU with it and
# 9.4-9.5 without, the same objective. On the small sequence-parallel programs of docs/remat.md it
# made no difference (within 5% either way), so it is off.
# Improving points of a HiGHS solve kept for the caller (``MilpResult.found``).
FOUND_KEPT = 8
HIGHS_OPTIONS = {
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_allow_restart": False,
    "mip_detect_symmetry": False,
}


def _highs_lp(m: Milp, integral: bool = True):
    """``m`` as a ``highspy.HighsLp`` (``integral=False``: its LP relaxation)."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = m.n
    lp.num_row_ = m.num_rows
    lp.col_cost_ = m.cost
    lp.col_lower_ = np.zeros(m.n)
    lp.col_upper_ = m.upper
    start_, index, value, lower, upper = m.csr()
    inf = highspy.kHighsInf
    lp.row_lower_ = np.where(np.isinf(lower), -inf, lower)
    lp.row_upper_ = np.where(np.isinf(upper), inf, upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = start_
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    if integral:
        kinds = {True: highspy.HighsVarType.kInteger, False: highspy.HighsVarType.kContinuous}
        lp.integrality_ = [kinds[bool(b)] for b in m.integer]
    return lp


def _within(objective: float, bound: float, rel_gap: float) -> bool:
    """Whether ``objective`` is within ``rel_gap`` of the lower bound ``bound`` (HiGHS's gap)."""
    return math.isfinite(objective) and objective - bound <= rel_gap * max(abs(objective), 1e-12)


def _highs(
    m: Milp,
    time_limit_s: float,
    rel_gap: float,
    start: np.ndarray | None,
    known_bound: float | None = None,
    presolve: bool = True,
) -> MilpResult:
    import highspy

    t0 = time.perf_counter()
    h = _quiet_highs()
    # HiGHS notices its limit (and a cancel) only between simplex passes, up to ~0.4 s late on
    # a 140k-column LP: it is asked to stop early, and cancelled at the limit itself
    h.setOptionValue("time_limit", max(0.8 * time_limit_s - 0.2, 1e-3))
    h.setOptionValue("mip_rel_gap", rel_gap)
    for option, value in HIGHS_OPTIONS.items():
        h.setOptionValue(option, value)
    h.passModel(_highs_lp(m))
    if not presolve:
        h.setOptionValue("presolve", "off")
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, start))
        sol.value_valid = True
        h.setSolution(sol)
    h.HandleUserInterrupt = True
    watch = _Watch(m, rel_gap, known_bound, start is not None)
    h.cbMipInterrupt += watch.interrupt
    h.cbMipImprovingSolution += watch.improved
    stop_at = time.perf_counter() + time_limit_s + 0.05  # HiGHS checks its limit coarsely in a long LP
    cancelled = False
    h.startSolve()
    try:
        while not h.wait(0.05)[0]:
            if not cancelled and time.perf_counter() > stop_at:
                h.cancelSolve()
                cancelled = True
    except KeyboardInterrupt:
        h.cancelSolve()
        h.wait()
        raise
    # HiGHS 1.16's presolve often values a start below its columns' cost (the sequence-parallel
    # test model at 96% of its free peak: 251.14 against 251.99 us), and when no better plan
    # turns up it proves "optimal" against that value (an offloading plan at 85%: 310.14 against
    # 310.29, 4.8e-4 from its bound). Without presolve it values it right, but solves slower (that
    # 96% solve: 6.5 s of CPU against 1.5 s). So a misvalued start is dropped (unless it met the
    # known bound: that is checked on its cost here), and an "optimal" whose plan HiGHS values
    # other than its cost is solved again without presolve. In the offload columns' programs
    # (``keep_misvalued_start``) the start is kept instead, without presolve: at 85% and 86% it is
    # the optimum, and their first offload solve took 6.5-7.7 s of CPU against 12.9-14.9 (loaded);
    # at 83% it was slower, 6.9 against 4.2 (docs/remat.md).
    left = time_limit_s - (time.perf_counter() - t0)
    if watch.misvalued_start and not watch.reached and not cancelled:
        if m.keep_misvalued_start and presolve:
            return _highs(m, left, rel_gap, start, known_bound, presolve=False)
        return _highs(m, left, rel_gap, None, known_bound, presolve)
    res = _outcome(h, m, watch, cancelled)
    if presolve and res.status == "optimal" and not watch.reached and res.x is not None and not cancelled:
        # proven within the gap by the plan's own cost: nothing to redo. Else, when a start was
        # given (and is not to be kept), solve again without it: a misvalued start derails the
        # presolved search (the GPT-3 12-layer slice's local-search start, 2.6% above the optimum:
        # 1.5 s to a plan 2.6% off, then 3.6 s with presolve and no start, against 6.2 s without
        # presolve); otherwise without presolve, from the plan found
        if not _same_value(h.getInfo().objective_function_value, float(m.cost @ res.x)) and not _within(
            res.objective, res.bound, rel_gap
        ):
            if start is not None and not m.keep_misvalued_start:
                return _highs(m, left, rel_gap, None, known_bound, presolve)
            return _highs(m, left, rel_gap, res.x, known_bound, presolve=False)
    return res


class _Watch:
    """HiGHS's callbacks during one solve: keeps its improving points (``found``: the next round
    of a lazy loop may start from one, ilp.py); stops it when the incumbent's cost meets
    ``known_bound`` (``reached``), or when HiGHS values the start other than its cost
    (``misvalued_start``, ``_highs``)."""

    def __init__(self, m: Milp, rel_gap: float, known_bound: float | None, started: bool) -> None:
        self.m, self.rel_gap, self.started = m, rel_gap, started
        self.known_bound = known_bound if known_bound is not None and math.isfinite(known_bound) else None
        self.found: list[np.ndarray] = []
        self.best = math.inf  # the cost of the incumbent, by its columns
        self.reached = self.misvalued_start = False

    def interrupt(self, e) -> None:
        kb = self.known_bound
        self.reached = kb is not None and _within(self.best + self.m.offset, kb, self.rel_gap)
        if self.reached or self.misvalued_start:
            e.interrupt()

    def improved(self, e) -> None:
        x = np.array(e.data_out.mip_solution, dtype=np.float64)
        self.best = float(self.m.cost @ x)
        if self.started and not self.found and not _same_value(e.data_out.objective_function_value, self.best):
            self.misvalued_start = True
        self.found = [*self.found[-(FOUND_KEPT - 1) :], x]


def _same_value(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-7 * max(1.0, abs(b))


def _outcome(h, m: Milp, watch: _Watch, cancelled: bool) -> MilpResult:
    """The result of HiGHS's solve ``h`` of ``m``."""
    import highspy

    status = h.getModelStatus()
    info = h.getInfo()
    words = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kTimeLimit: "time limit",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
        highspy.HighsModelStatus.kInterrupt: "interrupted",
    }
    word = words.get(status, h.modelStatusToString(status))
    if cancelled and word == "interrupted":
        word = "time limit"
    x = None
    if info.primal_solution_status == 2:  # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    objective = float(m.cost @ x) + m.offset if x is not None else math.inf
    bound = float(info.mip_dual_bound) + m.offset
    kb = watch.known_bound
    if kb is not None:
        bound = max(bound, kb) if math.isfinite(bound) else kb
        if watch.reached and word == "interrupted" and _within(objective, bound, watch.rel_gap):
            word = "optimal"
    if not math.isfinite(bound):
        bound = objective if word == "optimal" else -math.inf
    return MilpResult(word, x, objective, min(bound, objective), 0.0, watch.found[::-1])


class LpRelaxation:
    """The LP relaxation of a ``Milp`` in HiGHS, re-solved warm as rows are added: dual simplex
    from the last basis, so each added row costs a few pivots, not a new solve. Used to find
    memory rows before the integer program is solved (passes/sharding/memrows.py)."""

    def __init__(self, m: Milp) -> None:
        self.h = _quiet_highs()
        self.h.passModel(_highs_lp(m, integral=False))
        self.n = m.n

    def add_row(self, idx, val, lower: float, upper: float) -> None:
        import highspy

        inf = highspy.kHighsInf
        lo, hi = (-inf if math.isinf(lower) else lower), (inf if math.isinf(upper) else upper)
        idx = np.asarray(idx, dtype=np.int32)
        self.h.addRow(lo, hi, len(idx), idx, np.asarray(val, dtype=np.float64))

    def value_with(self, col: int, value: float, time_limit_s: float, upper: float) -> float | None:
        """The LP's optimum with column ``col`` fixed at ``value`` (inf: infeasible; None: not solved
        within ``time_limit_s``); the column's bounds are ``[0, upper]`` again after."""
        import highspy

        self.h.changeColBounds(col, value, value)
        try:
            x = self.solve(time_limit_s)
            if x is None:
                return math.inf if self.h.getModelStatus() == highspy.HighsModelStatus.kInfeasible else None
            return float(self.h.getInfo().objective_function_value)
        finally:
            self.h.changeColBounds(col, 0.0, upper)

    def solve(self, time_limit_s: float) -> np.ndarray | None:
        """The optimal point, or None (infeasible, or not solved within ``time_limit_s``)."""
        import highspy

        self.h.setOptionValue("time_limit", max(float(time_limit_s), 1e-3))
        self.h.HandleUserInterrupt = True
        self.h.startSolve()
        try:  # waited for in steps, as ``_highs`` does, so Ctrl-C cancels it
            while not self.h.wait(0.05)[0]:
                pass
        except KeyboardInterrupt:
            self.h.cancelSolve()
            self.h.wait()
            raise
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return np.asarray(self.h.getSolution().col_value, dtype=np.float64)


# CP-SAT takes integer coefficients in its rows. A row with fractional ones (memory rows are in
# MiB: byte counts / 2**20) is multiplied by the smallest power of two up to 2**ROW_SCALE_BITS that
# makes them integral; one still fractional there is rounded outward (rows are then tighter by
# less than 2**-ROW_SCALE_BITS per unit: a plan CP-SAT finds always satisfies the row as given).
ROW_SCALE_BITS = 20


def _integral_row(val: np.ndarray, lower: float, upper: float) -> tuple[list[int], float, float]:
    """(integer coefficients, lower, upper) of ``lower <= val . x <= upper`` for CP-SAT."""
    scale = 1.0
    for _bits in range(ROW_SCALE_BITS):
        if np.all(val * scale == np.round(val * scale)):
            break
        scale *= 2.0
    scaled = val * scale
    coeffs = np.round(scaled)
    if not np.array_equal(coeffs, scaled):  # still fractional: round away from zero (tighter for x >= 0)
        coeffs = np.where(scaled > 0, np.ceil(scaled), np.floor(scaled))
    lo = -(2**62) if math.isinf(lower) else math.ceil(lower * scale - 1e-9)
    hi = 2**62 if math.isinf(upper) else math.floor(upper * scale + 1e-9)
    return [int(c) for c in coeffs], lo, hi


def _cpsat(m: Milp, time_limit_s: float, rel_gap: float, start: np.ndarray | None) -> MilpResult:
    """OR-Tools' CP-SAT: every column an integer in ``[0, ceil(upper)]`` (a 0-1 product variable is
    0 or 1 at every integer point of the one-hot rows, so the model stays exact; a continuous
    column with a larger range, ``min_memory``'s peak, becomes whole MiB), the costs a floating
    objective. The search runs in a thread of its own with as many workers as the machine has
    cores; this one waits in 0.05 s steps and calls ``StopSearch`` at the deadline or on Ctrl-C
    (CP-SAT's own SIGINT handler is turned off, so Python's ``KeyboardInterrupt`` is raised here
    after the thread is joined). ``start`` becomes CP-SAT's solution hint."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    proto = model.proto
    upper = np.ceil(m.upper - 1e-9).astype(np.int64)
    for j in range(m.n):
        proto.variables.add().domain.extend([0, int(upper[j])])
    start_, index, value, lower, upper_r = m.csr()
    for r in range(m.num_rows):
        idx = index[start_[r] : start_[r + 1]]
        val = value[start_[r] : start_[r + 1]]
        ct = proto.constraints.add()
        if lower[r] == 1.0 and upper_r[r] == 1.0 and np.all(val == 1.0) and np.all(upper[idx] == 1):
            ct.exactly_one.literals.extend(idx.tolist())  # a one-hot row: CP-SAT propagates these best
            continue
        coeffs, lo, hi = _integral_row(val, float(lower[r]), float(upper_r[r]))
        ct.linear.vars.extend(idx.tolist())
        ct.linear.coeffs.extend(coeffs)
        ct.linear.domain.extend([lo, hi])
    cost = m.cost
    nz = np.flatnonzero(cost)
    proto.floating_point_objective.vars.extend(nz.tolist())
    proto.floating_point_objective.coeffs.extend(cost[nz].tolist())
    if start is not None:
        proto.solution_hint.vars.extend(range(m.n))
        proto.solution_hint.values.extend(np.round(start).astype(np.int64).tolist())
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 1e-3)
    solver.parameters.relative_gap_limit = rel_gap
    solver.parameters.num_workers = max(1, os.cpu_count() or 1)
    solver.parameters.catch_sigint_signal = False
    outcome: list = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(solver.solve(model))
        finally:
            done.set()

    thread = threading.Thread(target=run, name="graphc-cpsat", daemon=True)
    stop_at = time.perf_counter() + time_limit_s
    stopped = False
    thread.start()
    try:  # (an Event's wait, not join(timeout): a Ctrl-C inside join can leave the thread listed)
        while not done.wait(0.05):
            if not stopped and time.perf_counter() > stop_at:
                solver.stop_search()
                stopped = True
    except KeyboardInterrupt:
        solver.stop_search()
        thread.join()
        raise
    thread.join()
    status = outcome[0] if outcome else cp_model.UNKNOWN
    word = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "time limit",
        cp_model.INFEASIBLE: "infeasible",
        cp_model.UNKNOWN: "time limit",
    }.get(status, solver.status_name(status).lower())
    bound = float(solver.best_objective_bound) + m.offset
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        x = np.asarray(solver.response_proto.solution, dtype=np.float64)
    elif status == cp_model.UNKNOWN and start is not None and m.violation(start) <= 1e-6:
        x = np.asarray(start, dtype=np.float64)  # stopped in presolve, before the hint became a solution
    else:
        return MilpResult(word, None, math.inf, -math.inf, 0.0)
    objective = float(cost @ x) + m.offset
    if not math.isfinite(bound):
        bound = -math.inf
    if word == "optimal":
        bound = min(bound, objective)
    return MilpResult(word, x, objective, min(bound, objective), 0.0)


def _ortools(m: Milp, name: str, time_limit_s: float, rel_gap: float) -> MilpResult:
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver(name)
    if solver is None:
        raise PlanError(f"OR-Tools solver {name} is not available")
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    cost, integer = m.cost, m.integer
    upper = m.upper
    xs = [solver.IntVar(0, 1, "") if integer[j] else solver.NumVar(0.0, float(upper[j]), "") for j in range(m.n)]
    obj = solver.Objective()
    for j in np.flatnonzero(cost):
        obj.SetCoefficient(xs[j], float(cost[j]))
    obj.SetMinimization()
    inf = solver.infinity()
    start, index, value, lower, upper = m.csr()
    for r in range(m.num_rows):
        ct = solver.Constraint(-inf if np.isinf(lower[r]) else lower[r], inf if np.isinf(upper[r]) else upper[r])
        for k in range(start[r], start[r + 1]):
            ct.SetCoefficient(xs[index[k]], float(value[k]))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, rel_gap)
    status = solver.Solve(params)
    pw = pywraplp.Solver
    if status not in (pw.OPTIMAL, pw.FEASIBLE):
        word = {pw.INFEASIBLE: "infeasible", pw.NOT_SOLVED: "time limit"}.get(status, f"status {status}")
        return MilpResult(word, None, math.inf, -math.inf, 0.0)
    x = np.array([v.solution_value() for v in xs])
    objective = float(cost @ x) + m.offset
    bound = obj.BestBound() + m.offset
    return MilpResult("optimal" if status == pw.OPTIMAL else "time limit", x, objective, min(bound, objective), 0.0)


__all__ = ["REL_GAP", "LpRelaxation", "Milp", "MilpResult", "solve_milp"]
