"""A solved problem -> its ``ShardingPlan`` (passes/sharding/plan.py): every item's choice and best
alternatives, the collectives, the predicted cost and memory, the solver's statistics.

The order matters in one place: the alternatives are priced with the gradient-bucket share the
solver used (passes/sharding/alternatives.py, on a ``CostModel.snapshot`` taken first: they are
priced when first read), then the problem is re-bucketed to the bytes the plan's all-reduces
fill, which prices the plan's collectives and predicted step (``CostModel.rebucket``).
"""

from __future__ import annotations

import threading
import weakref

from graphc.core.collector import collector_paused
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.traits import Contraction
from graphc.core.units import fmt_bytes
from graphc.ops.dims import default_cost
from graphc.passes.offload import OffloadRecord
from graphc.passes.options import PlanOptions
from graphc.passes.sharding.alternatives import Solved, find_alternatives, ruled_out_specs
from graphc.passes.sharding.collectives import collectives_of
from graphc.passes.sharding.ilp import Solution
from graphc.passes.sharding.items import Item
from graphc.passes.sharding.offload_terms import record, use
from graphc.passes.sharding.pending import LazyAlternatives, Pending
from graphc.passes.sharding.plan import ShardingPlan, graph_hash
from graphc.passes.sharding.problem import Problem
from graphc.passes.sharding.records import Alternative, Cost, Memory, Mfu, NodeChoice, SolverStats, TensorChoice
from graphc.passes.sharding.zero import zero_report


@collector_paused()
def plan_from_solution(
    problem: Problem,
    sol: Solution,
    options: PlanOptions,
    build_s: float,
    explain_now: bool = False,
    hashed: str | None = None,
) -> ShardingPlan:
    """The ShardingPlan of ``sol`` (a strategy per item of ``problem``, passes/sharding/problem.py),
    solved with ``options``. Leaves ``problem`` re-bucketed to the plan's gradient all-reduces
    (``CostModel.rebucket``).

    The alternatives of its inputs, nodes and outputs are priced when one of them is first read
    (the plan's JSON, ``explain``: ``LazyAlternatives``), or when the next plan is made, whichever
    comes first (``_unread``: one unread plan holds its problem at a time), or now
    (``explain_now``). The plan keeps ``problem`` until then: the problem must not change.
    ``hashed``: ``graph_hash(problem.graph)``, if the caller has it (printing the graph is linear)."""
    memory_limit = options.memory_limit
    graph = problem.graph
    names = graph.value_names()
    choice = sol.choice
    costs, memory = problem.costs, problem.memory
    use(problem, sol.offload)
    offload = record(problem, choice, sol.offload, memory_limit)  # optimizer state in host memory
    solved_bucket = costs.bucket_share_bytes  # the solver's estimate (0: no buckets)
    filled = costs.filled_bucket_bytes(choice)
    solved = Solved(sol.objective, sol.status, sol.gap, memory_limit, sol.shared)
    # a reused choice (passes/partition.py reuse_choices, once per token of a generation loop) is
    # not explained again: pricing every alternative costs more than the rest of the plan
    reused = sol.status == "reused"
    pending = None if reused else _pending(problem, list(choice), solved, filled or costs.bucket_share_bytes)
    if pending is not None and explain_now:
        pending.get(-1)  # priced before the problem is re-bucketed, as the solver priced it
    costs.rebucket(choice, filled)  # the plan reports the buckets it really fills
    zero = zero_report(problem, choice)
    recomputed = set(problem.recomputed(choice))
    inputs, outputs, nodes = [], [], []
    tied = {k for tie in problem.ties for k in tie}
    texts: dict = {}  # result types and locations (by object) -> their texts (``_texts``)
    for i, it in enumerate(problem.items):
        if it.kind == "fanout":  # a fan-out has no record of its own in the plan
            continue
        st = it.strategies[choice[i]]
        alts: tuple[Alternative, ...] | LazyAlternatives = () if pending is None else LazyAlternatives(pending, i)
        if it.kind == "input":
            assert it.value is not None  # an input item holds its value
            stage, saved = zero.get(it.index, (0, 0))
            inputs.append(
                TensorChoice(
                    index=it.index,
                    name=f"%{names[it.value]}",
                    type=str(it.value.type),
                    spec=st.out_specs[0],
                    pinned=bool(it.pinned),
                    alternatives=alts,
                    zero=stage,
                    zero_saved_bytes=saved,
                    ruled_out=ruled_out_specs(problem, i, st.out_specs[0], tied),
                )
            )
        elif it.kind == "output":
            assert it.value is not None  # an output item holds its value
            outputs.append(
                TensorChoice(
                    index=it.index,
                    name=f"%{names[it.value]}",
                    type=str(it.value.type),
                    spec=st.in_specs[0],
                    pinned=bool(it.pinned),
                    alternatives=alts,
                )
            )
        elif it.kind == "node":
            again = i in recomputed
            nodes.append(_node_choice(problem, i, choice[i], alts, again, names, texts))
    ev = costs.evaluate(choice)  # with the buckets the plan fills
    if offload is not None:  # the update of the offloaded parameters runs on the host instead
        ev["compute_s"] -= offload.device_update_s
    collectives = collectives_of(problem, choice, names)
    comm = sum(c.time_s for c in collectives)
    peak, at = memory.peak(choice)
    at_item = problem.items[memory.item_at(at)] if problem.order else None  # a recomputation slot: its item
    solver = SolverStats(
        name=options.solver,
        status=sol.status,
        objective_s=sol.objective,
        bound_s=sol.bound,
        gap=sol.gap,
        seconds=sol.seconds,
        build_s=build_s,
        sizes=dict(sol.stats),
        bucket_bytes=solved_bucket,
    )
    held = memory.held_peak(choice)
    if memory_limit is not None and held > memory_limit:  # ilp.solve's fallback (docs/remat.md)
        problem.warnings.append(
            f"the plan's values fit in {fmt_bytes(memory_limit)} per device, but with the redistribution buffers "
            f"the runtime also holds its peak is {fmt_bytes(held)} ({held / memory_limit:.0%} of the limit): the "
            "solver found no plan whose buffers fit as well (docs/remat.md): the run may need that much"
        )
    if pending is not None:
        _unread(pending)
    return ShardingPlan(
        graph_name=graph.name,
        graph_hash=graph_hash(graph, names) if hashed is None else hashed,
        n_nodes=len(graph.nodes),
        mesh=problem.mesh,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        nodes=tuple(nodes),
        collectives=tuple(collectives),
        cost=_cost(graph, problem.mesh, ev["compute_s"], comm, filled, ev["comm_s"], offload),
        memory=Memory(
            limit_bytes=memory_limit,
            peak_bytes=(peak,) * problem.mesh.size,
            peak_at=_item_name(at_item, names) if at_item else None,
            held_bytes=(held,) * problem.mesh.size,
            recompute_saved_bytes=int(memory.profile(choice, recompute=False).max()) - peak if recomputed else 0,
        ),
        solver=solver,
        options=options,
        ties=tuple((problem.items[a].index, problem.items[b].index) for a, b in problem.ties),
        warnings=tuple(_dedupe(problem.warnings)),
        offload=offload,
    )


