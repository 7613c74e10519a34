"""Checkmate's recomputation MILP next to graphc's, on one small training step (docs/remat.md).

    python docs/remat_checkmate.py

Checkmate (Jain et al., MLSys 2020, section 4) on one device: the nodes in program order are the
stages t = 1..n; binaries R[t, i] (node i is computed in stage t), S[t, i] (its result is kept
in memory from stage t-1 into stage t), FREE[t, i, k] (it is freed right after node k of stage
t). Every stage computes its own node (R[t, t] = 1); a node runs only when its operands are in
memory (R[t, j] <= R[t, i] + S[t, i] for every edge i -> j); a value is kept into a stage only if
it was in memory in the one before (S[t, i] <= R[t-1, i] + S[t-1, i]); the memory after each node
of each stage, U[t, k], is at most the budget. Minimize the compute time sum R[t, i] * C[i].

graphc (passes/recompute/choices.py) has one binary per forward node (keep, or recompute once
before its first backward reader), folded into the sharding ILP as a second strategy per node.
Both are given the same graph (the planning graph of a two-layer tanh(z) * z step, 1024 x 128,
float32), the same per-node compute times (graphc's cost model, one device) and the same bytes;
views (transposes) cost no memory in either. Each model measures its own peak.
"""

from __future__ import annotations

import time

import numpy as np

import graphc
from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, solve_problem, state_ties
from graphc.passes.sharding.memory import view_roots
from graphc.passes.sharding.milp import Milp, solve_milp


def layer(h, w):
    z = h @ w  # [B, H]
    return np.tanh(z) * z  # [B, H]


def loss(p, x):
    return np.sum(layer(layer(x, p["w1"]), p["w2"]) @ p["w3"])


def step(p, x):
    value, grads = graphc.value_and_grad(loss)(p, x)
    return {k: p[k] - 0.1 * grads[k] for k in p}, value


def example(batch=1024, width=128):
    rng = np.random.default_rng(0)
    p = {
        k: (rng.standard_normal(s) * 0.1).astype(np.float32)
        for k, s in [("w1", (width, width)), ("w2", (width, width)), ("w3", (width, 8))]
    }
    return p, rng.standard_normal((batch, width)).astype(np.float32)


def checkmate_graph(graph, problem):
    """(compute time per node, bytes per node, operand edges, resident bytes, outputs) of the
    graph's non-constant nodes; a view is merged into the value it looks into."""
    roots = view_roots(graph)
    item_of = {it.index: i for i, it in enumerate(problem.items) if it.kind == "node"}
    nodes = [k for k, n in enumerate(graph.nodes) if n.op.name != "constant"]
    at = {graph.nodes[k].outputs[0]: t for t, k in enumerate(nodes)}
    cost = np.array([problem.items[item_of[k]].strategies[0].compute_s for k in nodes])
    size = np.array([0 if graph.nodes[k].outputs[0] in roots else graph.nodes[k].outputs[0].type.nbytes for k in nodes])
    edges = set()
    for t, k in enumerate(nodes):
        for v in graph.nodes[k].inputs:
            v = roots.get(v, v)
            if v in at:
                edges.add((at[v], t))
    resident = sum(v.type.nbytes for v in graph.inputs)
    outputs = {at[roots.get(v, v)] for v in graph.outputs if roots.get(v, v) in at}
    return cost, size, sorted(edges), resident, outputs


