"""Auto-sharding: choose a sharding strategy for every node of a graph on a device mesh.

    strategies.py    per-node strategies from the ops' dimension rules
    redistribute.py  spec -> spec collectives and their alpha-beta cost
    problem.py       items, edges, costs and liveness memory of one graph on one mesh
    ilp.py           shrinking (tied repeated layers, followers) and the OR-Tools ILP

``plan_graph(graph, mesh, ...) -> graphc.plan.Plan`` runs all of it.
"""

from __future__ import annotations

import time

from graphc.core.ir import Graph
from graphc.core.spec import format_spec
from graphc.passes.sharding.ilp import solve
from graphc.passes.sharding.problem import Problem, build_problem
from graphc.passes.sharding.redistribute import plan_steps


def plan_graph(graph: Graph, mesh, memory_limit: int | None = None, in_pins: dict | None = None,
               out_pins: dict | None = None, ties: list | None = None, node_pins: dict | None = None,
               shrink: bool = True, time_limit_s: float = 60.0, solver: str = "CBC", progress=None,
               linear_partials: bool = False):
    """Solve the sharding problem of ``graph`` on ``mesh`` and return a ``graphc.plan.Plan``.

    ``in_pins`` / ``out_pins``: {position: spec} for graph inputs / outputs; ``node_pins``:
    {node index: strategy name or output spec} (a hand-edited plan); ``ties``: (input position,
    output position) pairs that must share a spec."""
    from graphc.core.mesh import as_mesh
    from graphc.plan import Plan, graph_hash

    mesh = as_mesh(mesh)
    start = time.perf_counter()
    problem = build_problem(graph, mesh, in_pins, out_pins, ties, linear_partials)
    _tie(problem, ties or [])
    if node_pins:
        _pin_nodes(problem, node_pins)
    build_s = time.perf_counter() - start
    sol = solve(problem, memory_limit, shrink=shrink, time_limit_s=time_limit_s, solver_name=solver, progress=progress)
    return Plan.from_solution(problem, sol, memory_limit, graph_hash(graph), build_s,
                              options={"shrink": shrink, "solver": solver, "time_limit_s": time_limit_s})


def _tie(problem: Problem, ties) -> None:
    """Tied input/output pairs: restrict both to the specs they share, and make the output item
    use exactly the input's candidates (a common strategy index = a common spec)."""
    if not ties:
        return
    inputs = {it.index: k for k, it in enumerate(problem.items) if it.kind == "input"}
    outputs = {it.index: k for k, it in enumerate(problem.items) if it.kind == "output"}
    for i, o in ties:
        a, b = problem.items[inputs[i]], problem.items[outputs[o]]
        specs_b = {s.in_specs[0]: s for s in b.strategies}
        keep_a = [s for s in a.strategies if s.out_specs[0] in specs_b]
        a.strategies = keep_a
        b.strategies = [specs_b[s.out_specs[0]] for s in keep_a]
        problem.ties.append((inputs[i], outputs[o]))


def _pin_nodes(problem: Problem, pins: dict) -> None:
    from graphc.core.errors import PlanError
    from graphc.core.spec import parse_spec

    by_index = {it.index: it for it in problem.items if it.kind == "node"}
    for idx, want in pins.items():
        it = by_index.get(idx)
        if it is None:
            raise PlanError(f"plan pins node {idx}, which the graph does not have")
        keep = [s for s in it.strategies if s.name == want]
        if not keep:
            try:
                spec = parse_spec(want)
                keep = [s for s in it.strategies if s.out_specs and s.out_specs[0] == spec]
            except Exception:
                keep = []
        if not keep:
            raise PlanError(f"plan pins node {idx} ({it.node.op.name} at {it.node.loc or '?'}) to {want!r}, which is not "
                            f"one of its strategies: {', '.join(s.name for s in it.strategies)}")
        it.strategies = keep[:1]
        it.pinned = want


def collectives_of(problem: Problem, choice: list[int]) -> list[dict]:
    """The redistributions the plan needs, in program order. A tensor that several consumers need
    in the same spec is redistributed once (the ILP's objective counts every edge, so it is an
    upper bound of the plan's communication time)."""
    names = problem.graph.value_names()
    out = []
    done: set = set()
    for e in problem.edges:
        src = problem.items[e.src].strategies[choice[e.src]].out_specs[e.src_out]
        dst = problem.items[e.dst].strategies[choice[e.dst]].in_specs[e.dst_in]
        if src == dst or (id(e.value), dst) in done:
            continue
        done.add((id(e.value), dst))
        t = e.value.type
        consumer = problem.items[e.dst]
        node_name = (f"%{names[consumer.node.outputs[0]]}" if consumer.kind == "node" and consumer.node.outputs
                     else f"output {consumer.index}")
        part = consumer.node.part if consumer.kind == "node" else None
        if part is None and problem.items[e.src].kind == "node":
            part = problem.items[e.src].node.part
        for st in plan_steps(t.shape, t.dtype.itemsize, src, dst, problem.mesh):
            out.append({
                "kind": st.kind, "axes": [problem.mesh.axis_names[st.axis]], "bytes": t.nbytes,
                "node_index": consumer.index if consumer.kind == "node" else None,
                "local_bytes": st.local_bytes, "tensor": _value_name(e.value, names), "node": node_name,
                "op": consumer.node.op.name if consumer.kind == "node" else "output",
                "loc": str(consumer.node.loc) if consumer.kind == "node" and consumer.node.loc else None,
                "part": part, "from": format_spec(st.src), "to": format_spec(st.dst), "time_s": st.time_s,
            })
    return out


def _value_name(v, names) -> str:
    return f"%{names[v]}"


__all__ = ["collectives_of", "plan_graph"]