def _pending(problem: Problem, choice: list[int], solved: Solved, plan_share_bytes: int) -> Pending:
    """The alternatives of ``choice``, priced when first read, with the cost model as the solver
    priced it (before the plan re-buckets the problem)."""
    costs = problem.costs.snapshot()
    return Pending(lambda: find_alternatives(problem, choice, solved, plan_share_bytes, costs=costs))


# The plans made whose alternatives are not priced yet, weakly (a plan dropped unread is never
# priced): at most one, so a search that makes many plans holds one extra problem, not one per plan.
_UNREAD: list[weakref.ref[Pending]] = []
_UNREAD_LOCK = threading.Lock()


def _unread(pending: Pending) -> None:
    """Price the alternatives of the plan made before (if unread and alive), and remember this
    one's (if unread) as the one unread plan."""
    with _UNREAD_LOCK:
        before = [p for p in (ref() for ref in _UNREAD) if p is not None]
        _UNREAD.clear()
        if not pending.priced:
            _UNREAD.append(weakref.ref(pending))
    for p in before:
        p.get(-1)


def _texts(n, memo: dict) -> tuple[tuple[str, ...], str | None]:
    """(the text of each result type, of the location) of node ``n``, remembered in ``memo`` by the
    objects (the graph's, alive while the plan is made; repeated layers share their types and
    source locations): one tuple for every node with these types."""
    outs = n.outputs
    key = id(outs[0].type) if len(outs) == 1 else tuple([id(o.type) for o in outs])
    types = memo.get(key)
    if types is None:
        types = memo[key] = tuple([str(o.type) for o in outs])
    if n.loc is None:
        return types, None
    loc = memo.get(id(n.loc))
    if loc is None:
        loc = memo[id(n.loc)] = str(n.loc)
    return types, loc