def checkmate(cost, size, edges, resident, outputs, budget, time_limit=60.0):
    """The optimal schedule's compute time under ``budget`` bytes (None: infeasible), the MILP's
    size and solve time, and how many extra times each node runs."""
    n = len(cost)
    users = [[j for i2, j in edges if i2 == i] for i in range(n)]
    deps = [[i for i, j2 in edges if j2 == j] for j in range(n)]
    m = Milp()
    mib = float(2**20)
    R = {(t, i): m.add_vars([cost[i] * 1e6], integer=True)[0] for t in range(n) for i in range(t + 1)}
    S = {(t, i): m.add_vars([0.0], integer=True)[0] for t in range(n) for i in range(t)}
    for t in range(n):
        m.add_row([R[t, t]], [1.0], 1.0, 1.0)
        for i in range(t):
            prev = [R[t - 1, i]] + ([S[t - 1, i]] if i < t - 1 else [])
            m.add_row([S[t, i], *prev], [1.0] + [-1.0] * len(prev), -np.inf, 0.0)  # kept only if in memory
            if i in outputs:
                m.add_row([S[t, i]], [1.0], 1.0, 1.0)  # results are kept to the end
        for i, j in edges:
            if j <= t:
                have = [R[t, i]] + ([S[t, i]] if i < t else [])
                m.add_row([R[t, j], *have], [1.0] + [-1.0] * len(have), -np.inf, 0.0)
    for t in range(n):
        # U[t, k] = resident + kept into t + computed so far in t - freed so far in t <= budget
        base_idx = [S[t, i] for i in range(t)]
        base_val = [size[i] / mib for i in range(t)]
        run_idx, run_val = list(base_idx), list(base_val)
        for k in range(t + 1):
            run_idx.append(R[t, k])
            run_val.append(size[k] / mib)
            m.add_row(run_idx, run_val, -np.inf, (budget - resident) / mib)
            for i in [*deps[k], k]:
                if i in outputs or i > t:
                    continue
                later = [j for j in users[i] if k < j <= t]
                free = m.add_vars([0.0], integer=True)[0]
                keep_next = [S[t + 1, i]] if t + 1 < n else []
                hazards = [R[t, k], *keep_next, *(R[t, j] for j in later)]
                hv = [-1.0] + [1.0] * (len(keep_next) + len(later))
                most = 2 + len(later)
                # 1 - FREE <= num_hazards, num_hazards <= most * (1 - FREE); num_hazards = 1 - R[t,k] + ...
                m.add_row([free, *hazards], [-1.0, *(-np.array(hv))], -np.inf, 0.0)
                m.add_row([free, *hazards], [float(most), *hv], -np.inf, float(most) - 1.0)
                run_idx.append(free)
                run_val.append(-size[i] / mib)
    start = time.perf_counter()
    res = solve_milp(m, "highs", time_limit)
    seconds = time.perf_counter() - start
    if res.x is None:
        return None, m.n, m.num_rows, seconds, {}
    runs = {i: sum(round(res.x[R[t, i]]) for t in range(i, n)) for i in range(n)}
    return res.objective / 1e6, m.n, m.num_rows, seconds, {i: r - 1 for i, r in runs.items() if r > 1}


def main() -> None:
    p, x = example()
    graph = optimize_for_planning(graphc.trace(step, p, x))
    mesh = Mesh({"dp": 1}, profile=MachineProfile.default())
    ties = state_ties(graph)

    def limited(limit: int, shrink: bool = True):
        """The problem and options under a memory limit (where "auto" gives it recompute strategies)."""
        options = PlanOptions(memory_limit=limit, shrink=shrink)
        return build_problem(graph, mesh, options, ties=ties), options

    problem = build_problem(graph, mesh, PlanOptions(), ties=ties)
    base = solve_problem(problem, PlanOptions())
    ours_peak0 = problem.memory.peak(base.choice)[0]
    cost, size, edges, resident, outputs = checkmate_graph(graph, problem)
    ops = [n.op.name for n in graph.nodes if n.op.name != "constant"]
    cm_base, n_vars, n_rows, _s, _again = checkmate(cost, size, edges, resident, outputs, 1 << 40)
    print(
        f"{len(cost)} nodes; Checkmate MILP {n_vars} columns / {n_rows} rows; graphc: "
        f"{len(limited(ours_peak0)[0].remat)} candidates"
    )
    # Checkmate's own peak without recomputation: the smallest budget its schedule with no
    # recomputation meets (a bisection on the budget, R fixed to the diagonal by the objective)
    lo, hi = 0, ours_peak0 * 2
    while hi - lo > 1024:
        mid = (lo + hi) // 2
        t, *_rest = checkmate(cost, size, edges, resident, outputs, mid)
        lo, hi = (lo, mid) if t is not None and t <= cm_base * (1 + 1e-9) else (mid, hi)
    cm_peak0 = hi
    print(
        f"no recomputation: compute {cm_base * 1e3:.4f} ms; peak {ours_peak0} (graphc's model), ~{cm_peak0} (Checkmate's)"
    )
    act = 1024 * 128 * 4
    print(
        "| budget below each model's own peak | graphc, repeated layers tied (default) | graphc, every node its own "
        "variable (shrink=False) | Checkmate |"
    )
    print("|---|---|---|---|")
    for k in (0.5, 1.5, 2.5, 3.5):
        cut = int(k * act)
        row = [f"{k} x 512 KiB"]
        for shrink in (True, False):
            t0 = time.perf_counter()
            try:
                under, options = limited(ours_peak0 - cut, shrink)
                sol = solve_problem(under, options)
                again = [under.items[i].node.op.name for i in under.recomputed(sol.choice)]
                row.append(
                    f"+{(sol.objective - base.objective) * 1e6:.1f} us ({', '.join(again)}), "
                    f"{time.perf_counter() - t0:.2f} s"
                )
            except PlanError as exc:
                row.append(f"no plan (needs {exc.min_memory_bytes} B), {time.perf_counter() - t0:.2f} s")
        t, _n, _r, cm_s, again = checkmate(cost, size, edges, resident, outputs, cm_peak0 - cut, time_limit=30.0)
        runs = ", ".join(f"{ops[i]}" + (f" x{r}" if r > 1 else "") for i, r in sorted(again.items()))
        row.append(("no schedule" if t is None else f"+{(t - cm_base) * 1e6:.1f} us ({runs})") + f", {cm_s:.2f} s")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