def _node_choice(
    problem: Problem, i: int, s: int, alts: tuple | LazyAlternatives, again: bool, names, texts: dict
) -> NodeChoice:
    """The NodeChoice of node item ``i`` at strategy ``s`` (``again``: recomputed); ``texts``: the
    texts of the types and locations met so far (``_texts``)."""
    it = problem.items[i]
    n = it.node
    assert n is not None  # a node item holds its node
    st = it.strategies[s]
    types, loc = _texts(n, texts)
    return NodeChoice(
        index=it.index,
        name=f"%{names[n.outputs[0]]}" if n.outputs else f"node{it.index}",
        op=n.op.name,
        loc=loc,
        part=n.part,
        types=types,
        strategy=st.name,
        in_specs=tuple(st.in_specs),
        out_specs=tuple(st.out_specs),
        compute_s=st.compute_s,
        pinned=bool(it.pinned),
        warning=it.warning,
        alternatives=alts,
        recompute=again,
        recompute_saved_bytes=sum(problem.memory.value_bytes(o, i, s) for o in n.outputs) if again else 0,
    )


def _cost(
    graph: Graph,
    mesh: Mesh,
    compute_s: float,
    comm_s: float,
    bucket_bytes: int,
    edge_comm_s: float,
    offload: OffloadRecord | None = None,
) -> Cost:
    """The Cost of a step, with its MFU (the definition is ``Cost``'s)."""
    offload_s = 0.0 if offload is None else offload.host_s
    total_s = compute_s + comm_s + offload_s
    m = step_mfu(graph, total_s, mesh)
    return Cost(
        compute_s=compute_s,
        comm_s=comm_s,
        total_s=total_s,
        model_flops=None if m is None else m.model_flops,
        peak_dtype=None if m is None else m.peak_dtype,
        peak_flops=None if m is None else m.peak_flops,
        mfu=None if m is None else m.value,
        bucket_bytes=bucket_bytes,
        edge_comm_s=edge_comm_s,
        offload_s=offload_s,
    )


def step_mfu(graph: Graph, step_s: float, mesh: Mesh) -> Mfu | None:
    """The MFU of one step of ``graph`` predicted to take ``step_s`` on ``mesh`` (``Mfu``); None
    for a step with no flops or no time."""
    flops, contraction = step_flops(graph)
    by_dtype = contraction or flops
    if not by_dtype or step_s <= 0:
        return None
    dtype = max(by_dtype, key=lambda k: by_dtype[k])
    model_flops = sum(flops.values())
    peak = mesh.profile.matmul_rate(dtype)
    value = model_flops / (step_s * mesh.size * peak)
    return Mfu(
        value=value, model_flops=model_flops, step_s=step_s, devices=mesh.size, peak_dtype=dtype, peak_flops=peak
    )


def step_flops(graph: Graph) -> tuple[dict[str, float], dict[str, float]]:
    """(flops of all nodes, flops of the contractions) of one step of ``graph``, by the dtype of
    each node's first operand (result when it has none), every node counted once."""
    flops: dict[str, float] = {}
    contraction: dict[str, float] = {}
    dtype_names: dict = {}  # dtype -> its name (numpy makes the string on every ask)
    # (op, types) -> (flops, dtype name or None, a contraction?), for the nodes without attributes (most)
    known: dict[tuple, tuple[float, str | None, bool]] = {}
    for node in graph.nodes:
        in_types = tuple([v.type for v in node.inputs])
        out_types = tuple([o.type for o in node.outputs])
        key = None if node.attrs or node.regions else (node.op, in_types, out_types)
        share = known.get(key) if key is not None else None
        if share is None:
            attrs = {**node.attrs, "regions": node.regions} if node.regions else dict(node.attrs)
            f = (node.op.cost or default_cost)(in_types, out_types, **attrs)[0]
            dtype = None
            if in_types or out_types:
                dt = (in_types or out_types)[0].dtype
                dtype = dtype_names.get(dt) or dtype_names.setdefault(dt, dt.name)
            share = (f, dtype, node.op.has(Contraction))
            if key is not None:
                known[key] = share
        f, dtype, contracts = share
        if dtype is None or not f:
            continue
        flops[dtype] = flops.get(dtype, 0.0) + f
        if contracts:
            contraction[dtype] = contraction.get(dtype, 0.0) + f
    return flops, contraction


def _dedupe(warnings: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for w in warnings:
        counts[w] = counts.get(w, 0) + 1
    return [w if n == 1 else f"{w} (x{n})" for w, n in counts.items()]


def _item_name(item: Item, names) -> str:
    if item.kind == "node":
        node = item.node
        assert node is not None  # a node item holds its node
        return f"%{names[node.outputs[0]]} ({node.op.name} at {node.loc or '?'})" if node.outputs else node.op.name
    if item.kind == "fanout":  # where a value read by several consumers (or a gradient) is redistributed
        return f"the fan-out of %{names[item.value]} (right after its producer)"
    return f"{item.kind} %{names[item.value]}"


__all__ = ["plan_from_solution", "step_flops"]
